// The MPI engine thread: MPI_Init, the command loop, links opened, sent on
// and closed; the process-wide engine and its exit (mpi_engine.h).
#include <sys/prctl.h>

#include <cstdio>

#include "transport/mpi/mpi_engine_internal.h"
#include "xsilo/core/log.h"

namespace xsilo::mpi {

std::string MpiError(int code, const std::string& what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return what + ": " + (len > 0 ? std::string(text, len) : "MPI error " + std::to_string(code));
}

void LogProblem(const std::string& text) {
  static constinit LogComponent log("mpi");
  XSILO_LOG(log, kWarn, text);
}

namespace {

std::atomic<bool> g_initialized{false};

}  // namespace

void Engine::Impl::Run(std::promise<Status>* init, int32_t* rank, int32_t* size) {
  thread_id = std::this_thread::get_id();
  prctl(PR_SET_TIMERSLACK, 1000UL);  // 1 us: short sleeps stay short
  int provided = 0;
  int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) {
    init->set_value(Unavailable(MpiError(rc, "MPI_Init_thread")));
    std::lock_guard<std::mutex> lock(mu);
    exited = true;
    return;
  }
  g_initialized = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
  init->set_value(Status::OK());

  int64_t sleep_us = 0;
  int yields = 0;
  bool shutdown_seen = false;
  Clock::time_point linger_deadline;
  for (;;) {
    std::deque<std::function<void()>> batch;
    bool shutting = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      batch.swap(commands);
      shutting = shutdown;
    }
    bool work = !batch.empty();
    for (auto& c : batch) c();
    bool active = false;
    for (auto& l : links) work |= Progress(*l, &active);
    Reap();
    FireCompletions();

    if (shutting) {
      if (!shutdown_seen) {
        shutdown_seen = true;
        linger_deadline = Clock::now() + kExitLinger;
        for (auto& l : links) CloseLink(*l);
        FireCompletions();
      }
      if (links.empty() || Clock::now() > linger_deadline) {
        std::lock_guard<std::mutex> lock(mu);
        if (commands.empty()) {
          exited = true;
          break;
        }
        continue;
      }
    }
    if (work) {
      sleep_us = 0;
      yields = 0;
      continue;
    }
    // Requests in flight need MPI to be called to progress: yield a while,
    // then sleep briefly. Idle, back off up to the links' poll limit.
    if (active && yields < 64) {
      ++yields;
      std::this_thread::yield();
      continue;
    }
    const int64_t cap = active ? kBusyPollMaxUs : PollMaxUs();
    sleep_us = std::min(cap, std::max<int64_t>(sleep_us * 2, active ? 2 : 16));
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::microseconds(sleep_us),
                [&] { return !commands.empty() || shutdown; });
  }
  if (!links.empty()) {
    LogProblem(std::to_string(links.size()) +
               " link(s) still draining at exit (a peer never stopped its transport)");
  }
  MPI_Finalize();
}

int64_t Engine::Impl::PollMaxUs() const {
  int64_t cap = 1000;
  bool any = false;
  for (const auto& l : links) {
    int64_t v = std::max<int64_t>(1, l->config().poll_max_us);
    cap = any ? std::min(cap, v) : v;
    any = true;
  }
  return cap;
}

void Engine::Impl::OpenLink(const std::shared_ptr<Link>& link,
                            const std::shared_ptr<OpenWaiter>& waiter) {
  LinkState& s = *link->state;
  const int32_t world = link->config().world_size;
  s.fin_from.assign(world, 0);
  s.matched.resize(world);
  s.active.resize(world);
  int rc = MPI_Comm_idup(MPI_COMM_WORLD, &s.comm, &s.open_request);
  if (rc != MPI_SUCCESS) {
    s.phase = LinkState::Phase::kFailed;
    waiter->Set(Internal(MpiError(rc, "MPI_Comm_idup")));
    return;
  }
  links.push_back(link);
  open_waiters[link.get()] = waiter;
}

void Engine::Impl::SendFins(Link& link) {
  LinkState& s = *link.state;
  if (s.fins_sent) return;
  s.fins_sent = true;
  PendingSend op;
  Buffer fin = FinEnvelope();
  for (int32_t peer = 0; peer < link.config().world_size; ++peer) {
    if (peer == link.config().rank) continue;
    MPI_Request r;
    int rc = MPI_Isend(fin.data(), static_cast<int>(fin.size()), MPI_BYTE, peer, kTagEnvelope,
                       s.comm, &r);
    if (rc != MPI_SUCCESS) {
      LogProblem(MpiError(rc, "MPI_Isend(fin)"));
      continue;
    }
    op.requests.push_back(r);
  }
  op.keep.push_back(std::move(fin));
  s.sends.push_back(std::move(op));
}

void Engine::Impl::CloseLink(Link& link) {
  LinkState& s = *link.state;
  if (s.closing) return;
  s.closing = true;
  for (auto& op : s.sends) {
    Complete(op.done, Cancelled("transport stopped with the send in flight"));
  }
  link.CloseReady();
  if (s.phase == LinkState::Phase::kOpen) SendFins(link);
}

void Engine::Impl::SendNow(Link& link, const std::vector<int32_t>& peers, Outgoing out,
                           SendCallback done) {
  LinkState& s = *link.state;
  if (s.closing || s.phase != LinkState::Phase::kOpen) {
    Complete(done, Cancelled("transport stopped"));
    return;
  }
  for (int32_t peer : peers) {
    if (s.fin_from[peer]) {
      Complete(done, Unavailable("peer " + std::to_string(peer) + " has stopped its transport"));
      return;
    }
  }
  PendingSend op;
  op.done = std::move(done);
  Status error;
  for (int32_t peer : peers) {
    MPI_Request r;
    int rc = MPI_Isend(out.envelope.data(), static_cast<int>(out.envelope.size()), MPI_BYTE, peer,
                       kTagEnvelope, s.comm, &r);
    if (rc != MPI_SUCCESS) {
      error = Internal(MpiError(rc, "MPI_Isend(envelope)"));
      break;
    }
    op.requests.push_back(r);
    for (const Buffer& seg : out.segments) {
      for (uint64_t off = 0; off < seg.size() && error.ok(); off += out.chunk_bytes) {
        const int len = static_cast<int>(std::min(out.chunk_bytes, seg.size() - off));
        rc = MPI_Isend(seg.data() + off, len, MPI_BYTE, peer, kTagData, s.comm, &r);
        if (rc != MPI_SUCCESS) {
          error = Internal(MpiError(rc, "MPI_Isend(data)"));
          break;
        }
        op.requests.push_back(r);
      }
    }
    if (!error.ok()) break;
  }
  op.keep.push_back(std::move(out.envelope));
  for (auto& seg : out.segments) op.keep.push_back(std::move(seg));
  if (!error.ok()) Complete(op.done, error);
  s.sends.push_back(std::move(op));
}

bool Engine::Impl::Drained(const LinkState& s, int32_t world) const {
  return s.closing && s.fins_sent && s.fins >= world - 1 && s.sends.empty() &&
         s.active_total == 0 && s.matched_total == 0;
}

void Engine::Impl::Reap() {
  for (auto it = links.begin(); it != links.end();) {
    LinkState& s = *(*it)->state;
    const bool failed = s.phase == LinkState::Phase::kFailed;
    if (!failed &&
        !(s.phase == LinkState::Phase::kOpen && Drained(s, (*it)->config().world_size))) {
      ++it;
      continue;
    }
    if (s.comm != MPI_COMM_NULL) MPI_Comm_free(&s.comm);
    open_waiters.erase(it->get());
    it = links.erase(it);
  }
}

// ---------------------------------------------------------------------------

namespace {

Engine* g_engine = nullptr;
Status g_engine_status;
std::once_flag g_engine_once;

}  // namespace

Result<Engine*> Engine::Get() {
  std::call_once(g_engine_once, [] {
    auto* engine = new Engine();  // lives until exit; the thread finalizes MPI
    engine->impl_ = new Impl();
    auto init = std::make_shared<std::promise<Status>>();
    auto ready = init->get_future();
    Impl* impl = engine->impl_;
    impl->thread = std::thread([impl, init, engine] {
      impl->Run(init.get(), &engine->world_rank_, &engine->world_size_);
    });
    g_engine_status = ready.get();
    if (!g_engine_status.ok()) {
      impl->thread.join();
      return;
    }
    g_engine = engine;
    std::atexit([] {
      Impl* impl = g_engine->impl_;
      {
        std::lock_guard<std::mutex> lock(impl->mu);
        impl->shutdown = true;
      }
      impl->cv.notify_all();
      if (impl->thread.joinable()) impl->thread.join();
    });
  });
  if (!g_engine_status.ok()) return g_engine_status;
  return g_engine;
}

bool Engine::Initialized() { return g_initialized.load(); }

bool Engine::OnEngineThread() const {
  return impl_->thread_id.load() == std::this_thread::get_id();
}

Result<std::shared_ptr<Link>> Engine::Open(LinkConfig config, Duration timeout) {
  auto link = std::make_shared<Link>(std::move(config));
  link->state = std::make_unique<LinkState>();
  auto waiter = std::make_shared<OpenWaiter>();
  Impl* impl = impl_;
  if (!impl->Post([impl, link, waiter] { impl->OpenLink(link, waiter); })) {
    return Unavailable("the MPI engine has shut down (process exiting)");
  }
  std::unique_lock<std::mutex> lock(waiter->mu);
  if (!waiter->cv.wait_for(lock, timeout, [&] { return waiter->done; })) {
    lock.unlock();
    impl->Post([impl, link] { impl->CloseLink(*link); });
    return Unavailable("not every rank opened an MPI transport within " +
                       std::to_string(timeout.count()) +
                       " ms (each rank must Start its transports in the same order)");
  }
  if (!waiter->status.ok()) return waiter->status;
  return link;
}

void Engine::Send(const std::shared_ptr<Link>& link, std::vector<int32_t> peers, Outgoing out,
                  SendCallback done) {
  Impl* impl = impl_;
  auto shared_done = std::make_shared<SendCallback>(std::move(done));
  bool posted = impl->Post(
      [impl, link, peers = std::move(peers), out = std::move(out), shared_done]() mutable {
        impl->SendNow(*link, peers, std::move(out), std::move(*shared_done));
      });
  if (!posted) (*shared_done)(Cancelled("the MPI engine has shut down (process exiting)"));
}

void Engine::Close(const std::shared_ptr<Link>& link) {
  Impl* impl = impl_;
  if (OnEngineThread()) {
    impl->CloseLink(*link);
    impl->FireCompletions();
    return;
  }
  auto done = std::make_shared<std::promise<void>>();
  auto closed = done->get_future();
  if (!impl->Post([impl, link, done] {
        impl->CloseLink(*link);
        impl->FireCompletions();
        done->set_value();
      })) {
    return;
  }
  closed.wait();
}

}  // namespace xsilo::mpi
