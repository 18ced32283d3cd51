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
// fails is refused (logged at warn, counted in `refused`) and never
// delivered. Undamaged messages pass through untouched (no copy).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>

#include "core/fault_draw.h"
#include "transport/builtin.h"
#include "transport/faulty/faulty.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/encode_stream.h"
#include "xsilo/core/log.h"
#include "xsilo/transport/forwarding.h"

namespace xsilo {

namespace {

using fault::Draw;

// A message refused after its frame was damaged, at warn.
constinit LogComponent kLog("faulty");

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

// Streamed sends (StreamSink) are drawn as whole ones: a clean draw hands
// the stream to the inner transport's sink; any other waits, on a thread
// of its own, for the stream's final message and sends that through the
// faults (damage strikes a whole frame).
class FaultyTransport final : public ForwardingTransport, private StreamSink {
 public:
  FaultyTransport(TransportOptions options, std::unique_ptr<Transport> inner, Rates rates)
      : ForwardingTransport(std::move(options), std::move(inner)),
        rates_(rates),
        name_("faulty(" + std::string(this->inner().name()) + ")") {}
  ~FaultyTransport() override { Stop(); }

  std::string_view name() const override { return name_; }
  StreamSink* stream_sink() override {
    return inner().stream_sink() != nullptr ? static_cast<StreamSink*>(this) : nullptr;
  }

  void Stop() override {
    stopping_ = true;
    ForwardingTransport::Stop();
    std::vector<Waiter> waiting;
    {
      std::lock_guard<std::mutex> lock(streams_mu_);
      waiting.swap(stream_waiters_);
    }
    for (auto& w : waiting) {
      if (w.thread.get_id() != std::this_thread::get_id())
        w.thread.join();
      else
        w.thread.detach();
    }
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
      inner().BroadcastAsync({}, std::move(message), std::move(done));
      return;
    }
    SendCallback joined = Joined::Make(parts, std::move(done));
    for (auto& [p, plan] : faulted) Execute(p, message, plan, joined);
    if (!clean.empty()) inner().BroadcastAsync(std::move(clean), std::move(message), joined);
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
      inner().SendAsync(peer, std::move(message),
                        [done, cut_status](const Status&) { done(cut_status); });
      return;
    }
    if (plan.duplicate) {
      ++duplicates_;
      SendCallback joined = Joined::Make(2, std::move(done));
      inner().SendAsync(peer, message, joined);
      inner().SendAsync(peer, std::move(message), joined);
      return;
    }
    inner().SendAsync(peer, std::move(message), std::move(done));
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

  // On the inner transport's delivering thread: a damaged frame's wrapper
  // is decoded, as a transport's receiver would, and refused when it fails.
  Status OnDelivery(Message m, const std::function<bool()>& abandon) override {
    if (m.type == kFrameType) {
      auto it = m.tensors.find(kFrameTensor);
      Result<Message> decoded =
          it == m.tensors.end()
              ? Result<Message>(Corrupt("damaged-frame wrapper without its frame"))
              : DecodeMessage(it->second.data, Limits());
      if (!decoded.ok()) {
        ++refused_;
        XSILO_LOG(kLog, kWarn,
                  name_ << " rank " << rank() << ": refused a message from rank " << m.sender
                        << ": " << decoded.status().ToString());
        return Status::OK();
      }
      decoded->sender = m.sender;
      m = std::move(*decoded);
    }
    return Deliver(std::move(m), abandon);
  }

  bool StreamsSends(int32_t peer) override {
    StreamSink* sink = inner().stream_sink();
    return sink != nullptr && sink->StreamsSends(peer);
  }

  void SendStreamAsync(int32_t peer, std::shared_ptr<EncodeStream> stream,
                       SendCallback done) override {
    Plan plan = Draw1();
    StreamSink* sink = inner().stream_sink();
    if (sink != nullptr && plan.clean() && rates_.cut_after_bytes == 0) {
      sink->SendStreamAsync(peer, std::move(stream), std::move(done));
      return;
    }
    if (!stream) return done(InvalidArgument("SendStreamAsync: no stream"));
    std::lock_guard<std::mutex> lock(streams_mu_);
    if (stopping_) return done(Cancelled("faulty transport stopped before the send started"));
    // Waiters that are done are joined here, so that their number stays
    // that of the streamed sends in flight.
    for (auto it = stream_waiters_.begin(); it != stream_waiters_.end();) {
      if (it->finished->load()) {
        it->thread.join();
        it = stream_waiters_.erase(it);
      } else {
        ++it;
      }
    }
    auto finished = std::make_shared<std::atomic<bool>>(false);
    std::thread t(
        [this, peer, plan, finished, stream = std::move(stream), done = std::move(done)]() mutable {
          Result<Message> m = stream->TakeMessage();
          if (m.ok()) {
            m->sender = rank();
            Execute(peer, *std::move(m), plan, std::move(done));
          } else {
            done(m.status());
          }
          finished->store(true);
        });
    stream_waiters_.push_back({std::move(t), std::move(finished)});
  }

  struct Waiter {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };

  DecodeLimits Limits() const {
    DecodeLimits limits;
    limits.max_payload_bytes = options_.max_message_bytes;
    return limits;
  }

  const Rates rates_;
  const std::string name_;
  std::atomic<uint64_t> sends_{0};
  std::atomic<bool> stopping_{false};
  std::mutex streams_mu_;
  std::vector<Waiter> stream_waiters_;  // guarded by streams_mu_
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

const OptionTable& FaultOptionTable() {
  using T = OptionType;
  static const OptionTable table(
      "faulty transport",
      {
          {"fault.seed", T::kU64, "0", 0, 0, "", "seeds every draw"},
          {"fault.fail", T::kFraction, "0", 0, 0, "",
           "probability: a send fails with Unavailable, nothing is sent"},
          {"fault.drop", T::kFraction, "0", 0, 0, "",
           "probability: a send is reported OK and never sent"},
          {"fault.duplicate", T::kFraction, "0", 0, 0, "", "probability: a message is sent twice"},
          {"fault.corrupt", T::kFraction, "0", 0, 0, "",
           "probability: one bit of the message's frame is flipped"},
          {"fault.truncate", T::kFraction, "0", 0, 0, "",
           "probability: the message's frame is cut short"},
          {"fault.delay", T::kFraction, "0", 0, 0, "",
           "probability: the send first sleeps fault.delay_ms on the caller's thread"},
          {"fault.delay_ms", T::kMillis, "10", 0, 600000, "", "how long a delay lasts"},
          {"fault.cut_after_bytes", T::kU64, "0", 0, 0, "",
           "every N frame bytes sent the connection is cut; 0 = never"},
      });
  return table;
}

Result<std::unique_ptr<Transport>> MakeFaultyTransport(std::unique_ptr<Transport> inner,
                                                       const TransportOptions& options) {
  const OptionTable& t = FaultOptionTable();
  const OptionMap& o = options.backend;
  XSILO_RETURN_IF_ERROR(t.CheckKeys(o));
  Rates r;
  XSILO_ASSIGN_OR_RETURN(r.fail, t.Real(o, "fault.fail"));
  XSILO_ASSIGN_OR_RETURN(r.drop, t.Real(o, "fault.drop"));
  XSILO_ASSIGN_OR_RETURN(r.duplicate, t.Real(o, "fault.duplicate"));
  XSILO_ASSIGN_OR_RETURN(r.corrupt, t.Real(o, "fault.corrupt"));
  XSILO_ASSIGN_OR_RETURN(r.truncate, t.Real(o, "fault.truncate"));
  XSILO_ASSIGN_OR_RETURN(r.delay, t.Real(o, "fault.delay"));
  XSILO_ASSIGN_OR_RETURN(r.seed, t.U64(o, "fault.seed"));
  XSILO_ASSIGN_OR_RETURN(r.cut_after_bytes, t.U64(o, "fault.cut_after_bytes"));
  XSILO_ASSIGN_OR_RETURN(r.delay_ms, t.Int(o, "fault.delay_ms"));
  return std::unique_ptr<Transport>(
      std::make_unique<FaultyTransport>(options, std::move(inner), r));
}

}  // namespace xsilo
