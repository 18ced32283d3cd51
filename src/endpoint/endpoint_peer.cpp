// The PEER API of an endpoint: serving a session (direct or relayed), and
// calling the owner of an object.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "endpoint/endpoint.h"
#include "endpoint/ticket.h"
#include "net/socket.h"

namespace xsilo::endpoint {

namespace {

constexpr uint64_t kChunk = 1 << 20;

struct PeerRequestLine {
  std::string method, id, ticket;
  uint64_t bytes = 0;
};

bool ParseRequest(const std::string& line, PeerRequestLine* r) {
  std::istringstream in(line);
  std::string magic;
  if (!(in >> magic >> r->method >> r->id >> r->bytes >> r->ticket) || magic != "XSP/1") {
    return false;
  }
  return ValidName(r->id);
}

Status ParseReplyLine(const std::string& line, PeerReply* r) {
  std::istringstream in(line);
  std::string magic;
  if (!(in >> magic >> r->status >> r->bytes) || magic != "XSP/1") {
    return Corrupt("malformed peer reply: " + line.substr(0, 100));
  }
  std::getline(in, r->message);
  if (!r->message.empty() && r->message.front() == ' ') r->message.erase(0, 1);
  return Status::OK();
}

std::string ReplyLine(int status, uint64_t bytes, const std::string& message) {
  std::string m = message;
  for (char& c : m) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return "XSP/1 " + std::to_string(status) + " " + std::to_string(bytes) + " " + m;
}

Status StatusOfRelayError(const std::string& reply) {
  std::istringstream in(reply);
  std::string err, code, why;
  in >> err >> code;
  std::getline(in, why);
  std::string msg = "relay: " + code + why;
  if (code == "PermissionDenied") return PermissionDenied(msg);
  if (code == "InvalidArgument") return InvalidArgument(msg);
  // NotFound here means the owner is not registered: the object may well
  // exist, it is only unreachable now.
  return Unavailable(msg);
}

// One request/reply on a session to the owner.
Result<PeerReply> Session(net::TlsStream& s, const std::string& method, const std::string& id,
                          const GatherList* body, const std::string& ticket) {
  const uint64_t n = body ? body->size : 0;
  XSILO_RETURN_IF_ERROR(
      s.WriteLine("XSP/1 " + method + " " + id + " " + std::to_string(n) + " " + ticket));
  XSILO_ASSIGN_OR_RETURN(std::string line, s.ReadLine());
  PeerReply r;
  XSILO_RETURN_IF_ERROR(ParseReplyLine(line, &r));
  if (method == "PUT" && r.status == 100) {
    // The owner vouched for us and reserved the space: now the body.
    if (body) {
      for (const Buffer& b : body->segments) {
        for (uint64_t off = 0; off < b.size(); off += kChunk) {
          XSILO_RETURN_IF_ERROR(s.Write(b.data() + off, std::min(kChunk, b.size() - off)));
        }
      }
    }
    XSILO_ASSIGN_OR_RETURN(line, s.ReadLine());
    r = PeerReply();
    XSILO_RETURN_IF_ERROR(ParseReplyLine(line, &r));
  }
  if (method == "GET" && r.status == 200) {
    XSILO_ASSIGN_OR_RETURN(r.body, Buffer::Allocate(r.bytes));
    // A session cut short is Unavailable: never a truncated object.
    for (uint64_t off = 0; off < r.bytes; off += kChunk) {
      XSILO_RETURN_IF_ERROR(
          s.ReadExact(r.body.mutable_data() + off, std::min(kChunk, r.bytes - off)));
    }
  }
  return r;
}

}  // namespace

bool Endpoint::RunSession(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || sessions_ >= o_.max_sessions) return false;
  ++sessions_;
  std::thread([this, fn = std::move(fn)] {
    fn();
    std::lock_guard<std::mutex> l(mu_);
    --sessions_;
    cv_.notify_all();
  }).detach();
  return true;
}

void Endpoint::PeerAcceptLoop() {
  while (!stopping_) {
    int fd = ::accept4(peer_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    net::SetIoTimeout(fd, o_.io_timeout);
    {
      std::lock_guard<std::mutex> lock(mu_);
      session_fds_.insert(fd);
    }
    bool started = RunSession([this, fd] {
      unsigned char first = 0;
      if (::recv(fd, &first, 1, MSG_PEEK) == 1 && first != 0x16) return HandDialBack(fd);
      auto s = net::TlsStream::Accept(identity_->server_ctx(), fd);
      if (s.ok()) {
        ServePeerSession(std::move(s).value());
      } else {
        std::lock_guard<std::mutex> lock(mu_);
        session_fds_.erase(fd);
      }
    });
    if (!started) {
      std::lock_guard<std::mutex> lock(mu_);
      session_fds_.erase(fd);
      ::close(fd);
    }
  }
}

void Endpoint::ServePeerSession(std::unique_ptr<net::TlsStream> s) {
  const int fd = s->fd();
  {
    std::lock_guard<std::mutex> lock(mu_);
    session_fds_.insert(fd);
    if (stopping_) ::shutdown(fd, SHUT_RDWR);
  }
  [&] {
    auto line = s->ReadLine();
    if (!line.ok()) return;
    PeerRequestLine req;
    if (!ParseRequest(*line, &req)) {
      (void)s->WriteLine(ReplyLine(400, 0, "malformed request"));
      return;
    }
    std::string secret;
    {
      std::lock_guard<std::mutex> lock(mu_);
      secret = secret_;
    }
    std::string peer;  // the peer's UUID, as the relay vouched for it
    Status vouched =
        VerifyTicket(req.ticket, secret, uuid_, s->peer_fingerprint(), UnixMillis(), &peer);
    // The writer is the UUID with the certificate of this session: another
    // certificate registering the same UUID later is another writer.
    const std::string from = peer + "@" + s->peer_fingerprint();
    if (!vouched.ok()) {
      (void)s->WriteLine(ReplyLine(403, 0, vouched.message()));
      return;
    }
    if (req.method == "PUT") {
      // Refused before the body is sent; Commit checks again.
      if (Status may = table_.MayModify(req.id, from); !may.ok()) {
        (void)s->WriteLine(ReplyLine(403, 0, may.message()));
        return;
      }
      Status reserved = table_.Reserve(req.bytes);
      if (!reserved.ok()) {
        (void)s->WriteLine(ReplyLine(507, 0, reserved.message()));
        return;
      }
      // The requester sends the body only after this: a refusal never
      // leaves an unread body behind.
      if (!s->WriteLine(ReplyLine(100, 0, "continue")).ok()) {
        table_.Abandon(req.bytes);
        return;
      }
      auto b = Buffer::Allocate(req.bytes);
      Status got = b.ok() ? Status::OK() : b.status();
      for (uint64_t off = 0; got.ok() && off < req.bytes; off += kChunk) {
        got = s->ReadExact(b->mutable_data() + off, std::min(kChunk, req.bytes - off));
      }
      if (!got.ok()) {  // nothing stored
        table_.Abandon(req.bytes);
        return;
      }
      Status c = table_.Commit(req.id, std::move(b).value(), from);
      (void)s->WriteLine(c.ok() ? ReplyLine(201, 0, "stored")
                                : ReplyLine(c.code() == StatusCode::kPermissionDenied ? 403 : 500,
                                            0, c.message()));
      return;
    }
    if (req.method == "DELETE") {
      Status erased = table_.Erase(req.id, from);
      (void)s->WriteLine(erased.ok() ? ReplyLine(204, 0, "deleted")
                                     : ReplyLine(403, 0, erased.message()));
      return;
    }
    if (req.method != "GET" && req.method != "HEAD") {
      (void)s->WriteLine(ReplyLine(400, 0, "unknown method " + req.method));
      return;
    }
    // An absent object is 404 to every vouched peer (a get of a missing key
    // is None, as for every connector): a peer may learn whether an id it
    // names exists, never what a refused object holds or how large it is.
    if (!table_.SizeOf(req.id).has_value()) {
      (void)s->WriteLine(ReplyLine(404, 0, "no object " + req.id));
      return;
    }
    if (!MayPeerRead(req.id, peer, from)) {
      (void)s->WriteLine(ReplyLine(
          403, 0,
          "endpoint " + uuid_ + " has not granted " + peer + " read access to object " + req.id));
      return;
    }
    auto got = table_.Get(req.id);
    if (!got.ok()) {
      (void)s->WriteLine(ReplyLine(500, 0, got.status().message()));
      return;
    }
    if (!got->has_value()) {
      (void)s->WriteLine(ReplyLine(404, 0, "no object " + req.id));
      return;
    }
    const Buffer& b = **got;
    if (!s->WriteLine(ReplyLine(200, b.size(), "ok")).ok() || req.method == "HEAD") return;
    for (uint64_t off = 0; off < b.size(); off += kChunk) {
      const uint64_t n = std::min(kChunk, b.size() - off);
      if (!s->Write(b.data() + off, n).ok()) return;
      if (o_.on_peer_send) o_.on_peer_send(off + n);
    }
  }();
  std::lock_guard<std::mutex> lock(mu_);
  session_fds_.erase(fd);
}

bool Endpoint::MayPeerRead(const std::string& id, const std::string& peer,
                           const std::string& identity) const {
  for (const ReadGrant& g : o_.read_grants) {
    if ((g.reader == ObjectTable::kAnyPeer || g.reader == peer) && id.rfind(g.prefix, 0) == 0) {
      return true;
    }
  }
  return table_.MayRead(id, peer, identity);
}

void Endpoint::HandDialBack(int fd) {
  // "DIALED <token>\n", a byte at a time: the TLS session follows it.
  std::string line;
  char c = 0;
  while (line.size() < 256 && ::recv(fd, &c, 1, 0) == 1 && c != '\n') line.push_back(c);
  std::istringstream in(line);
  std::string verb, token;
  in >> verb >> token;
  std::lock_guard<std::mutex> lock(mu_);
  session_fds_.erase(fd);
  auto it = dial_backs_.find(token);
  if (verb != "DIALED" || it == dial_backs_.end() || it->second >= 0) {
    ::close(fd);
    return;
  }
  it->second = fd;  // AwaitDialBack owns it now
  cv_.notify_all();
}

Result<int> Endpoint::AwaitDialBack(const std::string& owner) {
  const std::string token = RandomSecret();
  {
    std::lock_guard<std::mutex> lock(mu_);
    dial_backs_[token] = -1;
  }
  auto forget = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = dial_backs_.find(token);
    int fd = it->second;
    dial_backs_.erase(it);
    return fd;
  };
  auto asked = AskRelay("REVERSE " + owner + " " + token);
  if (!asked.ok() || asked->rfind("DIALING ", 0) != 0) {
    int fd = forget();
    net::CloseFd(fd);
    return asked.ok() ? StatusOfRelayError(*asked) : asked.status();
  }
  // The owner tries each of our addresses for up to connect_timeout; the
  // relay's message to it and its thread start take the rest.
  const int naddrs = 1 + static_cast<int>(std::count(addrs_.begin(), addrs_.end(), ','));
  const auto wait = o_.connect_timeout * (naddrs + 1) + std::chrono::milliseconds(500);
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, wait, [&] { return stopping_ || dial_backs_[token] >= 0; });
  }
  int fd = forget();
  if (fd < 0) return Unavailable("endpoint " + owner + " did not dial back");
  if (stopping_) {
    net::CloseFd(fd);
    return Unavailable("stopping");
  }
  return fd;
}

Result<int> Endpoint::DialFirst(const std::string& addrs) const {
  std::istringstream list(addrs);
  std::string a;
  while (std::getline(list, a, ',')) {
    auto hp = net::ParseHostPort(a);
    if (!hp.ok()) continue;
    auto fd = net::ConnectTcp(*hp, o_.connect_timeout, o_.io_timeout);
    if (fd.ok()) return fd;
  }
  return Unavailable("no address of " + addrs + " accepted a connection");
}

bool Endpoint::RecentlyFailed(const std::string& owner, Path path) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = failed_paths_.find({owner, path});
  if (it == failed_paths_.end()) return false;
  if (std::chrono::steady_clock::now() - it->second < o_.path_memory) return true;
  failed_paths_.erase(it);
  return false;
}

void Endpoint::NoteFailed(const std::string& owner, Path path, const Status& why) {
  std::string what = std::string(PathName(path)) + " to " + owner + ": " + why.ToString();
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_paths_.size() > 4096) failed_paths_.clear();  // a bound, not a policy
  failed_paths_[{owner, path}] = std::chrono::steady_clock::now();
  KeepFailureLocked(std::move(what));
}

void Endpoint::NoteServeFailed(Path path, const Status& why) {
  std::string what = "serving " + std::string(PathName(path)) + ": " + why.ToString();
  std::lock_guard<std::mutex> lock(mu_);
  KeepFailureLocked(std::move(what));
}

void Endpoint::KeepFailureLocked(std::string what) {
  failures_.push_back(std::move(what));
  while (failures_.size() > kFailuresKept) failures_.pop_front();
}

std::vector<std::string> Endpoint::path_failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {failures_.begin(), failures_.end()};
}

Result<PeerReply> Endpoint::CallPeer(const std::string& owner, const std::string& method,
                                     const std::string& id, const GatherList* body) {
  if (o_.relay.empty()) {
    return Unavailable("endpoint " + owner + " is not this one and no relay is configured");
  }
  XSILO_ASSIGN_OR_RETURN(std::string peer, AskRelay("LOOKUP " + owner));
  std::istringstream in(peer);
  std::string verb, fp, addrs, ticket;
  in >> verb >> fp >> addrs >> ticket;
  if (verb != "PEER") return StatusOfRelayError(peer);

  auto pinned = [&](int fd, Path path) -> Result<PeerReply> {
    XSILO_ASSIGN_OR_RETURN(auto s, net::TlsStream::Connect(identity_->pinned_client_ctx(), fd, ""));
    if (s->peer_fingerprint() != fp) {
      return PermissionDenied("endpoint " + owner + " presented certificate " +
                              s->peer_fingerprint() + ", the relay vouched for " + fp);
    }
    auto r = Session(*s, method, id, body, ticket);
    if (!r.ok()) {
      return Unavailable("session with endpoint " + owner + " (" + PathName(path) +
                         ") broke: " + r.status().message());
    }
    r->path = path;
    served_[static_cast<int>(path)]++;
    return r;
  };

  // Direct: the first advertised address that accepts a connection.
  if (addrs != "-" && !RecentlyFailed(owner, Path::kDirect)) {
    auto fd = DialFirst(addrs);
    if (fd.ok()) return pinned(*fd, Path::kDirect);
    NoteFailed(owner, Path::kDirect, fd.status());
  }
  // Reverse: the owner cannot be dialled, but it can dial us.
  if (peer_fd_ >= 0 && addrs_ != "-" && !RecentlyFailed(owner, Path::kReverse)) {
    auto fd = AwaitDialBack(owner);
    if (fd.ok()) return pinned(*fd, Path::kReverse);
    NoteFailed(owner, Path::kReverse, fd.status());
  }
  // Punched: a UDP path both sides open through their NATs.
  if (o_.punch && !RecentlyFailed(owner, Path::kPunched)) {
    auto fd = Punch(owner);
    if (fd.ok()) return pinned(*fd, Path::kPunched);
    NoteFailed(owner, Path::kPunched, fd.status());
  }
  // Relayed: both sides dial out to the relay, which pipes the session.
  XSILO_ASSIGN_OR_RETURN(std::string pipe, AskRelay("RELAY " + owner));
  std::istringstream pin(pipe);
  std::string token;
  pin >> verb >> token;
  if (verb != "PIPE") return StatusOfRelayError(pipe);
  XSILO_ASSIGN_OR_RETURN(auto relay, net::ParseHostPort(o_.relay));
  XSILO_ASSIGN_OR_RETURN(int fd, net::ConnectTcp(relay, o_.connect_timeout, o_.io_timeout));
  std::string join = "JOIN " + token + " requester\n";
  Status sent = net::SendAll(fd, join.data(), join.size());
  if (!sent.ok()) {
    net::CloseFd(fd);
    return sent;
  }
  return pinned(fd, Path::kRelayed);
}

}  // namespace xsilo::endpoint
