#include "net/http_server.h"

#include "net/http_conn.h"
#include "net/http_parse.h"
#include "net/sigpipe.h"
#include "net/tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace xsilo::net {

namespace {

std::string_view Reason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 206:
      return "Partial Content";
    case 304:
      return "Not Modified";
    case 400:
      return "Bad Request";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 412:
      return "Precondition Failed";
    case 413:
      return "Payload Too Large";
    case 416:
      return "Range Not Satisfiable";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

void SetSocketTimeouts(int fd, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = t.count() / 1000;
  tv.tv_usec = (t.count() % 1000) * 1000;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : options_(std::move(options)), handler_(std::move(handler)) {}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Start() {
  if (listen_fd_ >= 0) return FailedPrecondition("HTTP server already started");
  if (options_.max_connections < 1) return InvalidArgument("max_connections must be >= 1");
  in_addr addr4{};
  if (::inet_pton(AF_INET, options_.host.c_str(), &addr4) != 1) {
    return InvalidArgument("host must be an IPv4 address: " + options_.host);
  }
  if (options_.port < 0 || options_.port > 65535) return InvalidArgument("bad port");
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Internal(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr = addr4;
  sa.sin_port = htons(static_cast<uint16_t>(options_.port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    int e = errno;
    ::close(fd);
    return Unavailable("bind " + options_.host + ":" + std::to_string(options_.port) + ": " +
                       std::strerror(e));
  }
  if (::listen(fd, 512) != 0) {
    int e = errno;
    ::close(fd);
    return Internal(std::string("listen: ") + std::strerror(e));
  }
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  port_ = ntohs(sa.sin_port);
  listen_fd_ = fd;
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  stopping_ = false;
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return Status::OK();
}

void HttpServer::Stop() {
  if (listen_fd_ < 0) return;
  stopping_ = true;
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : active_fds_) ::shutdown(fd, SHUT_RDWR);
    for (int fd : queue_) CloseLocked(fd);
    queue_.clear();
    for (const auto& parked : parked_) CloseLocked(parked.first);
    parked_.clear();
    workers.swap(workers_);
  }
  cv_.notify_all();
  for (auto& t : workers) t.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
  if (spare_fd_ >= 0) ::close(spare_fd_);
  listen_fd_ = wake_fd_ = spare_fd_ = -1;
}

void HttpServer::Dispatch(int fd) {
  queue_.push_back(fd);
  if (idle_workers_ < static_cast<int>(queue_.size()) &&
      static_cast<int>(workers_.size()) < options_.max_connections) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
  cv_.notify_one();
}

void HttpServer::AcceptLoop() {
  using Clock = std::chrono::steady_clock;
  std::vector<pollfd> fds;
  while (!stopping_) {
    fds.assign({{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}});
    int timeout_ms = -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = Clock::now();
      for (const auto& [fd, since] : parked_) {
        fds.push_back({fd, POLLIN, 0});
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        since + options_.idle_timeout - now)
                        .count();
        left = std::max<int64_t>(left, 0) + 1;
        if (timeout_ms < 0 || left < timeout_ms) timeout_ms = static_cast<int>(left);
      }
    }
    int r = ::poll(fds.data(), fds.size(), timeout_ms);
    if (r < 0 && errno != EINTR) break;
    if (stopping_) break;
    if (r > 0 && (fds[1].revents & POLLIN)) {
      uint64_t drained;
      (void)!::read(wake_fd_, &drained, sizeof(drained));
    }
    const auto now = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    // The first fds.size() - 2 parked entries are the ones polled.
    const size_t polled = fds.size() - 2;
    std::vector<std::pair<int, Clock::time_point>> still;
    for (size_t i = 0; i < parked_.size(); ++i) {
      auto [fd, since] = parked_[i];
      if (i < polled && (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR))) {
        Dispatch(fd);  // a request (or the peer's close) arrived
      } else if (i < polled && now - since >= options_.idle_timeout) {
        CloseLocked(fd);  // keep-alive idle limit
      } else {
        still.emplace_back(fd, since);
      }
    }
    parked_.swap(still);
    if (r <= 0 || !(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
      // Out of descriptors: the pending connection would stay in the
      // kernel's queue unanswered (and the listener readable, so this loop
      // would spin). Its client gets a 503 through the spare descriptor
      // kept for this, and the connection is closed.
      lock.unlock();
      RefuseWithSpareDescriptor();
      continue;
    }
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    SetSocketTimeouts(fd, options_.io_timeout);
    if (static_cast<int>(queue_.size() + parked_.size()) >= options_.max_queued_connections) {
      lock.unlock();
      if (!options_.tls) {  // a TLS client could not read it before a handshake
        SendString(Link{fd, nullptr},
                   "HTTP/1.1 503 Service Unavailable\r\nContent-Length: "
                   "0\r\nConnection: close\r\n\r\n");
      }
      ::close(fd);
      continue;
    }
    if (options_.tls) {
      // The handshake runs in the worker, on the connection's first read.
      SSL* ssl = SSL_new(options_.tls->ctx());
      if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
        SSL_free(ssl);
        ::close(fd);
        continue;
      }
      SSL_set_accept_state(ssl);
      tls_sessions_[fd] = ssl;
    }
    parked_.emplace_back(fd, now);  // a worker takes it when its first request arrives
  }
}

void HttpServer::RefuseWithSpareDescriptor() {
  if (spare_fd_ < 0) {  // lost (another thread took the descriptor): wait for one
    spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (spare_fd_ < 0) {
      pollfd wake{wake_fd_, POLLIN, 0};
      ::poll(&wake, 1, 10);
      return;
    }
  }
  ::close(spare_fd_);
  spare_fd_ = -1;
  int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) {
    ++refused_no_descriptor_;
    if (!options_.tls) {
      SetSocketTimeouts(fd, std::chrono::milliseconds(1000));
      SendString(Link{fd, nullptr},
                 "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: "
                 "close\r\nRetry-After: 1\r\n\r\n");
    }
    ::close(fd);
  }
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void HttpServer::WorkerLoop() {
  // SendFile's SIGPIPE must not reach the process (see there).
  net::BlockSigpipe();
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    ++idle_workers_;
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    --idle_workers_;
    if (stopping_) return;
    int fd = queue_.front();
    queue_.pop_front();
    active_fds_.insert(fd);
    auto session = tls_sessions_.find(fd);
    const Link link{fd, session == tls_sessions_.end() ? nullptr : session->second};
    lock.unlock();
    const bool park = ServeConnection(link);
    lock.lock();
    active_fds_.erase(fd);
    if (park && !stopping_) {
      parked_.emplace_back(fd, std::chrono::steady_clock::now());
      uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof(one));
    } else {
      CloseLocked(fd);
    }
  }
}

void HttpServer::CloseLocked(int fd) {
  if (auto it = tls_sessions_.find(fd); it != tls_sessions_.end()) {
    SSL_free(it->second);
    tls_sessions_.erase(it);
  }
  ::close(fd);
}

bool HttpServer::ServeConnection(const Link& link) {
  const int fd = link.fd;
  Conn conn{link, {}, 0};
  auto send_error = [&](int status, std::string_view text) {
    std::pair<std::string, std::string> body{"text/plain", std::string(text) + "\n"};
    if (options_.format_error) body = options_.format_error(status, text);
    std::string head = "HTTP/1.1 " + std::to_string(status) + " " + std::string(Reason(status)) +
                       "\r\nContent-Type: " + body.first +
                       "\r\nContent-Length: " + std::to_string(body.second.size()) +
                       "\r\nConnection: close\r\n\r\n" + body.second;
    SendString(link, head);
  };
  // The acceptor hands over a connection with bytes (or EOF) to read.
  if (conn.Fill() <= 0) return false;
  while (!stopping_) {
    // Read until the end of the header block.
    size_t head_end;
    while (true) {
      std::string_view unread(conn.buf.data() + conn.start, conn.buffered());
      head_end = unread.find("\r\n\r\n");
      if (head_end != std::string_view::npos) break;
      if (conn.buffered() > options_.max_header_bytes) {
        send_error(431, "request header section too large");
        return false;
      }
      if (conn.Fill() <= 0) return false;
    }
    if (head_end > options_.max_header_bytes) {
      send_error(431, "request header section too large");
      return false;
    }
    HttpRequest req;
    std::string why;
    std::string_view head(conn.buf.data() + conn.start, head_end);
    ParseResult pr = ParseHead(head, &req, &why);
    conn.start += head_end + 4;
    if (pr != ParseResult::kOk) {
      send_error(400, why);
      return false;
    }
    if (const std::string* te = req.Header("transfer-encoding")) {
      // Only chunked, and never beside a Content-Length (a request that
      // frames its body two ways is how requests are smuggled).
      std::string lower = *te;
      for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (lower != "chunked") {
        send_error(501, "Transfer-Encoding other than chunked is not supported");
        return false;
      }
      if (req.has_content_length) {
        send_error(400, "both Transfer-Encoding and Content-Length");
        return false;
      }
      req.chunked = true;
    }
    const std::string* expect = req.Header("expect");
    bool expect_continue =
        expect != nullptr && (*expect == "100-continue" || *expect == "100-Continue");
    ConnBodyReader body(conn, req, expect_continue, options_.max_header_bytes);

    HttpResponse resp;
    handler_(req, body, &resp);

    if (!resp.omit_body) {
      resp.content_length = resp.file_fd >= 0 ? resp.file_length : 0;
      for (const Buffer& b : resp.body) resp.content_length += b.size();
    }
    bool close = resp.close || !req.keep_alive || body.pending() || stopping_;
    std::string out =
        "HTTP/1.1 " + std::to_string(resp.status) + " " + std::string(Reason(resp.status)) + "\r\n";
    for (const auto& [k, v] : resp.headers) {
      out += k;
      out += ": ";
      out += v;
      out += "\r\n";
    }
    out += "Content-Length: " + std::to_string(resp.content_length) + "\r\n";
    out += close ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";

    int64_t drop_after = -1;
    if (options_.drop_after_body_bytes && !resp.omit_body &&
        (!resp.body.empty() || resp.file_length > 0)) {
      drop_after = options_.drop_after_body_bytes(req);
    }
    std::vector<iovec> iov;
    iov.reserve(resp.body.size() + 1);
    iov.push_back({out.data(), out.size()});
    uint64_t budget = drop_after >= 0 ? static_cast<uint64_t>(drop_after) : UINT64_MAX;
    if (!resp.omit_body) {
      for (const Buffer& b : resp.body) {
        uint64_t n = std::min<uint64_t>(b.size(), budget);
        budget -= n;
        // Very large segments are split so each iovec length fits comfortably.
        const uint8_t* p = b.data();
        while (n > 0) {
          size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1ull << 30));
          iov.push_back({const_cast<uint8_t*>(p), chunk});
          p += chunk;
          n -= chunk;
        }
      }
    }
    if (!SendAll(link, iov)) return false;
    if (!resp.omit_body && resp.file_fd >= 0 &&
        !SendFile(link, resp.file_fd, resp.file_offset, std::min(resp.file_length, budget))) {
      return false;
    }
    if (drop_after >= 0) {
      ::shutdown(fd, SHUT_RDWR);
      return false;
    }
    if (close) {
      if (link.ssl != nullptr) SSL_shutdown(link.ssl);  // close_notify
      ::shutdown(fd, SHUT_WR);
      return false;
    }
    // Idle: park it until the next request (unless TLS holds bytes of one).
    if (conn.buffered() == 0 && (link.ssl == nullptr || SSL_pending(link.ssl) == 0)) return true;
  }
  return false;
}

}  // namespace xsilo::net
