// Echo server and echo round-trip probe inside netem sites.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>

#include "xsilo/netem/probe.h"

namespace xsilo::netem {

namespace {

using Clock = std::chrono::steady_clock;

// Probes measure the link, not the scheduler: run them ahead of ordinary
// work where allowed (best effort, this thread only).
void RaisePriority() { (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), -10); }

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Result<sockaddr_in> ParseAddress(const std::string& address, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1) {
    return InvalidArgument("not an IPv4 address: " + address);
  }
  return a;
}

// Waits until fd is ready for `events` or the deadline passes.
Status WaitFd(int fd, short events, Clock::time_point deadline) {
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return Timeout("socket not ready in time");
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r > 0) return Status::OK();
    if (r < 0 && errno != EINTR) return Internal(std::string("poll: ") + strerror(errno));
  }
}

}  // namespace

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

Result<std::unique_ptr<EchoServer>> EchoServer::Start(const State& state, int site, uint16_t port) {
  if (site < 0 || site >= static_cast<int>(state.sites.size())) {
    return InvalidArgument("site index out of range");
  }
  XSILO_ASSIGN_OR_RETURN(sockaddr_in addr, ParseAddress(state.sites[site].address, port));
  std::unique_ptr<EchoServer> server(new EchoServer());
  // Shared: the thread may still be inside set_value when Start returns.
  auto ready = std::make_shared<std::promise<Status>>();
  auto ready_future = ready->get_future();
  EchoServer* self = server.get();
  server->thread_ = std::thread([self, &state, site, addr, ready] {
    RaisePriority();
    Status s = EnterSite(state, site);
    int fd = -1;
    if (s.ok()) {
      fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in a = addr;
      socklen_t len = sizeof a;
      if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
          listen(fd, 64) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
        s = Unavailable(std::string("echo server: ") + strerror(errno));
        if (fd >= 0) close(fd);
        fd = -1;
      } else {
        self->listen_fd_ = fd;
        self->port_ = ntohs(a.sin_port);
      }
    }
    ready->set_value(s);
    if (s.ok()) self->Serve();
  });
  Status s = ready_future.get();
  if (!s.ok()) {
    server->thread_.join();
    return s;
  }
  return server;
}

void EchoServer::Serve() {
  std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
  char buf[65536];
  while (!stop_.load()) {
    int n = poll(fds.data(), fds.size(), 50);
    if (n <= 0) continue;
    if (fds[0].revents & POLLIN) {
      int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c >= 0) {
        NoDelay(c);
        fds.push_back({c, POLLIN, 0});
      }
    }
    for (size_t i = 1; i < fds.size();) {
      bool closed = false;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t r = read(fds[i].fd, buf, sizeof buf);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
          closed = true;
        } else if (r > 0) {
          // Echo everything; a short write waits (echo payloads are small).
          ssize_t off = 0;
          while (off < r && !stop_.load()) {
            ssize_t w = write(fds[i].fd, buf + off, static_cast<size_t>(r - off));
            if (w > 0) {
              off += w;
            } else if (errno == EAGAIN) {
              pollfd p{fds[i].fd, POLLOUT, 0};
              poll(&p, 1, 50);
            } else {
              closed = true;
              break;
            }
          }
        }
      }
      if (closed) {
        close(fds[i].fd);
        fds.erase(fds.begin() + static_cast<long>(i));
      } else {
        fds[i].revents = 0;
        ++i;
      }
    }
  }
  for (auto& p : fds) close(p.fd);
}

EchoServer::~EchoServer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

Result<std::vector<double>> MeasureEchoRtt(const State& state, int from_site,
                                           const std::string& address, uint16_t port, int samples,
                                           std::chrono::milliseconds timeout) {
  XSILO_ASSIGN_OR_RETURN(sockaddr_in addr, ParseAddress(address, port));
  Result<std::vector<double>> result = Internal("not run");
  std::thread t([&] {
    auto run = [&]() -> Result<std::vector<double>> {
      RaisePriority();
      XSILO_RETURN_IF_ERROR(EnterSite(state, from_site));
      const auto deadline = Clock::now() + timeout;
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) return Internal(std::string("socket: ") + strerror(errno));
      struct Closer {
        int fd;
        ~Closer() { close(fd); }
      } closer{fd};
      NoDelay(fd);
      if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 &&
          errno != EINPROGRESS) {
        return Unavailable("connect " + address + ": " + strerror(errno));
      }
      XSILO_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline));
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err) return Unavailable("connect " + address + ": " + strerror(err));
      std::vector<double> rtts;
      for (int i = 0; i <= samples; ++i) {
        char c = static_cast<char>(i);
        auto t0 = Clock::now();
        if (write(fd, &c, 1) != 1) return Unavailable(std::string("write: ") + strerror(errno));
        while (true) {
          XSILO_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline));
          ssize_t r = read(fd, &c, 1);
          if (r == 1) break;
          if (r == 0) return Unavailable("echo server closed the connection");
          if (errno != EAGAIN && errno != EINTR) {
            return Unavailable(std::string("read: ") + strerror(errno));
          }
        }
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (i > 0) rtts.push_back(ms);  // the first one warms up
      }
      return rtts;
    };
    result = run();
  });
  t.join();
  return result;
}

}  // namespace xsilo::netem
