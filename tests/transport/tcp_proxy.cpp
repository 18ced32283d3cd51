#include "transport/tcp_proxy.h"

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
  {
    std::lock_guard<std::mutex> lock(hold_mu_);
    stop_ = true;
  }
  hold_cv_.notify_all();
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

void TcpProxy::HoldAfter(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(hold_mu_);
  held_ = released_ = false;
  hold_at_ = forwarded_.load() + std::max<uint64_t>(bytes, 1);
}

bool TcpProxy::WaitHeld(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(hold_mu_);
  return hold_cv_.wait_for(lock, timeout, [&] { return held_; });
}

void TcpProxy::Release() {
  {
    std::lock_guard<std::mutex> lock(hold_mu_);
    released_ = true;
    hold_at_ = 0;
  }
  hold_cv_.notify_all();
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
    if (upstream && hold_at_.load() != 0) {
      // Held: forward nothing more on this connection; once released, cut it.
      std::unique_lock<std::mutex> lock(hold_mu_);
      if (hold_at_.load() != 0 &&
          (held_ || forwarded_.load() + static_cast<uint64_t>(n) >= hold_at_.load())) {
        held_ = true;
        hold_cv_.notify_all();
        hold_cv_.wait(lock, [&] { return released_ || stop_.load(); });
        break;
      }
    }
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
