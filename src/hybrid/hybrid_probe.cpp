// The adaptive backend (auto+<connector>, docs/auto.md): the route of each
// message, echoes that measure RTT, and the probes of a link before its
// first payload.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "hybrid/hybrid_internal.h"

namespace xsilo::hybrid_detail {

namespace {

// How long a probe waits for the receiver's ack of its store transfer.
constexpr auto kStoreProbeTimeout = std::chrono::seconds(30);

}  // namespace

std::optional<Route> HybridTransport::ChooseRoute(const Message& m,
                                                  const std::vector<int32_t>& peers, bool wait) {
  return ChooseRoute(m.payload_bytes(), peers, wait);
}

std::optional<Route> HybridTransport::ChooseRoute(uint64_t bytes, const std::vector<int32_t>& peers,
                                                  bool wait) {
  // An echo goes ahead of a small message only; after a big one it goes
  // when the send completes (Issue): queued ahead of a Large message on
  // loopback, an echo made that message ~350 ms slower (docs/auto.md).
  if (bytes < AutoRouter::kProbeMinBytes) MaybePing(peers);
  if (bytes == 0) return Route{};
  bool store = connector_ != nullptr;
  if (!store) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = grants_.find(peers[0]);
    store = it != grants_.end() && !it->second.empty();
  }
  if (bytes >= AutoRouter::kProbeMinBytes) {
    const std::vector<int32_t> probed = router_->ProbeSet(peers);
    const auto start = Clock::now();
    for (int32_t p : router_->WantProbe(probed)) StartProbe(p);
    if (!wait) {
      if (!router_->Settled(peers)) return std::nullopt;
    } else {
      router_->WaitSettled(peers);  // ProbeSet again at every echo
    }
    const double waited = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (waited >= 1) {
      XSILO_LOG(kLog, kDebug,
                name_ << " rank " << rank() << ": waited " << waited
                      << " ms for the probes or echoes of " << probed.size() << " of "
                      << peers.size() << " receivers");
    }
  }
  AutoChoice c = router_->Choose(peers, bytes, store);
  XSILO_LOG(kLog, kDebug,
            name_ << " rank " << rank() << " -> "
                  << (peers.size() == 1 ? "rank " + std::to_string(peers[0])
                                        : std::to_string(peers.size()) + " ranks")
                  << ": " << c.reason);
  Route r;
  r.store = c.path == AutoPath::kStore;
  r.stripe = c.path == AutoPath::kStriped ? c.streams : 1;
  return r;
}

void HybridTransport::LearnLink(const std::vector<int32_t>& peers, uint64_t bytes) {
  // As RouteNow: a party without storage access sends a broadcast inline
  // at once, and a send before Start or after Stop fails at once.
  if (!router_ || peers.empty() || bytes < AutoRouter::kProbeMinBytes ||
      (!connector_ && peers.size() != 1)) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stopped_) return;
  }
  router_->WaitEchoes(peers, Clock::now() + AutoRouter::kProbeWait);
}

double HybridTransport::MeasuredRttS(int32_t peer) {
  return router_ ? router_->RoundTripOf(peer) : -1;
}

void HybridTransport::MaybePing(const std::vector<int32_t>& peers) {
  const auto now = Clock::now();
  for (int32_t p : peers) {
    if (!router_->WantsPing(p, now)) continue;
    router_->PingSent(p, now);
    Message ping;
    ping.type = kPingType;
    ping.params["t"] = NowNs();
    inner().SendAsync(p, std::move(ping), [this, p](const Status& s) {
      if (!s.ok()) {
        XSILO_LOG(
            kLog, kDebug,
            name_ << " rank " << rank() << ": echo to rank " << p << " not sent: " << s.ToString());
      }
    });
  }
}

void HybridTransport::StartProbe(int32_t peer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) {
      probe_queue_.push_back(peer);
      if (!prober_.joinable()) prober_ = std::thread([this] { ProbeLoop(); });
      probe_cv_.notify_all();
      return;
    }
  }
  router_->ProbeDone(peer);
}

void HybridTransport::ProbeLoop() {
  for (;;) {
    int32_t peer;
    {
      std::unique_lock<std::mutex> lock(mu_);
      probe_cv_.wait(lock, [&] { return stopped_ || !probe_queue_.empty(); });
      if (stopped_) break;
      peer = probe_queue_.front();
      probe_queue_.pop_front();
    }
    ProbeLink(peer);
    router_->ProbeDone(peer);
  }
  std::deque<int32_t> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(probe_queue_);
  }
  for (int32_t peer : left) router_->ProbeDone(peer);
}

void HybridTransport::ProbeLink(int32_t peer) {
  if (!SendProbeInline(peer, AutoRouter::kInlineWarmupBytes).ok()) return;
  double fastest = std::numeric_limits<double>::infinity();
  for (int i = 0; i < AutoRouter::kInlineProbes; ++i) {
    auto seconds = SendProbeInline(peer, AutoRouter::kInlineProbeBytes);
    if (!seconds.ok()) return;
    XSILO_LOG(kLog, kDebug,
              name_ << " rank " << rank() << " -> rank " << peer << ": inline probe of "
                    << AutoRouter::kInlineProbeBytes << " bytes took " << *seconds * 1e3 << " ms");
    fastest = std::min(fastest, *seconds);
  }
  router_->OnTransfer(peer, AutoRouter::kInlineProbeBytes, fastest, 1);
  if (connector_ && !stopping()) ProbeStore(peer);
}

Result<double> HybridTransport::SendProbeInline(int32_t peer, uint64_t bytes) {
  XSILO_ASSIGN_OR_RETURN(Message probe, ProbeMessage(bytes));
  if (hybrid_.stripe_streams > 1) probe.params[kStripeParam] = int64_t{1};
  auto sent = std::make_shared<std::promise<Status>>();
  auto delivered = sent->get_future();
  const auto start = Clock::now();
  inner().SendAsync(peer, std::move(probe), [sent](const Status& s) { sent->set_value(s); });
  // The inner transport reports every send, at the latest when it stops.
  XSILO_RETURN_IF_ERROR(delivered.get());
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void HybridTransport::ProbeStore(int32_t peer) {
  auto probe = ProbeMessage(AutoRouter::kStoreProbeBytes);
  if (!probe.ok()) return;
  Prepared prepared = Prepare(probe->tensors);
  const EncodedPayload& payload = prepared.payload;
  auto stored = PutObject(payload.bytes);
  if (!stored.ok()) return;
  const Key& key = stored->key;
  auto obj = std::make_shared<Object>();
  obj->key = key;
  obj->pending_acks = 1;
  obj->last_use = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    objects_by_id_[key.id] = obj;
    probes_out_.insert(key.id);
  }
  Message stub;
  stub.type = kProbeType;
  MakeStub(&stub, key, payload.checksum, prepared.blocks, stored->url);
  inner().SendAsync(peer, std::move(stub), [](const Status&) {});
  std::unique_lock<std::mutex> lock(mu_);
  probe_cv_.wait_for(lock, kStoreProbeTimeout,
                     [&] { return stopped_ || probes_out_.count(key.id) == 0; });
  if (probes_out_.count(key.id) == 0) return;  // fetched: the ack evicted it
  // Not fetched (the peer failed, or we stop): the object is ours to drop.
  probes_out_.erase(key.id);
  if (objects_by_id_.erase(key.id) == 0) return;  // the reaper took it
  lock.unlock();
  (void)connector_->Evict(key);
}

Result<Message> HybridTransport::ProbeMessage(uint64_t bytes) {
  XSILO_ASSIGN_OR_RETURN(Tensor t, Tensor::Zeros(DType::kU8, {static_cast<int64_t>(bytes)}));
  const int64_t nonce = NowNs();
  std::memcpy(t.data.mutable_data(), &nonce, std::min<uint64_t>(sizeof nonce, bytes));
  Message m;
  m.type = kProbeType;
  m.tensors.emplace("probe", std::move(t));
  return m;
}

SendCallback HybridTransport::TimeInlineSend(int32_t peer, const Message& stub, int streams,
                                             SendCallback done) {
  if (!router_ || stub.params.count(kHybridKeyParam)) return done;
  const uint64_t bytes = stub.payload_bytes();
  const auto start = Clock::now();
  return [this, peer, bytes, start, streams, done = std::move(done)](const Status& s) {
    if (s.ok()) {
      router_->OnTransfer(peer, bytes, std::chrono::duration<double>(Clock::now() - start).count(),
                          streams);
    }
    done(s);
  };
}

SendCallback HybridTransport::TimeInlineBroadcast(const std::vector<int32_t>& peers,
                                                  const Message& stub, SendCallback done) {
  if (!router_ || peers.size() < 2 || stub.params.count(kHybridKeyParam)) return done;
  const uint64_t bytes = stub.payload_bytes();
  if (bytes < AutoRouter::kProbeMinBytes) return done;
  const int receivers = static_cast<int>(peers.size());
  const auto start = Clock::now();
  return [this, receivers, bytes, start, done = std::move(done)](const Status& s) {
    if (s.ok()) {
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      router_->OnInlineBroadcast(receivers, bytes, seconds);
      XSILO_LOG(kLog, kDebug,
                name_ << " rank " << rank() << ": inline broadcast of " << bytes << " bytes to "
                      << receivers << " receivers took " << seconds * 1e3
                      << " ms; sender egress now " << router_->sender_egress_Bps() / 1e6
                      << " MB/s");
    }
    done(s);
  };
}

void HybridTransport::OnEcho(const Message& m) {
  if (stopping()) return;
  if (m.type == kPingType) {
    Message pong;
    pong.type = kPongType;
    pong.params = m.params;
    inner().SendAsync(m.sender, std::move(pong), [](const Status&) {});
    return;
  }
  auto t = m.GetInt("t");
  if (!router_ || !t.ok()) return;
  const int64_t ns = NowNs() - *t;
  XSILO_LOG(kLog, kDebug,
            name_ << " rank " << rank() << ": echo from rank " << m.sender << " in "
                  << static_cast<double>(ns) * 1e-6 << " ms");
  router_->OnRtt(m.sender, static_cast<double>(ns) * 1e-9);
  MaybePing({m.sender});  // the start's echoes go back to back
  if (router_->ProbeDue(m.sender)) StartProbe(m.sender);
}

}  // namespace xsilo::hybrid_detail
