// faulty: a decorator that injects faults into another connector: a
// ConnectorWrapper (LevelDB's EnvWrapper), so everything it does not
// override, its capabilities included, is the inner connector's; each fault
// fires on an operation with its own probability.
//
// Options (docs/store.md):
//   inner            type of the wrapped connector (required)
//   inner.<k>        option <k> of the wrapped connector
//   fault.seed       seeds every draw (default 0)
//   fault.fail       any operation returns Unavailable, touching nothing
//   fault.drop       put/set: the bytes are silently lost (the key comes
//                    back, the object is absent); get: returns none
//   fault.corrupt    get: one bit of the returned bytes is flipped
//   fault.truncate   get: a strict prefix of the bytes is returned
//   fault.corrupt_put  put/set: one bit of the stored bytes is flipped
//                    (corruption at rest: every later get sees it)
//   fault.delay      any operation first sleeps fault.delay_ms
//   fault.delay_ms   how long (default 10)
// Probabilities are in [0, 1], default 0.
//
// Draw n of an operation kind (put, get, ...) is a pure function of the
// seed, the kind and n, so a run whose calls of each kind come in the same
// order (one fetching thread, say) sees the same faults every time, in
// every process rebuilt from config(). Bytes handed out after a corrupt or
// truncate fault are a private copy; the inner object is untouched.
#include <atomic>
#include <charconv>
#include <cstring>
#include <thread>

#include "core/fault_draw.h"
#include "store/builtin.h"
#include "store/faulty/faulty.h"
#include "xsilo/store/connector_wrapper.h"

namespace xsilo {

namespace {

using fault::Draw;

enum Op : int { kPut, kGet, kExists, kEvict, kNewKey, kSet, kOpCount };
constexpr const char* kOpNames[kOpCount] = {"put", "get", "exists", "evict", "new_key", "set"};

struct FaultRates {
  double fail = 0, drop = 0, corrupt = 0, truncate = 0, corrupt_put = 0, delay = 0;
  int64_t delay_ms = 10;
  uint64_t seed = 0;
};

class FaultyConnector final : public ConnectorWrapper {
 public:
  FaultyConnector(std::unique_ptr<Connector> inner, ConnectorOptions options, FaultRates rates)
      : ConnectorWrapper(std::move(inner)),
        inner_(target()),
        options_(std::move(options)),
        rates_(rates) {}

  std::string_view type() const override { return "faulty"; }
  ConnectorConfig config() const override {
    // The inner connector's own config (it may have filled in defaults).
    ConnectorConfig c{"faulty", {}};
    for (const auto& [k, v] : options_) {
      if (k.rfind("fault.", 0) == 0) c.options[k] = v;
    }
    ConnectorConfig inner = inner_->config();
    c.options["inner"] = inner.type;
    for (const auto& [k, v] : inner.options) c.options["inner." + k] = v;
    return c;
  }

  Result<Key> Put(const GatherList& bytes) override {
    Draw d = Begin(kPut);
    if (d.Happens(rates_.fail)) return Injected(kPut);
    if (d.Happens(rates_.drop)) {
      ++injected_drops;
      XSILO_ASSIGN_OR_RETURN(Key key, inner_->NewKey());
      key.size = bytes.size;
      return key;
    }
    if (d.Happens(rates_.corrupt_put) && bytes.size > 0) {
      XSILO_ASSIGN_OR_RETURN(Buffer flipped, FlipOneBit(bytes, d));
      return inner_->Put(flipped);
    }
    return inner_->Put(bytes);
  }

  Result<std::optional<Buffer>> Get(const Key& key) override {
    Draw d = Begin(kGet);
    if (d.Happens(rates_.fail)) return Injected(kGet);
    if (d.Happens(rates_.drop)) {
      ++injected_drops;
      return std::optional<Buffer>();
    }
    const bool corrupt = d.Happens(rates_.corrupt);
    const bool truncate = d.Happens(rates_.truncate);
    XSILO_ASSIGN_OR_RETURN(std::optional<Buffer> got, inner_->Get(key));
    if (!got || got->empty()) return got;
    if (corrupt) {
      GatherList g;
      g.Append(*got);
      XSILO_ASSIGN_OR_RETURN(got, FlipOneBit(g, d));
    }
    if (truncate) {
      ++injected_truncations;
      got = got->SliceUnchecked(0, d.Below(got->size()));
    }
    return got;
  }

  Result<bool> Exists(const Key& key) override {
    Draw d = Begin(kExists);
    if (d.Happens(rates_.fail)) return Injected(kExists);
    return inner_->Exists(key);
  }

  Status Evict(const Key& key) override {
    Draw d = Begin(kEvict);
    if (d.Happens(rates_.fail)) return Injected(kEvict);
    return inner_->Evict(key);
  }

  Result<Key> NewKey() override {
    Draw d = Begin(kNewKey);
    if (d.Happens(rates_.fail)) return Injected(kNewKey);
    return inner_->NewKey();
  }

  Status Set(const Key& key, const GatherList& bytes) override {
    Draw d = Begin(kSet);
    if (d.Happens(rates_.fail)) return Injected(kSet);
    if (d.Happens(rates_.drop)) {
      ++injected_drops;
      return Status::OK();
    }
    if (d.Happens(rates_.corrupt_put) && bytes.size > 0) {
      XSILO_ASSIGN_OR_RETURN(Buffer flipped, FlipOneBit(bytes, d));
      GatherList g;
      g.Append(std::move(flipped));
      return inner_->Set(key, g);
    }
    return inner_->Set(key, bytes);
  }

  // Batches go through the faulty single-object calls above, one fault draw
  // per object (ConnectorWrapper would hand them to the inner connector).
  Result<std::vector<Key>> PutBatch(const std::vector<Buffer>& objects) override {
    return Connector::PutBatch(objects);
  }
  Result<std::vector<std::optional<Buffer>>> GetBatch(const std::vector<Key>& keys) override {
    return Connector::GetBatch(keys);
  }
  Status EvictBatch(const std::vector<Key>& keys) override { return Connector::EvictBatch(keys); }
  // presigned(), presigned_multipart() and Close() are the wrapper's: URLs
  // go straight to the inner connector's service, and no fault applies.

 private:
  Draw Begin(Op op) {
    Draw d(rates_.seed, op, counters_[op].fetch_add(1, std::memory_order_relaxed));
    if (d.Happens(rates_.delay)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(rates_.delay_ms));
    }
    return d;
  }

  Status Injected(Op op) {
    ++injected_failures;
    return Unavailable(std::string("faulty connector: injected failure of ") + kOpNames[op]);
  }

  Result<Buffer> FlipOneBit(const GatherList& bytes, Draw& d) {
    ++injected_corruptions;
    return fault::FlipOneBit(bytes, d);
  }

  Connector* const inner_;  // the wrapper's target
  const ConnectorOptions options_;
  const FaultRates rates_;
  std::atomic<uint64_t> counters_[kOpCount] = {};

 public:
  InjectedFaults injected() const {
    return {injected_failures.load(), injected_drops.load(), injected_corruptions.load(),
            injected_truncations.load()};
  }

 private:
  std::atomic<uint64_t> injected_failures{0}, injected_drops{0}, injected_corruptions{0},
      injected_truncations{0};
};

}  // namespace

std::optional<InjectedFaults> InjectedFaultsOf(const Connector& connector) {
  const auto* faulty = dynamic_cast<const FaultyConnector*>(&connector);
  if (faulty == nullptr) return std::nullopt;
  return faulty->injected();
}

Result<std::unique_ptr<Connector>> MakeFaultyConnector(const ConnectorOptions& options) {
  ConnectorConfig inner{"", {}};
  ConnectorOptions own;
  for (const auto& [k, v] : options) {
    if (k == "inner") {
      inner.type = v;
    } else if (k.rfind("inner.", 0) == 0) {
      inner.options[k.substr(6)] = v;
    } else {
      own[k] = v;
    }
  }
  const OptionTable& t = FaultyConnectorOptionTable();
  XSILO_RETURN_IF_ERROR(t.CheckKeys(options));
  if (inner.type.empty()) {
    return InvalidArgument("faulty connector needs option 'inner' (the wrapped connector type)");
  }
  if (inner.type == "faulty") return InvalidArgument("faulty connector cannot wrap itself");
  FaultRates r;
  XSILO_ASSIGN_OR_RETURN(r.fail, t.Real(own, "fault.fail"));
  XSILO_ASSIGN_OR_RETURN(r.drop, t.Real(own, "fault.drop"));
  XSILO_ASSIGN_OR_RETURN(r.corrupt, t.Real(own, "fault.corrupt"));
  XSILO_ASSIGN_OR_RETURN(r.truncate, t.Real(own, "fault.truncate"));
  XSILO_ASSIGN_OR_RETURN(r.corrupt_put, t.Real(own, "fault.corrupt_put"));
  XSILO_ASSIGN_OR_RETURN(r.delay, t.Real(own, "fault.delay"));
  XSILO_ASSIGN_OR_RETURN(int64_t delay_ms, t.Int(own, "fault.delay_ms"));
  r.delay_ms = delay_ms;
  XSILO_ASSIGN_OR_RETURN(r.seed, t.U64(own, "fault.seed"));
  XSILO_ASSIGN_OR_RETURN(std::unique_ptr<Connector> wrapped, MakeConnector(inner));
  return std::unique_ptr<Connector>(
      std::make_unique<FaultyConnector>(std::move(wrapped), std::move(own), r));
}

}  // namespace xsilo
