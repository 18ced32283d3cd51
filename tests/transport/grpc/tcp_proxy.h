// A loopback TCP proxy for fault injection: forwards every connection to a
// target port and can cut all of them once a byte budget has passed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace xsilo::testing {

class TcpProxy {
 public:
  // Listens on a free 127.0.0.1 port and forwards to 127.0.0.1:target_port.
  explicit TcpProxy(int target_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  // Once `bytes` more bytes went client -> target, every open connection is
  // cut (both directions shut down). One-shot; new connections then pass.
  void CutAfter(uint64_t bytes);
  int cuts() const { return cuts_.load(); }
  uint64_t forwarded() const { return forwarded_.load(); }

 private:
  void AcceptLoop();
  void Pump(int from, int to, bool upstream);
  void CutAll();

  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> forwarded_{0};
  std::atomic<uint64_t> cut_at_{0};  // 0 = no cut armed
  std::atomic<int> cuts_{0};
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

}  // namespace xsilo::testing
