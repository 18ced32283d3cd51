// The progress thread, request helpers and endpoint bookkeeping of the ucx
// connector (see ucx_worker.h; server side in ucx_server.cpp, client side in
// ucx_client.cpp).
#include "store/ucx/ucx_worker.h"

#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <future>

#include "store/ucx/ucx_internal.h"

namespace xsilo::ucx {

namespace {

struct RequestContext {
  std::function<void(ucs_status_t)> done;
};

void OnSendDone(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<RequestContext*>(user_data);
  ucp_request_free(request);
  ctx->done(status);
  delete ctx;
}

void OnRecvDone(void* request, ucs_status_t status, size_t /*length*/, void* user_data) {
  OnSendDone(request, status, user_data);
}

// Completes `ctx` now when the operation finished (or failed) in place;
// otherwise its callback will.
void Track(ucs_status_ptr_t p, RequestContext* ctx) {
  if (p == nullptr || UCS_PTR_IS_ERR(p)) {
    ctx->done(p == nullptr ? UCS_OK : UCS_PTR_STATUS(p));
    delete ctx;
  }
}

}  // namespace

std::string StatusText(ucs_status_t status) { return ucs_status_string(status); }

Result<SocketAddress> ResolveAddress(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Unavailable("ucx: cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  SocketAddress out;
  std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
  out.length = found->ai_addrlen;
  freeaddrinfo(found);
  return out;
}

Result<std::pair<std::string, int>> SplitAddress(const std::string& address) {
  auto colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgument("ucx address '" + address + "' is not host:port");
  }
  const char* begin = address.data() + colon + 1;
  const char* end = address.data() + address.size();
  auto [p, ec] = std::from_chars(begin, end, port);
  if (ec != std::errc() || p != end || port < 1 || port > 65535) {
    return InvalidArgument("ucx address '" + address + "' has no valid port");
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, port);
}

Worker::Worker(WorkerOptions options, std::shared_ptr<ObjectTable> table)
    : options_(std::move(options)), table_(std::move(table)) {}

Result<std::unique_ptr<Worker>> Worker::Start(const WorkerOptions& options,
                                              std::shared_ptr<ObjectTable> table) {
  std::unique_ptr<Worker> w(new Worker(options, std::move(table)));
  w->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (w->wake_fd_ < 0) return Internal(std::string("ucx: eventfd: ") + std::strerror(errno));
  // UCX ties a worker to the thread that creates it: the progress thread
  // creates it, and owns it from then on.
  std::promise<Status> started;
  std::future<Status> ready = started.get_future();
  w->thread_ = std::thread([raw = w.get(), &started] {
    Status s = raw->Init();
    bool ok = s.ok();
    started.set_value(std::move(s));
    if (ok) raw->Loop();
  });
  Status s = ready.get();
  if (!s.ok()) {
    w->thread_.join();
    std::lock_guard<std::mutex> lock(w->mu_);
    w->stopping_ = true;
    return s;
  }
  return w;
}

Status Worker::Init() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return Internal("ucx: ucp_config_read: " + StatusText(st));
  if (!options_.tls.empty()) {
    st = ucp_config_modify(config, "TLS", options_.tls.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return InvalidArgument("ucx: transports tls='" + options_.tls + "': " + StatusText(st));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return Unavailable("ucx: ucp_init: " + StatusText(st));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) {
    ucp_cleanup(context_);
    context_ = nullptr;
    return Unavailable("ucx: ucp_worker_create: " + StatusText(st));
  }
  scratch_.resize(1u << 20);
  return Status::OK();
}

Worker::~Worker() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

bool Worker::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    tasks_.push_back(std::move(task));
  }
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;
  return true;
}

void Worker::RunTasks() {
  std::deque<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(tasks_);
  }
  for (auto& task : batch) task();
}

void Worker::Loop() {
  int ucx_fd = -1;
  bool can_sleep = ucp_worker_get_efd(worker_, &ucx_fd) == UCS_OK;
  while (!stopped_) {
    RunTasks();
    if (stopped_) break;
    if (!retiring_.empty()) CloseRetired(false);
    if (ucp_worker_progress(worker_) != 0) continue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!tasks_.empty()) continue;
    }
    ucs_status_t st = can_sleep ? ucp_worker_arm(worker_) : UCS_ERR_UNSUPPORTED;
    if (st == UCS_ERR_BUSY) continue;
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {ucx_fd, POLLIN, 0}};
    // Without a UCX event fd the loop polls UCX every millisecond.
    poll(fds, st == UCS_OK ? 2 : 1, st == UCS_OK ? 100 : 1);
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      ssize_t n = read(wake_fd_, &v, sizeof(v));
      (void)n;
    }
  }
  Shutdown();
}

void Worker::Stop() {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      first = true;
      tasks_.push_back([this] { stopped_ = true; });
    }
  }
  if (first) {
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
  }
  std::lock_guard<std::mutex> lock(join_mu_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void Worker::Shutdown() {
  if (listener_) {
    ucp_listener_destroy(listener_);
    listener_ = nullptr;
  }
  std::vector<std::shared_ptr<Conn>> all(conns_.begin(), conns_.end());
  for (auto& c : all) CloseConn(c, "the ucx connector closed");
  CloseRetired(true);
  // Force-closed endpoints complete quickly; bounded anyway.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!conns_.empty() && std::chrono::steady_clock::now() < deadline) {
    RunTasks();
    CloseRetired(true);
    ucp_worker_progress(worker_);
  }
  RunTasks();
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
  worker_ = nullptr;
  context_ = nullptr;
}

Result<int> Worker::Listen(const std::string& host, int port) {
  XSILO_ASSIGN_OR_RETURN(SocketAddress addr, ResolveAddress(host, port));
  auto promise = std::make_shared<std::promise<Result<int>>>();
  auto future = promise->get_future();
  bool posted = Post([this, addr, promise, host] {
    if (stopped_) {
      promise->set_value(Unavailable("ucx connector closed"));
      return;
    }
    if (listener_) {
      promise->set_value(FailedPrecondition("ucx: already listening"));
      return;
    }
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr.storage);
    params.sockaddr.addrlen = addr.length;
    params.conn_handler.cb = &Worker::OnConnRequest;
    params.conn_handler.arg = this;
    ucs_status_t st = ucp_listener_create(worker_, &params, &listener_);
    if (st != UCS_OK) {
      listener_ = nullptr;
      promise->set_value(Unavailable("ucx: cannot listen on " + host + ":" +
                                     std::to_string(addr.port()) + ": " + StatusText(st)));
      return;
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    st = ucp_listener_query(listener_, &attr);
    if (st != UCS_OK) {
      promise->set_value(Internal("ucx: ucp_listener_query: " + StatusText(st)));
      return;
    }
    SocketAddress bound;
    std::memcpy(&bound.storage, &attr.sockaddr, sizeof(attr.sockaddr));
    promise->set_value(bound.port());
  });
  if (!posted) return Unavailable("ucx connector closed");
  if (future.wait_for(options_.timeout) != std::future_status::ready) {
    return Unavailable("ucx: the progress thread did not answer within the timeout");
  }
  return future.get();
}

void Worker::Send(const std::shared_ptr<Conn>& conn, const void* data, size_t size, Done done) {
  if (!conn->ep) return done(UCS_ERR_CANCELED);
  auto* ctx = new RequestContext{std::move(done)};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = OnSendDone;
  p.user_data = ctx;
  Track(ucp_stream_send_nbx(conn->ep, data, size, &p), ctx);
}

void Worker::Recv(const std::shared_ptr<Conn>& conn, void* data, size_t size, Done done) {
  if (!conn->ep) return done(UCS_ERR_CANCELED);
  auto* ctx = new RequestContext{std::move(done)};
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_STREAM_RECV_FLAG_WAITALL;
  p.cb.recv_stream = OnRecvDone;
  p.user_data = ctx;
  size_t length = 0;
  Track(ucp_stream_recv_nbx(conn->ep, data, size, &length, &p), ctx);
}

void Worker::SendBody(const std::shared_ptr<Conn>& conn, const GatherList& bytes,
                      std::function<void()> progress, Done done) {
  struct State {
    int pending = 1;
    bool failed = false;
    std::function<void()> progress;
    Done done;
    GatherList keep;  // the bytes stay alive until the last piece is sent
  };
  auto s = std::make_shared<State>();
  s->progress = std::move(progress);
  s->done = std::move(done);
  s->keep = bytes;
  auto piece_done = [s](ucs_status_t st) {
    if (s->failed) return;
    if (st != UCS_OK) {
      s->failed = true;
      s->done(st);
    } else if (--s->pending == 0) {
      s->done(UCS_OK);
    } else if (s->progress) {
      s->progress();
    }
  };
  for (const Buffer& seg : s->keep.segments) {
    for (uint64_t off = 0; off < seg.size() && !s->failed;) {
      uint64_t n = std::min(options_.chunk_bytes, seg.size() - off);
      ++s->pending;
      Send(conn, seg.data() + off, n, piece_done);
      off += n;
    }
  }
  piece_done(UCS_OK);
}

void Worker::RecvBody(const std::shared_ptr<Conn>& conn, uint8_t* out, uint64_t size,
                      std::function<void()> progress, Done done) {
  if (size == 0) return done(UCS_OK);
  uint64_t n = std::min(options_.chunk_bytes, size);
  Recv(conn, out, n, [this, conn, out, size, n, progress, done](ucs_status_t st) {
    if (st != UCS_OK) return done(st);
    if (progress) progress();
    RecvBody(conn, out + n, size - n, progress, done);
  });
}

std::shared_ptr<Worker::Conn> Worker::NewConn(std::string address) {
  auto conn = std::make_shared<Conn>();
  conn->worker = this;
  conn->address = std::move(address);
  conns_.insert(conn);
  return conn;
}

void Worker::OnEpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* raw = static_cast<Conn*>(arg);
  Worker* self = raw->worker;
  // Close outside the progress call that reported the error.
  std::shared_ptr<Conn> conn = raw->shared_from_this();
  std::lock_guard<std::mutex> lock(self->mu_);
  self->tasks_.push_back([self, conn, status] {
    self->CloseConn(conn, "ucx connection to " + conn->address + " failed: " + StatusText(status));
  });
}

void Worker::CloseConn(const std::shared_ptr<Conn>& conn, const std::string& why) {
  if (!conn->ep) {
    if (!conn->closing && !conn->retired_ep) conns_.erase(conn);
    return;
  }
  ucp_ep_h ep = conn->ep;
  conn->ep = nullptr;
  auto idle = idle_.find(conn->address);
  if (idle != idle_.end()) std::erase(idle->second, conn);
  std::shared_ptr<ClientCall> call = conn->call.lock();
  conn->call.reset();
  // Closing is deferred: this may run inside a request callback that UCX
  // fires while it marks the endpoint failed (ucp_ep_set_failed), and UCX
  // 1.13 touches an endpoint closed there after freeing it. A failed peer's
  // connection-manager lane may also report its failure a little later.
  conn->retired_ep = ep;
  retiring_.emplace_back(std::chrono::steady_clock::now() + kRetireGrace, conn);
  if (call) FinishCall(call, Unavailable(why));
}

void Worker::DestroyEp(const std::shared_ptr<Conn>& conn, ucp_ep_h ep) {
  conn->closing = true;
  conn->retired_ep = nullptr;
  auto* ctx = new RequestContext{[this, conn](ucs_status_t) {
    conn->closing = false;
    conns_.erase(conn);
  }};
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  p.cb.send = OnSendDone;
  p.user_data = ctx;
  Track(ucp_ep_close_nbx(ep, &p), ctx);
}

void Worker::CloseRetired(bool all) {
  auto now = std::chrono::steady_clock::now();
  while (!retiring_.empty() && (all || retiring_.front().first <= now)) {
    std::shared_ptr<Conn> conn = std::move(retiring_.front().second);
    retiring_.pop_front();
    if (conn->retired_ep) DestroyEp(conn, conn->retired_ep);
  }
}

}  // namespace xsilo::ucx
