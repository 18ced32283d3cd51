// endpoint: objects held by per-site endpoints (`xsilo endpoint start`,
// docs/endpoint.md). The connector is a client of the LOCAL endpoint's HTTP
// API; a key names the endpoint that owns the object (attrs.endpoint, its
// UUID), and the local endpoint reaches that owner (directly or through the
// relay) when it is another one. Options:
//   address     host:port of the local endpoint's API (required)
//   timeout_ms  default 60000: connect, and each blocked send/recv
//   put_to      default none: puts (and NewKey) make objects owned by this
//               endpoint UUID, reached through the local endpoint, instead
//               of by the local one (a site that keeps no objects itself)
//   token_file  default none: a file (mode 600) holding the local API's token
//               (`xsilo endpoint start --token-file`), sent with every call.
//               config() carries the path, never the token.
//   readers     default "*": the peer endpoints that may read the objects this
//               connector puts on its own endpoint: "*" (every peer the relay
//               vouches for, so a reference resolves on any site), a comma
//               list of endpoint UUIDs, or "" (this site only, plus the
//               endpoint's --grant prefixes). Objects put_to another endpoint
//               are readable by this site and by that endpoint's grants.
#include <chrono>
#include <mutex>

#include "net/http_client.h"
#include "store/builtin.h"
#include "xsilo/core/secret.h"

namespace xsilo {

namespace {

using net::HostPort;
using net::HttpCall;
using net::HttpReply;
using net::StatusOfReply;

bool ValidToken(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  }
  return true;
}

class EndpointConnector final : public Connector {
 public:
  EndpointConnector(std::string address, HostPort server, int timeout_ms, std::string put_to,
                    std::string readers, std::string token_file, std::string token)
      : address_(std::move(address)),
        server_(std::move(server)),
        timeout_(timeout_ms),
        put_to_(std::move(put_to)),
        readers_(std::move(readers)),
        token_file_(std::move(token_file)),
        token_(std::move(token)) {}

  std::string_view type() const override { return "endpoint"; }
  ConnectorConfig config() const override {
    ConnectorOptions m = {{"address", address_}, {"timeout_ms", std::to_string(timeout_.count())}};
    if (!put_to_.empty()) m["put_to"] = put_to_;
    m["readers"] = readers_;
    if (!token_file_.empty()) m["token_file"] = token_file_;  // the path: the token stays here
    return {"endpoint", m};
  }

  Result<Key> Put(const GatherList& bytes) override {
    Key key{"endpoint", RandomObjectId(), bytes.size, {}};
    XSILO_ASSIGN_OR_RETURN(
        HttpReply r,
        Call("PUT", put_to_.empty() ? OwnTarget(key.id) : Target(key.id, put_to_), &bytes));
    if (r.status != 201 && r.status != 200) return StatusOfReply(r, "endpoint put " + key.id);
    if (!put_to_.empty()) {
      key.attrs["endpoint"] = put_to_;
      return key;
    }
    auto owner = r.headers.find("x-xsilo-endpoint");
    if (owner == r.headers.end()) return Corrupt("endpoint put reply names no endpoint");
    key.attrs["endpoint"] = owner->second;
    return key;
  }

  Result<Key> NewKey() override {
    if (!put_to_.empty()) return Key{"endpoint", RandomObjectId(), 0, {{"endpoint", put_to_}}};
    XSILO_ASSIGN_OR_RETURN(std::string uuid, LocalUuid());
    return Key{"endpoint", RandomObjectId(), 0, {{"endpoint", uuid}}};
  }

  Status Set(const Key& key, const GatherList& bytes) override {
    XSILO_ASSIGN_OR_RETURN(std::string owner, OwnerOf(key));
    XSILO_ASSIGN_OR_RETURN(std::string local, LocalUuid());
    XSILO_ASSIGN_OR_RETURN(
        HttpReply r,
        Call("PUT", owner == local ? OwnTarget(key.id) : Target(key.id, owner), &bytes));
    if (r.status != 201 && r.status != 200) return StatusOfReply(r, "endpoint set " + key.id);
    return Status::OK();
  }

  Result<std::optional<Buffer>> Get(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(std::string owner, OwnerOf(key));
    XSILO_ASSIGN_OR_RETURN(HttpReply r, Call("GET", Target(key.id, owner), nullptr));
    if (r.status == 404) return std::optional<Buffer>();
    if (r.status != 200) return StatusOfReply(r, "endpoint get " + key.id);
    return std::optional<Buffer>(std::move(r.body));
  }

  Result<bool> Exists(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(std::string owner, OwnerOf(key));
    XSILO_ASSIGN_OR_RETURN(HttpReply r, Call("HEAD", Target(key.id, owner), nullptr));
    if (r.status == 404) return false;
    if (r.status != 200) return StatusOfReply(r, "endpoint exists " + key.id);
    return true;
  }

  Status Evict(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(std::string owner, OwnerOf(key));
    XSILO_ASSIGN_OR_RETURN(HttpReply r, Call("DELETE", Target(key.id, owner), nullptr));
    if (r.status != 204 && r.status != 200 && r.status != 404) {
      return StatusOfReply(r, "endpoint evict " + key.id);
    }
    return Status::OK();
  }

 private:
  Result<std::string> OwnerOf(const Key& key) const {
    if (key.connector != "endpoint") {
      return InvalidArgument("key of connector '" + key.connector +
                             "' given to an endpoint connector");
    }
    auto it = key.attrs.find("endpoint");
    if (it == key.attrs.end() || !ValidToken(it->second)) {
      return InvalidArgument("endpoint key " + key.id + " names no valid owning endpoint");
    }
    if (!ValidToken(key.id)) return InvalidArgument("endpoint key id '" + key.id + "' is invalid");
    return it->second;
  }

  static std::string Target(const std::string& id, const std::string& owner) {
    return "/objects/" + id + (owner.empty() ? "" : "?endpoint=" + owner);
  }
  // A PUT of one of the local endpoint's own objects, naming its readers.
  std::string OwnTarget(const std::string& id) const {
    return "/objects/" + id + (readers_.empty() ? "" : "?readers=" + readers_);
  }

  Result<HttpReply> Call(const std::string& method, const std::string& target,
                         const GatherList* body) {
    auto r = HttpCall(server_, method, target, body, timeout_, token_);
    if (!r.ok()) return r.status().WithContext("endpoint at " + address_);
    return r;
  }

  Result<std::string> LocalUuid() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!uuid_.empty()) return uuid_;
    }
    XSILO_ASSIGN_OR_RETURN(HttpReply r, Call("GET", "/uuid", nullptr));
    if (r.status != 200) return StatusOfReply(r, "endpoint uuid");
    std::string uuid(r.body.view());
    if (!ValidToken(uuid)) return Corrupt("endpoint at " + address_ + " has an invalid uuid");
    std::lock_guard<std::mutex> lock(mu_);
    uuid_ = uuid;
    return uuid_;
  }

  const std::string address_;
  const HostPort server_;
  const std::chrono::milliseconds timeout_;
  const std::string put_to_;
  const std::string readers_;
  const std::string token_file_, token_;  // the local API's token, and where it was read
  std::mutex mu_;
  std::string uuid_;  // the local endpoint's, once asked
};

}  // namespace

Result<std::unique_ptr<Connector>> MakeEndpointConnector(const ConnectorOptions& options) {
  const OptionTable& t = EndpointConnectorOptionTable();
  XSILO_RETURN_IF_ERROR(t.CheckKeys(options));
  if (!t.Has(options, "address")) {
    return InvalidArgument("endpoint connector needs option 'address'");
  }
  const std::string address = t.String(options, "address");
  XSILO_ASSIGN_OR_RETURN(HostPort hp, net::ParseHostPort(address));
  XSILO_ASSIGN_OR_RETURN(int64_t timeout, t.Int(options, "timeout_ms"));
  std::string put_to;
  if (t.Has(options, "put_to")) {
    put_to = t.String(options, "put_to");
    if (!ValidToken(put_to)) return InvalidArgument("endpoint option put_to is not a valid uuid");
  }
  std::string readers = t.String(options, "readers");
  {
    for (size_t pos = 0; !readers.empty() && pos <= readers.size();) {
      size_t comma = readers.find(',', pos);
      std::string one =
          readers.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      if (one != "*" && !ValidToken(one)) {
        return InvalidArgument("endpoint option readers: '" + one +
                               "' is neither \"*\" nor an endpoint uuid");
      }
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  }
  std::string token_file, token;
  if (t.Has(options, "token_file")) {
    token_file = t.String(options, "token_file");
    auto read = ReadSecretFile(token_file);
    if (!read.ok()) return read.status().WithContext("endpoint connector token_file");
    token = *std::move(read);
  }
  return std::unique_ptr<Connector>(
      new EndpointConnector(address, std::move(hp), static_cast<int>(timeout), put_to,
                            std::move(readers), std::move(token_file), std::move(token)));
}

}  // namespace xsilo
