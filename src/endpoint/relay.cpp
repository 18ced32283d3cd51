#include "endpoint/relay.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>
#include <vector>

#include "endpoint/object_table.h"
#include "endpoint/punch.h"
#include "endpoint/ticket.h"
#include "net/socket.h"

namespace xsilo::endpoint {

using net::CloseFd;

struct Relay::Pipe {
  int requester = -1, owner = -1;
  std::chrono::steady_clock::time_point deadline;
  int finished = 0;  // pumps done; the second closes both legs
  // When either direction last moved bytes (steady clock, ns): one
  // direction of a session is silent while the other carries the object,
  // so a pump's receive timeout ends the pipe only when both were idle.
  std::atomic<int64_t> last_progress_ns{0};
};

namespace {
int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Result<std::unique_ptr<Relay>> Relay::Start(RelayOptions options) {
  std::unique_ptr<Relay> r(new Relay(std::move(options)));
  XSILO_ASSIGN_OR_RETURN(r->identity_, net::TlsIdentity::Load(r->o_.cert_file, r->o_.key_file));
  XSILO_ASSIGN_OR_RETURN(auto hp, net::ParseHostPort(r->o_.listen));
  XSILO_ASSIGN_OR_RETURN(r->listen_fd_, net::ListenTcp(hp, &r->port_));
  r->acceptor_ = std::thread([p = r.get()] { p->AcceptLoop(); });
  // STUN on the same port over UDP; without it (the port is taken for UDP)
  // endpoints learn no reflexive address and punching falls back to the pipe.
  auto udp = net::BindUdp({hp.host, r->port_});
  if (udp.ok()) {
    r->udp_fd_ = *udp;
    r->stun_ = std::thread([p = r.get()] { p->StunLoop(); });
  }
  return r;
}

Relay::~Relay() { Stop(); }

void Relay::Abort() {
  stopping_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
  for (auto& [uuid, reg] : registry_) reg.control->Interrupt();
  cv_.notify_all();
}

void Relay::Stop() {
  Abort();
  if (acceptor_.joinable()) acceptor_.join();
  if (stun_.joinable()) stun_.join();
  CloseFd(udp_fd_);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return threads_ == 0; });
  registry_.clear();
  CloseFd(listen_fd_);
}

bool Relay::registered(const std::string& uuid) const {
  std::lock_guard<std::mutex> lock(mu_);
  return registry_.count(uuid) > 0;
}

void Relay::Track(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  fds_.insert(fd);
  if (stopping_) ::shutdown(fd, SHUT_RDWR);
}

void Relay::Untrack(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  fds_.erase(fd);
}

void Relay::AcceptLoop() {
  while (!stopping_) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // EMFILE: let others close
      continue;
    }
    net::SetIoTimeout(fd, o_.io_timeout);
    std::lock_guard<std::mutex> lock(mu_);
    if (threads_ >= o_.max_connections) {  // a flood: refuse rather than run out of threads
      ++refused_;
      ::close(fd);
      continue;
    }
    ++threads_;
    std::thread([this, fd] {
      Serve(fd);
      std::lock_guard<std::mutex> l(mu_);
      --threads_;
      cv_.notify_all();
    }).detach();
  }
}

void Relay::StunLoop() {
  std::string buf(1500, '\0');
  while (!stopping_) {
    sockaddr_storage from{};
    socklen_t len = sizeof from;
    ssize_t n =
        ::recvfrom(udp_fd_, buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&from), &len);
    if (n <= 0) continue;  // the 200 ms receive timeout: look at stopping_ again
    std::string reply = StunBindingResponse(buf.substr(0, static_cast<size_t>(n)), &from, len);
    if (!reply.empty()) {
      (void)::sendto(udp_fd_, reply.data(), reply.size(), 0, reinterpret_cast<sockaddr*>(&from),
                     len);
    }
  }
}

void Relay::Serve(int fd) {
  Track(fd);
  unsigned char first = 0;
  ssize_t n = ::recv(fd, &first, 1, MSG_PEEK);
  if (n != 1) {
    Untrack(fd);
    ::close(fd);
    return;
  }
  if (first == 0x16) {  // a TLS handshake record
    ServeControl(fd);
  } else {
    ServeJoin(fd);
  }
}

void Relay::ServeControl(int fd) {
  auto s = net::TlsStream::Accept(identity_->server_ctx(), fd);
  if (!s.ok()) {
    Untrack(fd);
    return;
  }
  std::shared_ptr<net::TlsStream> stream(std::move(s).value());
  auto line = stream->ReadLine();
  bool keep = false;
  if (line.ok()) {
    std::string reply = Handle(*line, stream, &keep);
    if (!keep) (void)stream->WriteLine(reply);
  }
  Untrack(fd);
}

std::string Relay::Handle(const std::string& line, const std::shared_ptr<net::TlsStream>& s,
                          bool* keep) {
  std::istringstream in(line);
  std::string verb, a, b;
  in >> verb >> a >> b;
  const std::string& fp = s->peer_fingerprint();
  if (fp.empty()) return "ERR PermissionDenied a client certificate is required";
  if (verb == "REGISTER") {
    if (!ValidName(a) || b.empty()) return "ERR InvalidArgument REGISTER <uuid> <addrs>";
    if (!o_.admit.empty() && !o_.admit.count(fp)) {
      return "ERR PermissionDenied certificate " + fp + " is not admitted by this relay";
    }
    Registration reg{fp, b, RandomSecret(), s, std::make_shared<std::mutex>()};
    // Visible at once (a LOOKUP right after the endpoint saw OK finds it),
    // but its write lock is held until OK is out: no SERVE overtakes the OK.
    std::unique_lock<std::mutex> write(*reg.write_mu);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = registry_.find(a);
      if (it != registry_.end() && it->second.fp != fp) {
        return "ERR PermissionDenied endpoint " + a + " is registered with another certificate";
      }
      if (it != registry_.end()) it->second.control->Interrupt();
      registry_[a] = reg;
    }
    *keep = true;
    if (!s->WriteLine("OK " + reg.secret).ok()) s->Interrupt();
    return "";
  }
  // LOOKUP and RELAY: the caller must be a registered endpoint.
  std::string from, from_addrs;
  Registration to;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [uuid, reg] : registry_) {
      if (reg.fp == fp) {
        from = uuid;
        from_addrs = reg.addrs;
      }
    }
    if (from.empty()) return "ERR PermissionDenied the caller is not a registered endpoint";
    if (verb == "ANSWER") {  // ANSWER <token> <description>
      auto w = punches_.find(a);
      if (w == punches_.end() || w->second->owner_fp != fp || b.empty()) {
        return "ERR NotFound no punch " + a + " waits for this endpoint's answer";
      }
      w->second->answer = b;
      w->second->answered = true;
      cv_.notify_all();
      return "OK";
    }
    auto it = registry_.find(a);
    if (it == registry_.end() || !it->second.control) {
      return "ERR NotFound endpoint " + a + " is not registered with this relay";
    }
    to = it->second;
  }
  if (verb == "LOOKUP") {
    auto expiry = UnixMillis() + o_.ticket_ttl.count();
    return "PEER " + to.fp + " " + to.addrs + " " + MakeTicket(to.secret, from, fp, a, expiry);
  }
  if (verb == "RELAY") {
    std::string token = RandomSecret();
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Pipes that neither side joined before their deadline go now (one
      // that a leg joined is removed by that leg's thread).
      const auto now = std::chrono::steady_clock::now();
      for (auto it = pending_.begin(); it != pending_.end();) {
        const Pipe& q = *it->second;
        it = q.deadline < now && q.requester == -1 && q.owner == -1 ? pending_.erase(it)
                                                                    : std::next(it);
      }
      auto p = std::make_shared<Pipe>();
      p->deadline = now + o_.pair_timeout;
      pending_[token] = p;
    }
    std::lock_guard<std::mutex> w(*to.write_mu);
    if (!to.control->WriteLine("SERVE " + token).ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.erase(token);
      DropRegistration(a, to.control);
      return "ERR Unavailable endpoint " + a + " lost its connection to the relay";
    }
    return "PIPE " + token;
  }
  if (verb == "PUNCH") {  // PUNCH <to> <token> <description>
    std::string desc;
    in >> desc;
    if (!ValidName(b) || desc.empty()) {
      return "ERR InvalidArgument PUNCH <to> <token> <description>";
    }
    auto w = std::make_shared<PunchWait>();
    w->owner_fp = to.fp;
    {
      std::lock_guard<std::mutex> lock(mu_);
      punches_[b] = w;
    }
    Status told;
    {
      std::lock_guard<std::mutex> write(*to.write_mu);
      told = to.control->WriteLine("PUNCH " + b + " " + desc);
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (!told.ok()) DropRegistration(a, to.control);
    if (told.ok()) {
      cv_.wait_for(lock, o_.pair_timeout, [&] { return stopping_ || w->answered; });
    }
    punches_.erase(b);
    if (!w->answered) return "ERR Unavailable endpoint " + a + " did not answer the punch";
    return "PUNCHED " + w->answer;
  }
  if (verb == "REVERSE") {
    // The requester chose the token (it waits for it on its listener
    // before asking); the owner dials the requester's registered addresses.
    if (!ValidName(b)) return "ERR InvalidArgument REVERSE <to> <token>";
    if (from_addrs == "-") {
      return "ERR FailedPrecondition the caller advertises no peer address to dial back";
    }
    std::lock_guard<std::mutex> w(*to.write_mu);
    if (!to.control->WriteLine("DIAL " + b + " " + from_addrs).ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      DropRegistration(a, to.control);
      return "ERR Unavailable endpoint " + a + " lost its connection to the relay";
    }
    return "DIALING " + b;
  }
  return "ERR InvalidArgument unknown request " + verb;
}

void Relay::DropRegistration(const std::string& uuid,
                             const std::shared_ptr<net::TlsStream>& control) {
  auto it = registry_.find(uuid);
  if (it != registry_.end() && it->second.control == control) registry_.erase(it);
}

void Relay::ServeJoin(int fd) {
  // "JOIN <token> <role>\n", read a byte at a time so that no byte of the
  // session after it is consumed here.
  std::string line;
  char c = 0;
  while (line.size() < 256) {
    if (::recv(fd, &c, 1, 0) != 1) break;
    if (c == '\n') break;
    line.push_back(c);
  }
  std::istringstream in(line);
  std::string verb, token, role;
  in >> verb >> token >> role;
  std::shared_ptr<Pipe> pipe;
  const bool requester = role == "requester";
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = pending_.find(token);
    if (verb != "JOIN" || it == pending_.end() || (!requester && role != "owner") ||
        (requester ? it->second->requester : it->second->owner) >= 0) {
      fds_.erase(fd);
      lock.unlock();
      ::close(fd);
      return;
    }
    pipe = it->second;
    (requester ? pipe->requester : pipe->owner) = fd;
    if (pipe->requester >= 0 && pipe->owner >= 0) {
      pending_.erase(token);
      ++pipes_opened_;
      cv_.notify_all();
    } else {
      bool paired = cv_.wait_until(lock, pipe->deadline, [&] {
        return stopping_ || (pipe->requester >= 0 && pipe->owner >= 0);
      });
      if (!paired || stopping_) {
        if (pending_.count(token) && pending_[token] == pipe) pending_.erase(token);
        // The other leg may have arrived just now: it sees the closed socket.
        ::shutdown(fd, SHUT_RDWR);
        if (requester) {
          pipe->requester = -2;
        } else {
          pipe->owner = -2;
        }
        fds_.erase(fd);
        lock.unlock();
        ::close(fd);
        return;
      }
    }
  }
  pipe->last_progress_ns = SteadyNanos();
  if (requester) {
    Pump(*pipe, pipe->requester, pipe->owner, false);
  } else {
    Pump(*pipe, pipe->owner, pipe->requester, true);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (++pipe->finished == 2) {
    fds_.erase(pipe->requester);
    fds_.erase(pipe->owner);
    ::close(pipe->requester);
    ::close(pipe->owner);
  }
}

void Relay::Pump(Pipe& pipe, int from, int to, bool to_requester) {
  std::vector<char> window(o_.window_bytes);
  uint64_t forwarded = 0;
  const int64_t idle_limit_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(o_.io_timeout).count();
  while (!stopping_) {
    ssize_t n = ::recv(from, window.data(), window.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    // The receive timeout (io_timeout) on a silent direction: go on while
    // the other direction moves bytes.
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
        SteadyNanos() - pipe.last_progress_ns.load() < idle_limit_ns) {
      continue;
    }
    if (n == 0) {  // this direction is done: pass the end on
      ::shutdown(to, SHUT_WR);
      return;
    }
    if (n < 0 || !net::SendAll(to, window.data(), static_cast<size_t>(n)).ok()) break;
    forwarded += static_cast<uint64_t>(n);
    pipe.last_progress_ns = SteadyNanos();
    if (to_requester && o_.on_pipe_progress) o_.on_pipe_progress(forwarded);
  }
  // An error on either side, or the relay stopping: break both legs, so
  // that neither endpoint mistakes a cut stream for a finished one.
  ::shutdown(from, SHUT_RDWR);
  ::shutdown(to, SHUT_RDWR);
}

}  // namespace xsilo::endpoint
