// HybridTransport's lifecycle and send pipeline: the ordered queue, the
// workers, the hand-off to the inner transport; the reaper; the factory.
// (hybrid_internal.h lists the other parts.)
#include <algorithm>
#include <cstdlib>

#include "hybrid/hybrid_internal.h"

namespace xsilo::hybrid_detail {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

Status HybridTransport::Start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_) return FailedPrecondition(name_ + " already started");
    started_ = true;
  }
  for (int i = 0; i < std::max(1, hybrid_.workers); ++i) {
    workers_.emplace_back([this] { SendLoop(); });
  }
  fetcher_ = std::thread([this] { FetchLoop(); });
  reaper_ = std::thread([this] { ReapLoop(); });
  XSILO_RETURN_IF_ERROR(inner().Start());
  if (router_) {
    // Rank 0 talks to every client, a client to rank 0.
    std::vector<int32_t> peers;
    for (int32_t r = 0; r < world_size(); ++r) {
      if (r != rank() && (rank() == 0 || r == 0)) peers.push_back(r);
    }
    MaybePing(peers);
  }
  return Status::OK();
}

void HybridTransport::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  NotifyAll();
  CloseInbox();  // wakes a fetch blocked on a full queue
  for (auto& t : workers_) t.join();
  inner().Stop();  // fails the inner sends still in flight; no handler calls after this
  fetch_queue_.Close();
  if (fetcher_.joinable()) fetcher_.join();
  if (prober_.joinable()) prober_.join();
  if (reaper_.joinable()) reaper_.join();
  std::deque<SendJob> jobs;
  std::map<std::string, std::shared_ptr<Object>> objects;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs.swap(jobs_);
    objects.swap(objects_by_id_);
    objects_by_content_.clear();
    objects_by_identity_.clear();
  }
  std::map<std::string, Issued> issued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    issued.swap(issued_);
  }
  for (auto& [id, g] : issued) DropIssued(g);
  for (auto& j : jobs) j.done(Cancelled("transport stopped before the send started"));
  // Objects are ours: nothing outlives the sender's transport.
  for (auto& [id, obj] : objects) {
    if (obj->uploaded.valid() &&
        obj->uploaded.wait_for(std::chrono::seconds(0)) == std::future_status::ready &&
        obj->uploaded.get().ok() && connector_) {
      (void)connector_->Evict(obj->key);
    }
  }
}

void HybridTransport::SendAsync(int32_t peer, Message message, SendCallback done) {
  Status s = CheckPeer(peer);
  if (!s.ok()) return done(s);
  Enqueue({peer}, false, std::move(message), std::move(done));
}

void HybridTransport::BroadcastAsync(std::vector<int32_t> peers, Message message,
                                     SendCallback done) {
  for (int32_t p : peers) {
    Status s = CheckPeer(p);
    if (!s.ok()) return done(s);
  }
  if (peers.empty()) return done(Status::OK());
  Enqueue(std::move(peers), true, std::move(message), std::move(done));
}

bool HybridTransport::StreamsSends(int32_t peer) {
  if (connector_ || !(router_ || hybrid_.store_threshold() <= 1) || !CheckPeer(peer).ok()) {
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = grants_.find(peer);
  if (it == grants_.end()) return false;
  const auto now = Clock::now();
  for (const Grant& g : it->second) {
    if (g.usable_until > now) return !g.part_urls.empty();  // the one TakeGrant takes
  }
  return false;
}

void HybridTransport::SendStreamAsync(int32_t peer, std::shared_ptr<EncodeStream> stream,
                                      SendCallback done) {
  Status s = CheckPeer(peer);
  if (!s.ok()) return done(s);
  if (!stream) return done(InvalidArgument("SendStreamAsync: no stream"));
  Enqueue({peer}, false, Message{}, std::move(done), std::move(stream));
}

void HybridTransport::Enqueue(std::vector<int32_t> peers, bool broadcast, Message message,
                              SendCallback done, std::shared_ptr<EncodeStream> stream) {
  // A stream's route is the worker's to decide (OffloadStream).
  std::optional<Route> route = stream ? std::nullopt : RouteNow(message, peers);
  Status s;
  SendJob direct;
  bool issue_here = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      s = FailedPrecondition("transport not started");
    } else if (stopped_) {
      s = Cancelled("transport stopped");
    } else {
      const uint64_t seq = next_seq_++;
      SendJob job{seq,   std::move(peers), broadcast, std::move(message), std::move(done),
                  route, std::move(stream)};
      issue_here = route && !route->store && jobs_.empty() && next_issue_ == job.seq &&
                   !GrantsDueLocked(job.peers);
      if (issue_here)
        direct = std::move(job);
      else
        jobs_.push_back(std::move(job));
    }
  }
  if (!s.ok()) return done(s);
  if (!issue_here) return work_cv_.notify_one();
  const int stripe = route->stripe;
  Message m = std::move(direct.message);
  Issue(std::move(direct), std::move(m), stripe);
}

void HybridTransport::SendLoop() {
  for (;;) {
    SendJob job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopped_ || !jobs_.empty(); });
      if (stopped_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    int stripe = 1;
    Result<Message> stub = job.stream
                               ? OffloadStream(*job.stream, job.peers[0], &stripe)
                               : Offload(std::move(job.message), job.peers, job.route, &stripe);
    job.stream.reset();
    if (!Issue(std::move(job), std::move(stub), stripe)) return;
  }
}

bool HybridTransport::Issue(SendJob job, Result<Message> stub, int stripe) {
  // Adaptive over several streams: an inline message says how many it
  // takes (1, or K when the router stripes it).
  if (stub.ok() && router_ && hybrid_.stripe_streams > 1 && !stub->params.count(kHybridKeyParam)) {
    stub->params[kStripeParam] = static_cast<int64_t>(stripe);
  }
  // Hand stubs to the inner transport in submission order, so per-peer
  // order holds although uploads run in parallel.
  {
    std::unique_lock<std::mutex> lock(mu_);
    turn_cv_.wait(lock, [&] { return stopped_ || next_issue_ == job.seq; });
    if (stopped_) {
      lock.unlock();
      job.done(Cancelled("transport stopped during the upload"));
      return false;
    }
  }
  if (stub.ok()) SendGrants(job.peers);
  if (router_) {
    job.done = [this, peers = job.peers, done = std::move(job.done)](const Status& s) {
      done(s);
      if (s.ok()) MaybePing(peers);
    };
  }
  if (!stub.ok()) {
    job.done(stub.status());
  } else if (job.broadcast) {
    SendCallback done = TimeInlineBroadcast(job.peers, *stub, std::move(job.done));
    inner().BroadcastAsync(job.peers, std::move(stub).value(), std::move(done));
  } else {
    SendCallback done = TimeInlineSend(job.peers[0], *stub, stripe, std::move(job.done));
    inner().SendAsync(job.peers[0], std::move(stub).value(), std::move(done));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++next_issue_;
  }
  turn_cv_.notify_all();
  return true;
}

std::optional<Route> HybridTransport::RouteNow(const Message& m,
                                               const std::vector<int32_t>& peers) {
  if (!connector_ && peers.size() != 1) return Route{};  // no storage access: inline
  if (!router_) {
    for (const auto& [name, t] : m.tensors) {
      if (t.nbytes() > 0 && t.nbytes() >= hybrid_.store_threshold()) return std::nullopt;
    }
    return Route{};
  }
  return ChooseRoute(m, peers, /*wait=*/false);
}

void HybridTransport::ReapLoop() {
  const auto tick = std::min<Clock::duration>(hybrid_.ttl / 4, std::chrono::seconds(1));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_cv_.wait_for(lock, tick, [&] { return stopped_; })) {
    std::vector<std::shared_ptr<Object>> expired;
    auto now = Clock::now();
    for (const auto& [id, obj] : objects_by_id_) {
      if (now - obj->last_use > hybrid_.ttl) expired.push_back(obj);
    }
    for (const auto& obj : expired) Forget(obj);
    std::vector<Issued> lapsed;
    for (auto it = issued_.begin(); it != issued_.end();) {
      if (now > it->second.expires) {
        lapsed.push_back(it->second);
        --issued_per_peer_[it->second.peer];
        it = issued_.erase(it);
      } else {
        ++it;
      }
    }
    lock.unlock();
    for (const auto& obj : expired) (void)connector_->Evict(obj->key);
    for (const auto& g : lapsed) DropIssued(g);
    if (pool_) pool_->Trim();  // idle download buffers past their 5 s
    Buffer::TrimIdleCache();   // and the process's, past theirs
    lock.lock();
  }
}

}  // namespace xsilo::hybrid_detail

namespace xsilo {

std::shared_ptr<Connector> HybridConnectorOf(const Transport& transport) {
  const auto* hybrid = dynamic_cast<const hybrid_detail::HybridTransport*>(&transport);
  return hybrid == nullptr ? nullptr : hybrid->connector();
}

std::unique_ptr<Transport> MakeHybridTransport(const TransportOptions& options,
                                               std::unique_ptr<Transport> inner,
                                               std::shared_ptr<Connector> connector,
                                               HybridOptions hybrid, std::string connector_type,
                                               std::shared_ptr<void> keepalive) {
  return std::make_unique<hybrid_detail::HybridTransport>(
      options, std::move(inner), std::move(connector), hybrid, std::move(connector_type),
      std::move(keepalive));
}

}  // namespace xsilo
