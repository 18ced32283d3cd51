// A loopback TCP proxy for fault injection: forwards every connection to a
// target port and can cut all of them once a byte budget has passed, or
// hold them (stop forwarding, so senders stall mid-transfer) until told.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
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
  // Once `bytes` more bytes went client -> target, stops forwarding on every
  // connection (their senders stall with full buffers) until Release().
  void HoldAfter(uint64_t bytes);
  // Waits until the hold took effect; false on timeout.
  bool WaitHeld(std::chrono::milliseconds timeout);
  // Cuts the held connections and forwards again; new connections pass.
  void Release();
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
  std::atomic<uint64_t> hold_at_{0};  // 0 = no hold armed
  std::mutex hold_mu_;
  std::condition_variable hold_cv_;
  bool held_ = false, released_ = false;  // guarded by hold_mu_
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

}  // namespace xsilo::testing
