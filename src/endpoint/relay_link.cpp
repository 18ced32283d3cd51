// An endpoint's link to the relay: the registration it keeps (and renews
// when the relay goes away), the sessions the relay asks it to serve, and
// one-shot requests (LOOKUP, RELAY).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <sstream>

#include "endpoint/endpoint.h"
#include "endpoint/punch.h"
#include "endpoint/ticket.h"
#include "net/socket.h"

namespace xsilo::endpoint {

Result<std::unique_ptr<net::TlsStream>> Endpoint::DialRelay() {
  XSILO_ASSIGN_OR_RETURN(auto hp, net::ParseHostPort(o_.relay));
  XSILO_ASSIGN_OR_RETURN(int fd, net::ConnectTcp(hp, o_.connect_timeout, o_.io_timeout));
  auto s = net::TlsStream::Connect(identity_->relay_client_ctx(), fd, hp.host);
  if (!s.ok()) return s.status().WithContext("relay " + o_.relay);
  return s;
}

Result<std::string> Endpoint::AskRelay(const std::string& line) {
  XSILO_ASSIGN_OR_RETURN(auto s, DialRelay());
  XSILO_RETURN_IF_ERROR(s->WriteLine(line));
  auto reply = s->ReadLine();
  if (!reply.ok()) return Unavailable("relay " + o_.relay + " gave no answer");
  return reply;
}

Status Endpoint::RegisterOnce(std::shared_ptr<net::TlsStream>* control) {
  XSILO_ASSIGN_OR_RETURN(auto s, DialRelay());
  XSILO_RETURN_IF_ERROR(s->WriteLine("REGISTER " + uuid_ + " " + addrs_));
  XSILO_ASSIGN_OR_RETURN(std::string reply, s->ReadLine());
  std::istringstream in(reply);
  std::string verb, secret;
  in >> verb >> secret;
  if (verb != "OK" || secret.empty()) return PermissionDenied("relay refused: " + reply);
  // The control session waits for SERVE lines as long as it lives.
  ::timeval none{0, 0};
  setsockopt(s->fd(), SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  // It is otherwise silent both ways: TCP keepalives find a relay that
  // vanished, or a NAT mapping that expired, within about a minute, and the
  // read below then fails and the endpoint registers again.
  int on = 1, idle_s = 30, interval_s = 10, probes = 3;
  setsockopt(s->fd(), SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  setsockopt(s->fd(), IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  setsockopt(s->fd(), IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  setsockopt(s->fd(), IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  std::lock_guard<std::mutex> lock(mu_);
  secret_ = secret;
  control_ = std::move(s);
  *control = control_;
  if (stopping_) control_->Interrupt();
  return Status::OK();
}

void Endpoint::RelayLoop() {
  auto backoff = std::chrono::milliseconds(100);
  while (!stopping_) {
    std::shared_ptr<net::TlsStream> control;
    Status s = RegisterOnce(&control);
    {
      std::lock_guard<std::mutex> lock(mu_);
      register_tried_ = true;
      cv_.notify_all();
    }
    if (s.ok()) {
      backoff = std::chrono::milliseconds(100);
      while (!stopping_) {
        auto line = control->ReadLine();
        if (!line.ok()) break;
        std::istringstream in(*line);
        std::string verb, token, addrs;
        in >> verb >> token >> addrs;
        if (verb == "SERVE" && !token.empty()) {
          RunSession([this, token] { ServeRelayed(token); });
        } else if (verb == "PUNCH" && ValidName(token) && !addrs.empty()) {
          RunSession([this, token, desc = addrs] { ServePunch(token, desc); });
        } else if (verb == "DIAL" && ValidName(token) && !addrs.empty()) {
          RunSession([this, token, addrs] { ServeDialBack(token, addrs); });
        }
      }
      std::lock_guard<std::mutex> lock(mu_);
      secret_.clear();
      control_.reset();
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, backoff, [&] { return stopping_.load(); });
    backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
  }
}

void Endpoint::ServeRelayed(const std::string& token) {
  auto hp = net::ParseHostPort(o_.relay);
  if (!hp.ok()) return NoteServeFailed(Path::kRelayed, hp.status());
  auto fd = net::ConnectTcp(*hp, o_.connect_timeout, o_.io_timeout);
  if (!fd.ok()) return NoteServeFailed(Path::kRelayed, fd.status());
  ServeDialled(*fd, "JOIN " + token + " owner\n");
}

void Endpoint::ServeDialBack(const std::string& token, const std::string& addrs) {
  auto fd = DialFirst(addrs);
  if (!fd.ok()) return NoteServeFailed(Path::kReverse, fd.status());
  ServeDialled(*fd, "DIALED " + token + "\n");
}

PunchOptions Endpoint::PunchOptionsFor(bool controlling) const {
  PunchOptions p;
  auto hp = net::ParseHostPort(o_.relay);
  if (hp.ok()) {
    p.stun_host = hp->host;
    p.stun_port = hp->port;
  }
  p.controlling = controlling;
  p.connect_timeout = o_.punch_timeout;
  p.io_timeout = o_.io_timeout;
  return p;
}

Result<int> Endpoint::Punch(const std::string& owner) {
  XSILO_ASSIGN_OR_RETURN(auto path, PunchedPath::Gather(PunchOptionsFor(true)));
  const std::string token = RandomSecret();
  XSILO_ASSIGN_OR_RETURN(std::string reply,
                         AskRelay("PUNCH " + owner + " " + token + " " + path->description()));
  std::istringstream in(reply);
  std::string verb, desc;
  in >> verb >> desc;
  if (verb != "PUNCHED" || desc.empty()) return Unavailable("relay: " + reply);
  XSILO_ASSIGN_OR_RETURN(int fd, path->Connect(desc));
  net::SetIoTimeout(fd, o_.io_timeout);
  return fd;
}

void Endpoint::ServePunch(const std::string& token, const std::string& description) {
  auto path = PunchedPath::Gather(PunchOptionsFor(false));
  if (!path.ok()) return NoteServeFailed(Path::kPunched, path.status());
  auto answered = AskRelay("ANSWER " + token + " " + (*path)->description());
  if (!answered.ok()) return NoteServeFailed(Path::kPunched, answered.status());
  if (*answered != "OK") return NoteServeFailed(Path::kPunched, Unavailable("relay: " + *answered));
  auto fd = (*path)->Connect(description);
  if (!fd.ok()) return NoteServeFailed(Path::kPunched, fd.status());
  net::SetIoTimeout(*fd, o_.io_timeout);
  ServeDialled(*fd, "");
}

void Endpoint::ServeDialled(int fd, const std::string& hello) {
  if (!hello.empty() && !net::SendAll(fd, hello.data(), hello.size()).ok()) {
    net::CloseFd(fd);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    session_fds_.insert(fd);
    if (stopping_) ::shutdown(fd, SHUT_RDWR);
  }
  // The requester opens the session: this side is the TLS server.
  auto s = net::TlsStream::Accept(identity_->server_ctx(), fd);
  if (s.ok()) {
    ServePeerSession(std::move(s).value());
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    session_fds_.erase(fd);
  }
}

}  // namespace xsilo::endpoint
