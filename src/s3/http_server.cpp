#include "s3/http_server.h"
#include "s3/http_parse.h"

#include "s3/crypto.h"
#include "s3/tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>

namespace xsilo::s3 {

const std::string* HttpRequest::Header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers) {
    if (k == lower_name) return &v;
  }
  return nullptr;
}

void HttpResponse::ClearFile() {
  file_fd = -1;
  file_offset = file_length = 0;
  file_owner.reset();
}

void HttpResponse::SetBody(std::string text) {
  ClearFile();
  body.clear();
  if (!text.empty()) body.push_back(Buffer::CopyFrom(text));
  content_length = text.size();
}

void HttpResponse::SetBody(std::vector<Buffer> segments) {
  ClearFile();
  body = std::move(segments);
  content_length = 0;
  for (const Buffer& b : body) content_length += b.size();
}

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

bool IsTokenChar(unsigned char c) {
  return std::isalnum(c) || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

// A write to a peer that hung up raises SIGPIPE where the call has no
// MSG_NOSIGNAL (sendfile, OpenSSL's writes), which would kill the process.
// Worker threads block it (WorkerLoop), so it stays pending on the thread;
// this takes it back.
void DrainSigpipe() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  const timespec zero{0, 0};
  while (::sigtimedwait(&pipe, nullptr, &zero) < 0 && errno == EINTR) {
  }
}

// One write of a TLS session, whole (SSL_MODE_AUTO_RETRY, blocking socket).
bool TlsWrite(SSL* ssl, const void* data, size_t n) {
  while (n > 0) {
    const int chunk = static_cast<int>(std::min<size_t>(n, 1 << 30));
    const int w = SSL_write(ssl, data, chunk);
    if (w <= 0) {
      DrainSigpipe();
      return false;
    }
    data = static_cast<const char*>(data) + w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Writes the whole iovec list; false when the peer is gone or a send timed out.
bool SendAll(const Link& link, std::vector<iovec>& iov) {
  if (link.ssl != nullptr) {
    // Small pieces (the response head) go out with the bytes after them
    // instead of in a TLS record of their own.
    std::string small;
    for (const iovec& v : iov) {
      if (v.iov_len < 16384) {
        small.append(static_cast<const char*>(v.iov_base), v.iov_len);
        continue;
      }
      if (!small.empty() && !TlsWrite(link.ssl, small.data(), small.size())) return false;
      small.clear();
      if (!TlsWrite(link.ssl, v.iov_base, v.iov_len)) return false;
    }
    return small.empty() || TlsWrite(link.ssl, small.data(), small.size());
  }
  const int fd = link.fd;
  size_t first = 0;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t left = static_cast<size_t>(n);
    while (left > 0 && first < iov.size()) {
      size_t take = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      left -= take;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return true;
}

// Sends n bytes of `file` from `offset`. Plain: sendfile(2), the kernel moves
// page references to the socket and nothing passes through user space. TLS:
// read and encrypted 1 MiB at a time. False on an error, a timeout (the
// socket's send timeout) or a file shorter than promised.
bool SendFile(const Link& link, int file, uint64_t offset, uint64_t n) {
  if (link.ssl != nullptr) {
    std::vector<char> buf(std::min<uint64_t>(n, 1 << 20));
    while (n > 0) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
      const ssize_t r = ::pread(file, buf.data(), want, static_cast<off_t>(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0 || !TlsWrite(link.ssl, buf.data(), static_cast<size_t>(r))) return false;
      offset += static_cast<uint64_t>(r);
      n -= static_cast<uint64_t>(r);
    }
    return true;
  }
  off_t off = static_cast<off_t>(offset);
  while (n > 0) {
    ssize_t w =
        ::sendfile(link.fd, file, &off, static_cast<size_t>(std::min<uint64_t>(n, 1ull << 30)));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EPIPE) DrainSigpipe();
    if (w <= 0) return false;
    n -= static_cast<uint64_t>(w);
  }
  return true;
}

bool SendString(const Link& link, std::string_view s) {
  std::vector<iovec> iov{{const_cast<char*>(s.data()), s.size()}};
  return SendAll(link, iov);
}

// One read: <= 0 on EOF, error or timeout.
ssize_t Recv(const Link& link, void* dst, size_t n) {
  if (link.ssl != nullptr) {
    const int r = SSL_read(link.ssl, dst, static_cast<int>(std::min<size_t>(n, 1 << 30)));
    return r > 0 ? r : (SSL_get_error(link.ssl, r) == SSL_ERROR_ZERO_RETURN ? 0 : -1);
  }
  ssize_t got;
  do {
    got = ::recv(link.fd, dst, n, 0);
  } while (got < 0 && errno == EINTR);
  return got;
}

// Buffered reader over one connection's socket.
struct Conn {
  Link link;
  std::string buf;
  size_t start = 0;  // unread bytes are buf[start, buf.size())

  size_t buffered() const { return buf.size() - start; }
  void Compact() {
    if (start > 0) {
      buf.erase(0, start);
      start = 0;
    }
  }
  // Appends what one recv returns; <= 0 on EOF/error/timeout.
  ssize_t Fill() {
    Compact();
    size_t old = buf.size();
    buf.resize(old + 16384);
    ssize_t n = Recv(link, buf.data() + old, 16384);
    buf.resize(old + std::max<ssize_t>(n, 0));
    return n;
  }
};

class ConnBodyReader : public BodyReader {
 public:
  ConnBodyReader(Conn& conn, const HttpRequest& req, bool expect_continue, uint64_t max_line_bytes)
      : conn_(conn),
        chunked_(req.chunked),
        remaining_(req.has_content_length ? req.content_length : 0),
        expect_continue_(expect_continue),
        max_line_bytes_(max_line_bytes) {}

  bool pending() const override { return chunked_ ? !chunked_done_ : remaining_ > 0; }

  Result<Buffer> ReadAll(uint64_t limit, const Observer& observe) override {
    XSILO_RETURN_IF_ERROR(SendContinue());
    if (chunked_) return ReadChunked(limit, observe);
    if (remaining_ > limit) {
      return ResourceExhausted("body of " + std::to_string(remaining_) + " bytes exceeds " +
                               std::to_string(limit));
    }
    XSILO_ASSIGN_OR_RETURN(Buffer b, Buffer::Allocate(remaining_));
    XSILO_RETURN_IF_ERROR(ReadExact(b.mutable_data(), b.size(), observe));
    remaining_ = 0;
    return b;
  }

 private:
  Status SendContinue() {
    if (!expect_continue_) return Status::OK();
    expect_continue_ = false;
    if (!SendString(conn_.link, "HTTP/1.1 100 Continue\r\n\r\n")) {
      return Unavailable("connection lost sending 100 Continue");
    }
    return Status::OK();
  }

  // n bytes into dst: what is buffered first, then straight from the socket.
  Status ReadExact(uint8_t* dst, uint64_t n, const Observer& observe) {
    uint64_t from_buf = std::min<uint64_t>(n, conn_.buffered());
    if (from_buf > 0) {
      std::memcpy(dst, conn_.buf.data() + conn_.start, from_buf);
      conn_.start += from_buf;
      if (observe) observe(dst, from_buf);
      dst += from_buf;
      n -= from_buf;
    }
    while (n > 0) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(n, 1ull << 30));
      ssize_t got = Recv(conn_.link, dst, want);
      if (got <= 0) {
        return Unavailable(got == 0 ? "connection closed mid-body"
                                    : "body read failed or timed out");
      }
      if (observe) observe(dst, static_cast<size_t>(got));
      dst += got;
      n -= got;
    }
    return Status::OK();
  }

  // One CRLF-terminated line of the chunked framing, without the CRLF.
  Result<std::string> ReadLine() {
    for (;;) {
      std::string_view unread(conn_.buf.data() + conn_.start, conn_.buffered());
      size_t eol = unread.find("\r\n");
      if (eol != std::string_view::npos) {
        if (eol > max_line_bytes_) break;
        std::string line(unread.substr(0, eol));
        conn_.start += eol + 2;
        return line;
      }
      if (conn_.buffered() > max_line_bytes_) break;
      if (conn_.Fill() <= 0) return Unavailable("connection closed in a chunked body");
    }
    return InvalidArgument("chunked body: line too long");
  }

  // Transfer-Encoding: chunked (RFC 9112 7.1): chunk sizes in hex, chunk
  // extensions ignored, trailer fields read and dropped.
  Result<Buffer> ReadChunked(uint64_t limit, const Observer& observe) {
    constexpr uint64_t kBlock = 8ull << 20;
    std::vector<Buffer> blocks;
    uint64_t used = 0;   // bytes in the last block
    uint64_t total = 0;  // bytes of body decoded
    for (;;) {
      XSILO_ASSIGN_OR_RETURN(std::string line, ReadLine());
      std::string_view digits(line);
      if (size_t semi = digits.find(';'); semi != std::string_view::npos) {
        digits = digits.substr(0, semi);
      }
      while (!digits.empty() && (digits.back() == ' ' || digits.back() == '\t')) {
        digits.remove_suffix(1);
      }
      if (digits.empty() || digits.size() > 15) return InvalidArgument("chunked body: bad size");
      uint64_t n = 0;
      for (char ch : digits) {
        int v = HexValue(ch);
        if (v < 0) return InvalidArgument("chunked body: size is not hex");
        n = n * 16 + static_cast<uint64_t>(v);
      }
      if (n == 0) break;
      if (n > limit - total) {
        return ResourceExhausted("chunked body exceeds " + std::to_string(limit) + " bytes");
      }
      while (n > 0) {
        if (blocks.empty() || used == blocks.back().size()) {
          XSILO_ASSIGN_OR_RETURN(Buffer b,
                                 Buffer::Allocate(std::min(std::max(n, kBlock), limit - total)));
          blocks.push_back(std::move(b));
          used = 0;
        }
        uint64_t take = std::min(n, blocks.back().size() - used);
        XSILO_RETURN_IF_ERROR(ReadExact(blocks.back().mutable_data() + used, take, observe));
        used += take;
        total += take;
        n -= take;
      }
      XSILO_ASSIGN_OR_RETURN(std::string end, ReadLine());
      if (!end.empty()) return InvalidArgument("chunked body: chunk longer than its size");
    }
    for (size_t fields = 0;; ++fields) {  // trailer section, then an empty line
      XSILO_ASSIGN_OR_RETURN(std::string line, ReadLine());
      if (line.empty()) break;
      if (fields == 64) return InvalidArgument("chunked body: too many trailer fields");
    }
    chunked_done_ = true;
    if (blocks.empty()) return Buffer();
    if (blocks.size() == 1) return blocks.front().SliceUnchecked(0, used);
    XSILO_ASSIGN_OR_RETURN(Buffer joined, Buffer::Allocate(total));
    uint64_t at = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      uint64_t len = i + 1 == blocks.size() ? used : blocks[i].size();
      std::memcpy(joined.mutable_data() + at, blocks[i].data(), len);
      at += len;
    }
    return joined;
  }

  Conn& conn_;
  const bool chunked_;
  bool chunked_done_ = false;
  uint64_t remaining_;
  bool expect_continue_;
  const uint64_t max_line_bytes_;
};

}  // namespace

ParseResult ParseHead(std::string_view head, HttpRequest* req, std::string* why) {
  size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || sp1 == 0) {
    *why = "malformed request line";
    return ParseResult::kBad;
  }
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (!std::all_of(method.begin(), method.end(), [](unsigned char c) { return IsTokenChar(c); })) {
    *why = "malformed method";
    return ParseResult::kBad;
  }
  if (target.empty() || target[0] != '/' ||
      std::any_of(target.begin(), target.end(),
                  [](unsigned char c) { return c <= 0x20 || c == 0x7f; })) {
    *why = "malformed request target";
    return ParseResult::kBad;
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    *why = "unsupported HTTP version";
    return ParseResult::kBad;
  }
  req->method = method;
  req->target = target;
  size_t q = target.find('?');
  req->raw_path = target.substr(0, q);
  req->raw_query = q == std::string_view::npos ? std::string() : std::string(target.substr(q + 1));
  req->keep_alive = version == "HTTP/1.1";

  std::string_view rest = eol == std::string_view::npos ? std::string_view() : head.substr(eol + 2);
  while (!rest.empty()) {
    size_t e = rest.find("\r\n");
    std::string_view h = rest.substr(0, e);
    rest = e == std::string_view::npos ? std::string_view() : rest.substr(e + 2);
    if (h.empty()) break;
    size_t colon = h.find(':');
    if (colon == std::string_view::npos || colon == 0 ||
        !std::all_of(h.begin(), h.begin() + colon,
                     [](unsigned char c) { return IsTokenChar(c); })) {
      *why = "malformed header line";
      return ParseResult::kBad;
    }
    std::string name(h.substr(0, colon));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    std::string_view value = TrimOws(h.substr(colon + 1));
    if (std::any_of(value.begin(), value.end(),
                    [](unsigned char c) { return c == '\r' || c == '\n' || c == 0; })) {
      *why = "malformed header value";
      return ParseResult::kBad;
    }
    if (name == "content-length") {
      if (value.empty() || value.size() > 19 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        *why = "malformed Content-Length";
        return ParseResult::kBad;
      }
      uint64_t len = std::stoull(std::string(value));
      if (req->has_content_length && len != req->content_length) {
        *why = "conflicting Content-Length headers";
        return ParseResult::kBad;
      }
      req->has_content_length = true;
      req->content_length = len;
    } else if (name == "connection") {
      std::string v(value);
      std::transform(v.begin(), v.end(), v.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      if (v.find("close") != std::string::npos) req->keep_alive = false;
      if (v.find("keep-alive") != std::string::npos) req->keep_alive = true;
    }
    req->headers.emplace_back(std::move(name), std::string(value));
  }
  return ParseResult::kOk;
}

namespace {

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
  listen_fd_ = wake_fd_ = -1;
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

void HttpServer::WorkerLoop() {
  // SendFile's SIGPIPE must not reach the process (see there).
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
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

}  // namespace xsilo::s3
