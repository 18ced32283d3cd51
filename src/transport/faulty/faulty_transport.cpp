// faulty: a transport decorator that injects faults into another transport,
// in the style of LevelDB's EnvWrapper. Named "faulty(<inner>)", e.g.
// "faulty(grpc)", and composable: "faulty(grpc)+s3" damages the hybrid
// backend's control messages, "faulty(grpc+s3)" whole messages.
//
// Options (docs/reliability.md, "The fault injectors"); every other key goes
// to the inner transport:
//   fault.seed             seeds every draw (default 0)
//   fault.fail             a send fails with Unavailable, nothing is sent
//   fault.drop             a send is reported OK and never sent (lost)
//   fault.duplicate        a message is sent twice
//   fault.corrupt          one bit of the message's frame is flipped
//   fault.truncate         the message's frame is cut short
//   fault.delay            the send first sleeps fault.delay_ms on the
//                          caller's thread (a slow link pushing back)
//   fault.delay_ms         how long (default 10)
//   fault.cut_after_bytes  every N frame bytes sent, the connection is cut:
//                          the message that would go past byte N arrives
//                          truncated there and its send fails with
//                          Unavailable; the next message starts a fresh
//                          connection (and a fresh count)
// Probabilities are in [0, 1], default 0; each fault is drawn per message
// and peer. Draw n is a pure function of the seed and n (the decorator's
// n-th send), so a run that sends in the same order sees the same faults.
//
// How damage reaches the receiver: a damaged message is encoded to its wire
// frame (core/codec), damaged, and sent as one opaque tensor in a wrapper
// message through the inner transport. The receiving decorator decodes the
// frame, checksums verified, as a transport's receiver would: a frame that
// fails is refused (reported on stderr, counted in `refused`) and never
// delivered. Undamaged messages pass through untouched (no copy).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>

#include "core/fault_draw.h"
#include "transport/faulty/faulty.h"
#include "xsilo/core/codec.h"

namespace xsilo {

namespace {

using fault::Draw;

// The wrapper type of a damaged frame; not a valid application type.
constexpr const char* kFrameType = "xsilo.faulty/frame";
constexpr const char* kFrameTensor = "frame";

struct Rates {
  double fail = 0, drop = 0, duplicate = 0, corrupt = 0, truncate = 0, delay = 0;
  int64_t delay_ms = 10;
  uint64_t cut_after_bytes = 0;  // 0: never
  uint64_t seed = 0;
};

// What happens to one message on its way to one peer.
struct Plan {
  bool fail = false, drop = false, duplicate = false, corrupt = false, truncate = false;
  bool delay = false;
  uint64_t corrupt_bit = 0;  // drawn over the frame's bits later
  uint64_t truncate_at = 0;  // fraction of the frame, in 1/2^32
  bool clean() const { return !fail && !drop && !duplicate && !corrupt && !truncate && !delay; }
};

// Fires `done` once after `n` completions, with the first error.
class Joined {
 public:
  static SendCallback Make(int n, SendCallback done) {
    auto j = std::make_shared<Joined>(n, std::move(done));
    return [j](const Status& s) { j->One(s); };
  }
  Joined(int n, SendCallback done) : left_(n), done_(std::move(done)) {}
  void One(const Status& s) {
    SendCallback fire;
    Status first;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok() && first_.ok()) first_ = s;
      if (--left_ > 0) return;
      fire = std::move(done_);
      first = first_;
    }
    if (fire) fire(first);
  }

 private:
  std::mutex mu_;
  int left_;
  Status first_;
  SendCallback done_;
};

class FaultyTransport final : public Transport {
 public:
  FaultyTransport(TransportOptions options, std::unique_ptr<Transport> inner, Rates rates)
      : Transport(std::move(options)),
        inner_(std::move(inner)),
        rates_(rates),
        name_("faulty(" + std::string(inner_->name()) + ")") {}
  ~FaultyTransport() override { Stop(); }

  std::string_view name() const override { return name_; }
  // What the inner transport knows of its links (a decorator over us
  // decides by it: compression).
  double MeasuredGoodputBps(int32_t peer) override { return inner_->MeasuredGoodputBps(peer); }
  double MeasuredRttS(int32_t peer) override { return inner_->MeasuredRttS(peer); }
  void LearnLink(const std::vector<int32_t>& peers, uint64_t bytes) override {
    inner_->LearnLink(peers, bytes);
  }

  // Received messages go from the inner transport's queue to ours through
  // a pump thread, so both pushes keep their backpressure and abandon
  // rules: a full queue here blocks the pump, the inner queue fills and its
  // sender is pushed back (and released when it stops), as without us.
  Status Start() override {
    if (!pump_.joinable()) pump_ = std::thread([this] { Pump(); });
    return inner_->Start();
  }

  void Stop() override {
    stopping_ = true;
    inner_->Stop();  // closes the inner queue: the pump drains it and ends
    CloseInbox();
    if (pump_.joinable() && pump_.get_id() != std::this_thread::get_id()) pump_.join();
  }

  void SendAsync(int32_t peer, Message message, SendCallback done) override {
    message.sender = rank();
    Plan plan = Draw1();
    Execute(peer, std::move(message), plan, std::move(done));
  }

  void BroadcastAsync(std::vector<int32_t> peers, Message message, SendCallback done) override {
    message.sender = rank();
    std::vector<int32_t> clean;
    std::vector<std::pair<int32_t, Plan>> faulted;
    for (int32_t p : peers) {
      Plan plan = Draw1();
      if (plan.clean() && rates_.cut_after_bytes == 0) {
        clean.push_back(p);
      } else {
        faulted.emplace_back(p, plan);
      }
    }
    const int parts = (clean.empty() ? 0 : 1) + static_cast<int>(faulted.size());
    if (parts == 0) {
      inner_->BroadcastAsync({}, std::move(message), std::move(done));
      return;
    }
    SendCallback joined = Joined::Make(parts, std::move(done));
    for (auto& [p, plan] : faulted) Execute(p, message, plan, joined);
    if (!clean.empty()) inner_->BroadcastAsync(std::move(clean), std::move(message), joined);
  }

  InjectedTransportFaults injected() const {
    return {failures_.load(),    drops_.load(), duplicates_.load(), corruptions_.load(),
            truncations_.load(), cuts_.load(),  delays_.load(),     refused_.load()};
  }

 private:
  Plan Draw1() {
    Draw d(rates_.seed, 0, sends_.fetch_add(1, std::memory_order_relaxed));
    Plan p;
    p.fail = d.Happens(rates_.fail);
    p.drop = d.Happens(rates_.drop);
    p.duplicate = d.Happens(rates_.duplicate);
    p.corrupt = d.Happens(rates_.corrupt);
    p.truncate = d.Happens(rates_.truncate);
    p.delay = d.Happens(rates_.delay);
    p.corrupt_bit = d.Next();
    p.truncate_at = d.Next() >> 32;
    return p;
  }

  void Execute(int32_t peer, Message message, const Plan& plan, SendCallback done) {
    if (plan.delay) {
      ++delays_;
      std::this_thread::sleep_for(std::chrono::milliseconds(rates_.delay_ms));
    }
    if (plan.fail) {
      ++failures_;
      done(Unavailable("faulty transport: injected failure of a send to rank " +
                       std::to_string(peer)));
      return;
    }
    if (plan.drop) {
      ++drops_;
      done(Status::OK());
      return;
    }
    Status cut_status;
    if (plan.corrupt || plan.truncate || rates_.cut_after_bytes > 0) {
      Result<std::optional<Message>> damaged = Damage(message, plan, &cut_status);
      if (!damaged.ok()) {
        done(damaged.status());
        return;
      }
      if (*damaged) message = std::move(**damaged);
    }
    if (!cut_status.ok()) {
      // The receiver gets the bytes sent before the cut; the sender hears
      // that the connection broke.
      inner_->SendAsync(peer, std::move(message),
                        [done, cut_status](const Status&) { done(cut_status); });
      return;
    }
    if (plan.duplicate) {
      ++duplicates_;
      SendCallback joined = Joined::Make(2, std::move(done));
      inner_->SendAsync(peer, message, joined);
      inner_->SendAsync(peer, std::move(message), joined);
      return;
    }
    inner_->SendAsync(peer, std::move(message), std::move(done));
  }

  // The wrapper carrying `message`'s damaged frame, or nullopt when no
  // damage applies after all. Sets *cut to Unavailable when the connection
  // is cut under this message.
  Result<std::optional<Message>> Damage(const Message& message, const Plan& plan, Status* cut) {
    EncodedFrame frame = EncodeMessage(message);
    const uint64_t size = frame.bytes.size;
    uint64_t keep = size;
    if (rates_.cut_after_bytes > 0) {
      std::lock_guard<std::mutex> lock(cut_mu_);
      if (since_cut_ + size > rates_.cut_after_bytes) {
        keep = rates_.cut_after_bytes - since_cut_;
        since_cut_ = 0;
        ++cuts_;
        *cut = Unavailable("faulty transport: connection cut after " +
                           std::to_string(rates_.cut_after_bytes) + " bytes");
      } else {
        since_cut_ += size;
      }
    }
    if (plan.truncate && size > 0) {
      ++truncations_;
      keep = std::min(keep, (size * plan.truncate_at) >> 32);
    }
    if (!plan.corrupt && keep == size) return std::optional<Message>();
    Buffer bytes;
    if (plan.corrupt && size > 0) {
      ++corruptions_;
      Draw d(plan.corrupt_bit, 1, 0);
      XSILO_ASSIGN_OR_RETURN(bytes, fault::FlipOneBit(frame.bytes, d));
    } else {
      XSILO_ASSIGN_OR_RETURN(bytes, frame.bytes.Flatten());
    }
    bytes = bytes.SliceUnchecked(0, keep);
    Message wrapper;
    wrapper.type = kFrameType;
    wrapper.round = message.round;
    wrapper.sender = message.sender;
    XSILO_ASSIGN_OR_RETURN(
        Tensor t, Tensor::Make(DType::kU8, {static_cast<int64_t>(keep)}, std::move(bytes)));
    wrapper.tensors.emplace(kFrameTensor, std::move(t));
    return std::optional<Message>(std::move(wrapper));
  }

  void Pump() {
    for (;;) {
      Result<Message> m = inner_->Receive(std::chrono::hours(1));
      if (m.ok()) {
        OnReceive(std::move(*m));
      } else if (m.status().code() != StatusCode::kTimeout) {
        return;  // the inner transport stopped and its queue is drained
      }
    }
  }

  void OnReceive(Message m) {
    if (m.type == kFrameType) {
      auto it = m.tensors.find(kFrameTensor);
      Result<Message> decoded =
          it == m.tensors.end()
              ? Result<Message>(Corrupt("damaged-frame wrapper without its frame"))
              : DecodeMessage(it->second.data, Limits());
      if (!decoded.ok()) {
        ++refused_;
        std::fprintf(stderr, "%s rank %d: refused a message from rank %d: %s\n", name_.c_str(),
                     rank(), m.sender, decoded.status().ToString().c_str());
        return;
      }
      decoded->sender = m.sender;
      m = std::move(*decoded);
    }
    (void)Deliver(std::move(m), [this] { return stopping_.load(); });
  }

  DecodeLimits Limits() const {
    DecodeLimits limits;
    limits.max_payload_bytes = options_.max_message_bytes;
    return limits;
  }

  const std::unique_ptr<Transport> inner_;
  const Rates rates_;
  const std::string name_;
  std::atomic<uint64_t> sends_{0};
  std::atomic<bool> stopping_{false};
  std::thread pump_;
  std::mutex cut_mu_;
  uint64_t since_cut_ = 0;  // guarded by cut_mu_
  std::atomic<uint64_t> failures_{0}, drops_{0}, duplicates_{0}, corruptions_{0}, truncations_{0},
      cuts_{0}, delays_{0}, refused_{0};
};

}  // namespace

std::optional<InjectedTransportFaults> InjectedFaultsOf(const Transport& transport) {
  const auto* faulty = dynamic_cast<const FaultyTransport*>(&transport);
  if (faulty == nullptr) return std::nullopt;
  return faulty->injected();
}

Result<std::unique_ptr<Transport>> MakeFaultyTransport(std::unique_ptr<Transport> inner,
                                                       const TransportOptions& options) {
  XSILO_RETURN_IF_ERROR(CheckBackendKeys(
      options, {"fault.seed", "fault.fail", "fault.drop", "fault.duplicate", "fault.corrupt",
                "fault.truncate", "fault.delay", "fault.delay_ms", "fault.cut_after_bytes"}));
  const auto& o = options.backend;
  const std::string who = "faulty transport";
  Rates r;
  XSILO_ASSIGN_OR_RETURN(r.fail, fault::Probability(o, "fault.fail", who));
  XSILO_ASSIGN_OR_RETURN(r.drop, fault::Probability(o, "fault.drop", who));
  XSILO_ASSIGN_OR_RETURN(r.duplicate, fault::Probability(o, "fault.duplicate", who));
  XSILO_ASSIGN_OR_RETURN(r.corrupt, fault::Probability(o, "fault.corrupt", who));
  XSILO_ASSIGN_OR_RETURN(r.truncate, fault::Probability(o, "fault.truncate", who));
  XSILO_ASSIGN_OR_RETURN(r.delay, fault::Probability(o, "fault.delay", who));
  XSILO_ASSIGN_OR_RETURN(r.seed, fault::Unsigned(o, "fault.seed", who, 0));
  XSILO_ASSIGN_OR_RETURN(r.cut_after_bytes, fault::Unsigned(o, "fault.cut_after_bytes", who, 0));
  XSILO_ASSIGN_OR_RETURN(uint64_t delay_ms, fault::Unsigned(o, "fault.delay_ms", who, 10));
  if (delay_ms > 600000) return InvalidArgument("faulty transport: fault.delay_ms above 600000");
  r.delay_ms = static_cast<int64_t>(delay_ms);
  return std::unique_ptr<Transport>(
      std::make_unique<FaultyTransport>(options, std::move(inner), r));
}

}  // namespace xsilo
