#include "transport/grpc/tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

namespace xsilo::testing {

TcpProxy::TcpProxy(int target_port) : target_port_(target_port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  ::listen(listen_fd_, 64);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

TcpProxy::~TcpProxy() {
  stop_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  CutAll();
  acceptor_.join();
  for (auto& t : threads_) t.join();
  ::close(listen_fd_);
  for (int fd : fds_) ::close(fd);
}

void TcpProxy::CutAfter(uint64_t bytes) {
  cut_at_ = forwarded_.load() + std::max<uint64_t>(bytes, 1);
}

void TcpProxy::CutAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
}

void TcpProxy::AcceptLoop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    int client = ::accept(listen_fd_, nullptr, nullptr);
    if (client < 0) continue;
    int upstream = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(target_port_));
    if (::connect(upstream, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(client);
      ::close(upstream);
      continue;
    }
    int one = 1;
    ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(upstream, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mu_);
    fds_.push_back(client);
    fds_.push_back(upstream);
    threads_.emplace_back([this, client, upstream] { Pump(client, upstream, true); });
    threads_.emplace_back([this, client, upstream] { Pump(upstream, client, false); });
  }
}

void TcpProxy::Pump(int from, int to, bool upstream) {
  std::vector<char> buf(64 << 10);
  for (;;) {
    ssize_t n = ::read(from, buf.data(), buf.size());
    if (n <= 0) break;
    if (upstream) {
      uint64_t total = forwarded_ += static_cast<uint64_t>(n);
      uint64_t at = cut_at_.load();
      if (at != 0 && total >= at && cut_at_.compare_exchange_strong(at, 0)) {
        ++cuts_;
        CutAll();
        break;
      }
    }
    ssize_t off = 0;
    while (off < n) {
      ssize_t w = ::send(to, buf.data() + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
      if (w <= 0) break;
      off += w;
    }
    if (off < n) break;
  }
  ::shutdown(from, SHUT_RDWR);
  ::shutdown(to, SHUT_RDWR);
}

}  // namespace xsilo::testing
