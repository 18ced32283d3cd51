// faulty: a decorator that injects faults into another connector, in the
// style of LevelDB's EnvWrapper. Everything is forwarded to the inner
// connector; each fault fires on an operation with its own probability.
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

#include "store/builtin.h"
#include "store/faulty/faulty.h"

namespace xsilo {

namespace {

enum Op : int { kPut, kGet, kExists, kEvict, kNewKey, kSet, kOpCount };
constexpr const char* kOpNames[kOpCount] = {"put", "get", "exists", "evict", "new_key", "set"};

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct FaultRates {
  double fail = 0, drop = 0, corrupt = 0, truncate = 0, corrupt_put = 0, delay = 0;
  int64_t delay_ms = 10;
  uint64_t seed = 0;
};

// One operation's draws: independent uniform numbers derived from
// (seed, op, sequence number, index).
class Draw {
 public:
  Draw(uint64_t seed, Op op, uint64_t n)
      : state_(SplitMix64(seed ^ SplitMix64((static_cast<uint64_t>(op) << 56) ^ n))) {}
  uint64_t Next() { return state_ = SplitMix64(state_); }
  bool Happens(double p) {
    if (p <= 0) return false;
    return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p;
  }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }

 private:
  uint64_t state_;
};

class FaultyConnector final : public Connector, public PresignedAccess {
 public:
  FaultyConnector(std::unique_ptr<Connector> inner, ConnectorOptions options, FaultRates rates)
      : inner_(std::move(inner)), options_(std::move(options)), rates_(rates) {}

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

  // URLs go straight to the inner connector's service: no fault applies.
  PresignedAccess* presigned() override { return inner_->presigned() ? this : nullptr; }
  Result<std::string> PresignGet(const Key& key, std::chrono::seconds expiry) override {
    return inner_->presigned()->PresignGet(key, expiry);
  }
  Result<std::string> PresignPut(const Key& key, std::chrono::seconds expiry) override {
    return inner_->presigned()->PresignPut(key, expiry);
  }
  Result<MultipartGrant> PresignMultipartPut(const Key& key, int parts,
                                             std::chrono::seconds expiry) override {
    return inner_->presigned()->PresignMultipartPut(key, parts, expiry);
  }
  Status AbortMultipartPut(const Key& key, const std::string& upload_id) override {
    return inner_->presigned()->AbortMultipartPut(key, upload_id);
  }

  void Close() override { inner_->Close(); }

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
    XSILO_ASSIGN_OR_RETURN(Buffer copy, Buffer::Allocate(bytes.size));
    uint64_t off = 0;
    for (const Buffer& s : bytes.segments) {
      if (!s.empty()) std::memcpy(copy.mutable_data() + off, s.data(), s.size());
      off += s.size();
    }
    const uint64_t bit = d.Below(bytes.size * 8);
    copy.mutable_data()[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    return copy;
  }

  const std::unique_ptr<Connector> inner_;
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

Result<double> Probability(const ConnectorOptions& options, const char* key) {
  auto it = options.find(key);
  if (it == options.end()) return 0.0;
  double v = -1;
  const std::string& text = it->second;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || !(v >= 0 && v <= 1)) {
    return InvalidArgument(std::string("faulty option ") + key + "='" + text +
                           "' must be a probability in [0, 1]");
  }
  return v;
}

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
  XSILO_RETURN_IF_ERROR(CheckConnectorOptions(
      "faulty", own,
      {"fault.seed", "fault.fail", "fault.drop", "fault.corrupt", "fault.truncate",
       "fault.corrupt_put", "fault.delay", "fault.delay_ms"}));
  if (inner.type.empty()) {
    return InvalidArgument("faulty connector needs option 'inner' (the wrapped connector type)");
  }
  if (inner.type == "faulty") return InvalidArgument("faulty connector cannot wrap itself");
  FaultRates r;
  XSILO_ASSIGN_OR_RETURN(r.fail, Probability(own, "fault.fail"));
  XSILO_ASSIGN_OR_RETURN(r.drop, Probability(own, "fault.drop"));
  XSILO_ASSIGN_OR_RETURN(r.corrupt, Probability(own, "fault.corrupt"));
  XSILO_ASSIGN_OR_RETURN(r.truncate, Probability(own, "fault.truncate"));
  XSILO_ASSIGN_OR_RETURN(r.corrupt_put, Probability(own, "fault.corrupt_put"));
  XSILO_ASSIGN_OR_RETURN(r.delay, Probability(own, "fault.delay"));
  XSILO_ASSIGN_OR_RETURN(r.delay_ms,
                         ConnectorIntOption("faulty", own, "fault.delay_ms", 10, 0, 600000));
  auto seed = own.find("fault.seed");
  if (seed != own.end()) {
    const std::string& t = seed->second;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), r.seed);
    if (ec != std::errc() || p != t.data() + t.size()) {
      return InvalidArgument("faulty option fault.seed='" + t + "' must be an unsigned integer");
    }
  }
  XSILO_ASSIGN_OR_RETURN(std::unique_ptr<Connector> wrapped, MakeConnector(inner));
  return std::unique_ptr<Connector>(
      std::make_unique<FaultyConnector>(std::move(wrapped), std::move(own), r));
}

}  // namespace xsilo
