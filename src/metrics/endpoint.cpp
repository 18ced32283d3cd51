#include "xsilo/metrics/endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace xsilo::metrics {

namespace {

constexpr size_t kMaxRequestBytes = 8192;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// Waits for `events` on fd or for the wake pipe; false on timeout or wake.
bool WaitFor(int fd, short events, int wake_fd, std::chrono::milliseconds timeout) {
  pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
  int n;
  do {
    n = ::poll(fds, 2, static_cast<int>(timeout.count()));
  } while (n < 0 && errno == EINTR);
  if (n <= 0 || (fds[1].revents & POLLIN)) return false;
  return (fds[0].revents & (events | POLLHUP | POLLERR)) != 0;
}

}  // namespace

struct MetricsEndpoint::Impl {
  const Registry& registry;
  EndpointOptions options;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  int port = 0;
  std::thread thread;
  std::once_flag stopped;

  Impl(const Registry& r, EndpointOptions o) : registry(r), options(std::move(o)) {}

  ~Impl() {
    for (int fd : {listen_fd, wake[0], wake[1]}) {
      if (fd >= 0) ::close(fd);
    }
  }

  void Serve() {
    for (;;) {
      pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
      int n = ::poll(fds, 2, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || (fds[1].revents & POLLIN)) return;
      if (!(fds[0].revents & POLLIN)) continue;
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) continue;
      Answer(fd);
      ::close(fd);
    }
  }

  bool SendAll(int fd, const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!WaitFor(fd, POLLOUT, wake[0], options.io_timeout)) return false;
      } else {
        return false;
      }
    }
    return true;
  }

  void Reply(int fd, const std::string& status, const std::string& content_type,
             const std::string& body, bool with_body) {
    std::string head = "HTTP/1.0 " + status + "\r\nContent-Type: " + content_type +
                       "\r\nContent-Length: " + std::to_string(body.size()) +
                       "\r\nConnection: close\r\n\r\n";
    SendAll(fd, with_body ? head + body : head);
  }

  void Answer(int fd) {
    std::string req;
    char buf[2048];
    while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos) {
      if (req.size() > kMaxRequestBytes) return;
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n > 0) {
        req.append(buf, static_cast<size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!WaitFor(fd, POLLIN, wake[0], options.io_timeout)) return;
      } else {
        return;  // closed before a whole request
      }
    }
    const std::string line = req.substr(0, req.find_first_of("\r\n"));
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
    const std::string method = line.substr(0, sp1);
    std::string target = sp1 == std::string::npos ? "" : line.substr(sp1 + 1, sp2 - sp1 - 1);
    target = target.substr(0, target.find('?'));
    const std::string text = "text/plain; charset=utf-8";
    if (method != "GET" && method != "HEAD") {
      Reply(fd, "405 Method Not Allowed", text, "only GET /metrics\n", true);
    } else if (target != "/metrics") {
      Reply(fd, "404 Not Found", text, "metrics are at /metrics\n", method == "GET");
    } else {
      Reply(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", registry.Render(),
            method == "GET");
    }
  }
};

Result<std::optional<int>> ParseMetricsPort(const std::string& text) {
  if (text.empty() || text == "0") return std::optional<int>();
  if (text == "auto") return std::optional<int>(0);
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || v < 1 || v > 65535) {
    return InvalidArgument("a metrics port is 1..65535, 0 (off) or 'auto', not '" + text + "'");
  }
  return std::optional<int>(static_cast<int>(v));
}

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const Registry& registry,
                                                                EndpointOptions options) {
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgument("metrics port " + std::to_string(options.port) + " is out of range");
  }
  auto impl = std::make_unique<Impl>(registry, std::move(options));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(impl->options.port));
  if (::inet_pton(AF_INET, impl->options.address.c_str(), &addr.sin_addr) != 1) {
    return InvalidArgument("metrics address '" + impl->options.address +
                           "' is not an IPv4 literal");
  }
  impl->listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (impl->listen_fd < 0) return Internal(Errno("metrics endpoint socket"));
  int one = 1;
  ::setsockopt(impl->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(impl->listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Unavailable(Errno("metrics endpoint bind " + impl->options.address + ":" +
                             std::to_string(impl->options.port)));
  }
  if (::listen(impl->listen_fd, 16) != 0) return Internal(Errno("metrics endpoint listen"));
  socklen_t len = sizeof addr;
  if (::getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Internal(Errno("metrics endpoint getsockname"));
  }
  impl->port = ntohs(addr.sin_port);
  if (::pipe2(impl->wake, O_CLOEXEC) != 0) return Internal(Errno("metrics endpoint pipe"));
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Serve(); });
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(impl)));
}

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsEndpoint::~MetricsEndpoint() { Stop(); }

int MetricsEndpoint::port() const { return impl_->port; }

std::string MetricsEndpoint::url() const {
  return "http://" + impl_->options.address + ":" + std::to_string(impl_->port) + "/metrics";
}

void MetricsEndpoint::Stop() {
  std::call_once(impl_->stopped, [this] {
    char c = 1;
    while (::write(impl_->wake[1], &c, 1) < 0 && errno == EINTR) {
    }
    if (impl_->thread.joinable()) impl_->thread.join();
    ::close(impl_->listen_fd);  // refuses later connections
    impl_->listen_fd = -1;
  });
}

}  // namespace xsilo::metrics
