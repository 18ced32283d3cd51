#include "net/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <vector>

namespace xsilo::net {

Result<HostPort> ParseHostPort(std::string_view text) {
  HostPort hp;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidArgument("address '" + std::string(text) + "' is not [v6]:port");
    }
    hp.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0) {
      return InvalidArgument("address '" + std::string(text) + "' is not host:port");
    }
    hp.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), hp.port);
  if (ec != std::errc() || p != port.data() + port.size() || hp.port < 0 || hp.port > 65535) {
    return InvalidArgument("address '" + std::string(text) + "' has no valid port");
  }
  return hp;
}

void SetIoTimeout(int fd, std::chrono::milliseconds timeout) {
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void CloseFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

namespace {

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

Status Resolve(const HostPort& hp, bool passive, AddrInfo* out, int socktype = SOCK_STREAM) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  std::string port = std::to_string(hp.port);
  int rc =
      getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), port.c_str(), &hints, &out->list);
  if (rc != 0) return Unavailable("resolve " + hp.ToString() + ": " + gai_strerror(rc));
  return Status::OK();
}

// One connect attempt bounded by `timeout`; errno-style error or 0.
int ConnectOne(int fd, const addrinfo* a, std::chrono::milliseconds timeout) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int err = 0;
  if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return errno;
    pollfd p{fd, POLLOUT, 0};
    int n;
    do {
      n = poll(&p, 1, static_cast<int>(timeout.count()));
    } while (n < 0 && errno == EINTR);
    if (n == 0) return ETIMEDOUT;
    if (n < 0) return errno;
    socklen_t len = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return err;
  }
  fcntl(fd, F_SETFL, flags);
  return 0;
}

}  // namespace

Result<int> ConnectTcp(const HostPort& hp, std::chrono::milliseconds connect_timeout,
                       std::chrono::milliseconds io_timeout) {
  AddrInfo ai;
  XSILO_RETURN_IF_ERROR(Resolve(hp, false, &ai));
  std::string last = "no address";
  for (addrinfo* a = ai.list; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = std::strerror(errno);
      continue;
    }
    int e = ConnectOne(fd, a, connect_timeout);
    if (e == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      SetIoTimeout(fd, io_timeout);
      return fd;
    }
    last = std::strerror(e);
    ::close(fd);
  }
  return Unavailable("connect " + hp.ToString() + ": " + last);
}

Result<int> ListenTcp(const HostPort& hp, int* bound_port) {
  AddrInfo ai;
  XSILO_RETURN_IF_ERROR(Resolve(hp, true, &ai));
  std::string last = "no address";
  for (addrinfo* a = ai.list; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 256) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      *bound_port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      return fd;
    }
    last = std::strerror(errno);
    ::close(fd);
  }
  return Unavailable("listen on " + hp.ToString() + ": " + last);
}

Result<int> BindUdp(const HostPort& hp) {
  AddrInfo ai;
  XSILO_RETURN_IF_ERROR(Resolve(hp, true, &ai, SOCK_DGRAM));
  std::string last = "no address";
  for (addrinfo* a = ai.list; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
      SetIoTimeout(fd, std::chrono::milliseconds(200));
      return fd;
    }
    last = std::strerror(errno);
    ::close(fd);
  }
  return Unavailable("bind udp " + hp.ToString() + ": " + last);
}

Status SendAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Unavailable(std::string("send: ") + std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

Status SendGather(int fd, const GatherList& bytes) {
  for (const Buffer& b : bytes.segments) {
    uint64_t off = 0;
    while (off < b.size()) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(b.size() - off, 1ull << 30));
      XSILO_RETURN_IF_ERROR(SendAll(fd, b.data() + off, n));
      off += n;
    }
  }
  return Status::OK();
}

Status RecvExact(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return Unavailable("connection closed by the peer");
    if (r < 0) return Unavailable(std::string("recv: ") + std::strerror(errno));
    p += r;
    n -= static_cast<size_t>(r);
  }
  return Status::OK();
}

}  // namespace xsilo::net
