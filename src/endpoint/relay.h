// Private: the relay (`xsilo relay`, docs/endpoint.md). Endpoints dial out
// to it and register; it vouches for peers (tickets) and, where no direct
// path exists, pipes the bytes of a peer session between two outbound
// connections, a fixed window at a time.
//
// One port. A connection starting with a TLS record is a control session
// (lines, one request each, client certificate required):
//   REGISTER <uuid> <addr,addr|->   -> OK <secret>   (stays open: SERVE <token> lines follow)
//   LOOKUP <to>                     -> PEER <fp> <addr,addr|-> <ticket> | ERR <code> <why>
//   RELAY <to>                      -> PIPE <token>  (and SERVE <token> to <to>)
//   REVERSE <to> <token>            -> DIALING <token> (and DIAL <token> <caller's addrs> to <to>)
//   PUNCH <to> <token> <desc>       -> PUNCHED <to's desc> once <to> answered (PUNCH <token> <desc>
//   to <to>) ANSWER <token> <desc>           -> OK   (from <to> only: its ICE description for the
//   punch)
// The same port over UDP answers STUN Binding requests (RFC 5389): the
// endpoints learn the address their NAT maps them to (punch.h).
// Anything else is a pipe leg, plain TCP (the session inside is TLS end to
// end between the two endpoints, so the relay sees only ciphertext):
//   JOIN <token> requester|owner\n  then raw bytes both ways once both legs arrived.
// The callers of LOOKUP and RELAY are identified by their TLS client
// certificate, which must be that of a registered endpoint.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "net/tls.h"
#include "xsilo/core/status.h"

namespace xsilo::endpoint {

struct RelayOptions {
  std::string listen = "127.0.0.1:0";
  std::string cert_file, key_file;  // the relay's TLS identity
  std::chrono::milliseconds ticket_ttl{120000};
  std::chrono::milliseconds pair_timeout{10000};  // a pipe leg waits this long for the other
  std::chrono::milliseconds io_timeout{60000};
  size_t window_bytes = 256 << 10;  // per direction of a pipe: all the memory a pipe holds
  // SHA-256 fingerprints (hex) of the endpoint certificates that may
  // register. Empty: any certificate may (an open relay, which vouches for
  // whoever reaches it; `xsilo relay` asks for --admit or --open).
  std::set<std::string> admit;
  // Connections served at once (each is a thread: control requests, pipe
  // legs); one more is closed as soon as it is accepted.
  int max_connections = 1024;
  // Test hook, called by the owner->requester pump after each forwarded
  // window with the bytes forwarded so far (it may block).
  std::function<void(uint64_t forwarded)> on_pipe_progress;
};

class Relay {
 public:
  static Result<std::unique_ptr<Relay>> Start(RelayOptions options);
  ~Relay();
  // Stops accepting, breaks every connection (registrations and pipes), joins.
  void Stop();
  // Breaks every connection now without waiting (a relay that dies).
  void Abort();
  int port() const { return port_; }
  const std::string& fingerprint() const { return identity_->fingerprint(); }
  bool registered(const std::string& uuid) const;
  uint64_t pipes_opened() const { return pipes_opened_; }
  // Connections closed at accept because max_connections were being served.
  uint64_t refused() const {
    std::lock_guard<std::mutex> lock(mu_);
    return refused_;
  }

 private:
  struct Registration {
    std::string fp, addrs, secret;
    std::shared_ptr<net::TlsStream> control;
    std::shared_ptr<std::mutex> write_mu;
  };
  struct Pipe;
  struct PunchWait {
    std::string owner_fp;  // only the owner may answer
    std::string answer;
    bool answered = false;
  };

  explicit Relay(RelayOptions o) : o_(std::move(o)) {}
  void AcceptLoop();
  void StunLoop();
  void Serve(int fd);
  void ServeControl(int fd);
  void ServeJoin(int fd);
  void Pump(Pipe& pipe, int from, int to, bool to_requester);
  std::string Handle(const std::string& line, const std::shared_ptr<net::TlsStream>& s, bool* keep);
  // A registration whose session broke (a write to it failed) is removed,
  // unless the endpoint registered again since. Called with mu_ held.
  void DropRegistration(const std::string& uuid, const std::shared_ptr<net::TlsStream>& control);
  void Track(int fd);
  void Untrack(int fd);

  RelayOptions o_;
  std::shared_ptr<net::TlsIdentity> identity_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_, stun_;
  int udp_fd_ = -1;
  std::atomic<uint64_t> pipes_opened_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int threads_ = 0;
  uint64_t refused_ = 0;
  std::set<int> fds_;
  std::map<std::string, Registration> registry_;
  std::map<std::string, std::shared_ptr<Pipe>> pending_;
  std::map<std::string, std::shared_ptr<PunchWait>> punches_;
};

}  // namespace xsilo::endpoint
