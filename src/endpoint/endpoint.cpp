#include "endpoint/endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "net/http_server.h"
#include "net/socket.h"
#include "xsilo/core/secret.h"
#include "xsilo/store/connector.h"

namespace xsilo::endpoint {

const char* PathName(Path p) {
  switch (p) {
    case Path::kLocal:
      return "local";
    case Path::kDirect:
      return "direct";
    case Path::kReverse:
      return "reverse";
    case Path::kPunched:
      return "punched";
    case Path::kRelayed:
      return "relayed";
  }
  return "?";
}

namespace {

// A UUID (version 4 layout) from 128 random bits.
std::string NewUuid() {
  std::string hex = RandomObjectId();
  hex[12] = '4';
  return hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" +
         hex.substr(16, 4) + "-" + hex.substr(20, 12);
}

Result<std::string> LoadOrCreateUuid(const std::string& file) {
  if (file.empty()) return NewUuid();
  std::ifstream in(file);
  std::string uuid;
  if (in && std::getline(in, uuid)) {
    if (!ValidName(uuid)) return Corrupt("uuid file " + file + " holds no valid uuid");
    return uuid;
  }
  uuid = NewUuid();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
  std::ofstream out(file + ".tmp");
  out << uuid << "\n";
  out.close();
  if (!out || std::rename((file + ".tmp").c_str(), file.c_str()) != 0) {
    return Internal("cannot write uuid file " + file);
  }
  return uuid;
}

// A host the local API may listen on without a token: this machine only.
bool IsLoopback(const std::string& host) {
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  const std::string bare = host.size() > 2 && host.front() == '[' && host.back() == ']'
                               ? host.substr(1, host.size() - 2)
                               : host;
  return inet_pton(AF_INET6, bare.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

void Reply(net::HttpResponse* resp, int status, const std::string& text) {
  resp->status = status;
  resp->headers.emplace_back("Content-Type", "text/plain");
  resp->SetBody(text);
}

int HttpStatusOf(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kResourceExhausted:
      return 507;
    case StatusCode::kUnavailable:
    case StatusCode::kTimeout:
      return 503;
    default:
      return 500;
  }
}

// Value of `name` in a query string "a=b&c=d", or "".
std::string QueryValue(const std::string& query, const std::string& name) {
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    std::string part = query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
    if (part.rfind(name + "=", 0) == 0) return part.substr(name.size() + 1);
    if (amp == std::string::npos) break;
    pos = amp + 1;
  }
  return "";
}

}  // namespace

Endpoint::Endpoint(EndpointOptions o) : o_(std::move(o)), table_(o_.dir, o_.max_bytes) {}

Result<std::unique_ptr<Endpoint>> Endpoint::Start(EndpointOptions options) {
  std::unique_ptr<Endpoint> e(new Endpoint(std::move(options)));
  Status s = e->Init();
  if (!s.ok()) {
    e->Stop();
    return s;
  }
  return e;
}

Status Endpoint::Init() {
  for (const ReadGrant& g : o_.read_grants) {
    if (g.reader != ObjectTable::kAnyPeer && !ValidName(g.reader)) {
      return InvalidArgument("read grant for '" + g.reader +
                             "': the reader must be an endpoint uuid or *");
    }
  }
  XSILO_RETURN_IF_ERROR(table_.Open());
  std::string uuid_file = o_.uuid_file;
  if (uuid_file.empty() && !o_.dir.empty()) uuid_file = o_.dir + "/uuid";
  XSILO_ASSIGN_OR_RETURN(uuid_, LoadOrCreateUuid(uuid_file));
  std::string tls_dir = o_.dir.empty() ? "" : o_.dir + "/tls";
  if (tls_dir.empty()) {
    char tmpl[] = "/tmp/xsilo-endpoint-XXXXXX";
    if (!mkdtemp(tmpl)) return Internal("mkdtemp failed");
    tls_dir = tmpl;
  }
  XSILO_ASSIGN_OR_RETURN(
      identity_, net::TlsIdentity::LoadOrCreate(tls_dir, {"xsilo-endpoint-" + uuid_}, o_.relay_ca));
  if (o_.dir.empty()) std::filesystem::remove_all(tls_dir);  // loaded; nothing needs the files

  XSILO_ASSIGN_OR_RETURN(auto local, net::ParseHostPort(o_.listen));
  if (o_.token.empty() && !IsLoopback(local.host)) {
    return InvalidArgument("the local API would listen on " + o_.listen +
                           ", which is not loopback, without a token: anyone who reaches it "
                           "acts as this site (give --token-file, or listen on 127.0.0.1)");
  }
  net::HttpServerOptions ho;
  ho.host = local.host;
  ho.port = local.port;
  ho.io_timeout = o_.io_timeout;
  local_ = std::make_unique<net::HttpServer>(
      ho, [this](const net::HttpRequest& req, net::BodyReader& body, net::HttpResponse* resp) {
        HandleLocal(req, body, resp);
      });
  XSILO_RETURN_IF_ERROR(local_->Start());

  if (!o_.peer_listen.empty()) {
    XSILO_ASSIGN_OR_RETURN(auto hp, net::ParseHostPort(o_.peer_listen));
    XSILO_ASSIGN_OR_RETURN(peer_fd_, net::ListenTcp(hp, &peer_port_));
    if (o_.advertise.empty()) {
      o_.advertise.push_back(
          net::HostPort{hp.host.empty() ? "127.0.0.1" : hp.host, peer_port_}.ToString());
    }
    peer_acceptor_ = std::thread([this] { PeerAcceptLoop(); });
  }
  for (const auto& a : o_.advertise) {
    XSILO_RETURN_IF_ERROR(net::ParseHostPort(a).status());
    if (a.find(',') != std::string::npos || a.find(' ') != std::string::npos) {
      return InvalidArgument("advertised address '" + a + "' is malformed");
    }
    addrs_ += (addrs_.empty() ? "" : ",") + a;
  }
  if (addrs_.empty()) addrs_ = "-";

  if (!o_.relay.empty()) {
    XSILO_RETURN_IF_ERROR(net::ParseHostPort(o_.relay).status());
    relay_thread_ = std::thread([this] { RelayLoop(); });
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, o_.register_timeout, [&] { return register_tried_; });
  }
  return Status::OK();
}

Endpoint::~Endpoint() { Stop(); }

void Endpoint::Abort() {
  stopping_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (peer_fd_ >= 0) ::shutdown(peer_fd_, SHUT_RDWR);
  for (int fd : session_fds_) ::shutdown(fd, SHUT_RDWR);
  if (control_) control_->Interrupt();
  cv_.notify_all();
}

void Endpoint::Stop() {
  Abort();
  if (local_) local_->Stop();
  if (peer_acceptor_.joinable()) peer_acceptor_.join();
  if (relay_thread_.joinable()) relay_thread_.join();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return sessions_ == 0; });
  control_.reset();
  net::CloseFd(peer_fd_);
}

int Endpoint::port() const { return local_ ? local_->port() : 0; }

bool Endpoint::registered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !secret_.empty();
}

std::string Endpoint::StatusJson() const {
  return "{\"uuid\":\"" + uuid_ + "\",\"fingerprint\":\"" + identity_->fingerprint() +
         "\",\"registered\":" + (registered() ? "true" : "false") +
         ",\"objects\":" + std::to_string(table_.objects()) +
         ",\"bytes\":" + std::to_string(table_.bytes()) +
         ",\"served\":{\"local\":" + std::to_string(served(Path::kLocal)) +
         ",\"direct\":" + std::to_string(served(Path::kDirect)) +
         ",\"reverse\":" + std::to_string(served(Path::kReverse)) +
         ",\"punched\":" + std::to_string(served(Path::kPunched)) +
         ",\"relayed\":" + std::to_string(served(Path::kRelayed)) + "}}";
}

void Endpoint::HandleLocal(const net::HttpRequest& req, net::BodyReader& body,
                           net::HttpResponse* resp) {
  if (!o_.token.empty()) {
    const std::string* auth = req.Header("authorization");
    if (auth == nullptr || !SecretEquals(*auth, "Bearer " + o_.token)) {
      resp->headers.emplace_back("WWW-Authenticate", "Bearer");
      return Reply(resp, 401, "the local API needs its token (token_file)");
    }
  }
  resp->headers.emplace_back("X-Xsilo-Endpoint", uuid_);
  if (req.raw_path == "/uuid" && req.method == "GET") return Reply(resp, 200, uuid_);
  if (req.raw_path == "/status" && req.method == "GET") {
    resp->headers.emplace_back("Content-Type", "application/json");
    resp->SetBody(StatusJson());
    return;
  }
  const std::string prefix = "/objects/";
  if (req.raw_path.rfind(prefix, 0) != 0) return Reply(resp, 404, "no such resource");
  const std::string id = req.raw_path.substr(prefix.size());
  std::string owner = QueryValue(req.raw_query, "endpoint");
  if (owner.empty()) owner = uuid_;
  if (!ValidName(id) || !ValidName(owner)) {
    resp->close = body.pending();
    return Reply(resp, 400, "invalid object id or endpoint uuid");
  }
  const std::string& m = req.method;
  if (m != "GET" && m != "HEAD" && m != "PUT" && m != "DELETE") {
    resp->close = body.pending();
    return Reply(resp, 405, "method not allowed");
  }

  // readers=UUID,UUID|*: the peers that may read this object besides its
  // writer (docs/endpoint.md "Trust"). For this endpoint's own objects only:
  // a peer's object is readable by its writer and the grants of its owner.
  std::vector<std::string> readers;
  if (const std::string list = QueryValue(req.raw_query, "readers"); !list.empty()) {
    if (m != "PUT" || owner != uuid_) {
      resp->close = body.pending();
      return Reply(resp, 400, "readers= applies to a PUT of this endpoint's own objects");
    }
    for (size_t pos = 0; pos <= list.size();) {
      size_t comma = list.find(',', pos);
      std::string r =
          list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      if (r != ObjectTable::kAnyPeer && !ValidName(r)) {
        resp->close = body.pending();
        return Reply(resp, 400, "readers= names an invalid endpoint uuid '" + r + "'");
      }
      readers.push_back(std::move(r));
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  }

  if (owner != uuid_) {
    Buffer upload;
    GatherList g;
    if (m == "PUT") {
      auto b = body.ReadAll(req.content_length, nullptr);
      if (!b.ok()) {
        resp->close = true;
        return Reply(resp, HttpStatusOf(b.status()), b.status().message());
      }
      g.Append(std::move(b).value());
    }
    auto r = CallPeer(owner, m, id, m == "PUT" ? &g : nullptr);
    if (!r.ok()) return Reply(resp, HttpStatusOf(r.status()), r.status().message());
    resp->headers.emplace_back("X-Xsilo-Path", PathName(r->path));
    if (r->status != 200 && r->status != 201 && r->status != 204) {
      return Reply(resp, r->status, r->message);
    }
    resp->status = r->status;
    if (m == "GET") {
      resp->SetBody(std::vector<Buffer>{std::move(r->body)});
    } else if (m == "HEAD") {
      resp->content_length = r->bytes;
      resp->omit_body = true;
    }
    return;
  }

  served_[static_cast<int>(Path::kLocal)]++;
  resp->headers.emplace_back("X-Xsilo-Path", "local");
  if (m == "PUT") {
    const uint64_t size = req.content_length;
    Status reserved =
        req.chunked ? InvalidArgument("chunked uploads are not accepted") : table_.Reserve(size);
    if (!reserved.ok()) {
      resp->close = body.pending();
      return Reply(resp, HttpStatusOf(reserved), reserved.message());
    }
    auto b = body.ReadAll(size, nullptr);
    if (!b.ok()) {
      table_.Abandon(size);
      resp->close = true;
      return Reply(resp, HttpStatusOf(b.status()), b.status().message());
    }
    Status s = table_.Commit(id, std::move(b).value(), ObjectTable::kSite, std::move(readers));
    if (!s.ok()) return Reply(resp, HttpStatusOf(s), s.message());
    resp->status = 201;
    return;
  }
  if (m == "DELETE") {
    Status erased = table_.Erase(id);  // the site's own call: always its right
    if (!erased.ok()) return Reply(resp, HttpStatusOf(erased), erased.message());
    resp->status = 204;
    return;
  }
  auto got = table_.Get(id);
  if (!got.ok()) return Reply(resp, HttpStatusOf(got.status()), got.status().message());
  if (!got->has_value()) return Reply(resp, 404, "no object " + id);
  if (m == "HEAD") {
    resp->content_length = (*got)->size();
    resp->omit_body = true;
    return;
  }
  resp->SetBody(std::vector<Buffer>{std::move(**got)});
}

}  // namespace xsilo::endpoint
