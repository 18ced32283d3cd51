// zmq: objects kept in the memory of the process that put them, served to
// other processes by that process's object server over ZeroMQ (after
// ProxyStore's ZeroMQConnector). docs/store.md, "The zmq connector".
//
// A key is {connector "zmq", id, size, attrs {addr: "tcp://host:port"}}:
// the address of the server holding the object. A key whose server lives
// in this process is served from memory; any other is a request to that
// server. Options:
//   host         default 127.0.0.1; the server binds it and keys carry it,
//                so it must be an address other processes can dial
//   port         default 0 (an ephemeral port); config() records the port
//                bound
//   role         "server" (default): bind host:port now; "client": never
//                bind `port` (it names the server the config came from),
//                start an own server on an ephemeral port at the first
//                Put or NewKey. config() always says "client".
//   timeout_ms   default 30000; the longest wait for any reply frame
//   max_bytes    default 0 (no bound); bytes the own server holds
//   chunk_bytes  default 1048576 (1 MiB), at most 1 GiB; data frame size
#include <memory>
#include <mutex>

#include "store/builtin.h"
#include "store/zmq/object_server.h"
#include "store/zmq/remote_client.h"

namespace xsilo {

namespace {

using zmq_store::ObjectServer;
using zmq_store::RemoteClient;
using zmq_store::ServerOptions;

struct ZmqOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  bool client = false;
  int timeout_ms = 30000;
  uint64_t max_bytes = 0;
  uint64_t chunk_bytes = 1ull << 20;
};

class ZmqConnector final : public Connector {
 public:
  ZmqConnector(ZmqOptions o, std::shared_ptr<ObjectServer> server)
      : o_(std::move(o)), server_(std::move(server)), client_(o_.timeout_ms, o_.chunk_bytes) {}
  ~ZmqConnector() override { Close(); }

  std::string_view type() const override { return "zmq"; }

  ConnectorConfig config() const override {
    int port = o_.port;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (server_) port = server_->port();
    }
    return {"zmq",
            {{"host", o_.host},
             {"port", std::to_string(port)},
             {"role", "client"},
             {"timeout_ms", std::to_string(o_.timeout_ms)},
             {"max_bytes", std::to_string(o_.max_bytes)},
             {"chunk_bytes", std::to_string(o_.chunk_bytes)}}};
  }

  Result<Key> Put(const GatherList& bytes) override {
    XSILO_ASSIGN_OR_RETURN(auto server, OwnServer());
    Key key{"zmq", RandomObjectId(), bytes.size, {{"addr", server->address()}}};
    XSILO_ASSIGN_OR_RETURN(Buffer flat, Contiguous(bytes));
    XSILO_RETURN_IF_ERROR(server->Store(key.id, std::move(flat)));
    return key;
  }

  Result<Key> NewKey() override {
    XSILO_ASSIGN_OR_RETURN(auto server, OwnServer());
    return Key{"zmq", RandomObjectId(), 0, {{"addr", server->address()}}};
  }

  Status Set(const Key& key, const GatherList& bytes) override {
    XSILO_ASSIGN_OR_RETURN(std::string addr, Address(key));
    if (auto local = ObjectServer::Find(addr)) {
      XSILO_ASSIGN_OR_RETURN(Buffer flat, Contiguous(bytes));
      return local->Store(key.id, std::move(flat));
    }
    return client_.Set(addr, key.id, bytes);
  }

  Result<std::optional<Buffer>> Get(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(std::string addr, Address(key));
    if (auto local = ObjectServer::Find(addr)) return local->Lookup(key.id);
    return client_.Get(addr, key.id);
  }

  Result<bool> Exists(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(std::string addr, Address(key));
    if (auto local = ObjectServer::Find(addr)) return local->Contains(key.id);
    return client_.Exists(addr, key.id);
  }

  Status Evict(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(std::string addr, Address(key));
    if (auto local = ObjectServer::Find(addr)) {
      local->Erase(key.id);
      return Status::OK();
    }
    return client_.Evict(addr, key.id);
  }

  // Drops this connector's share of its server: the last connector sharing
  // it stops the serving thread, and its objects go with it.
  void Close() override {
    std::shared_ptr<ObjectServer> server;
    {
      std::lock_guard<std::mutex> lock(mu_);
      server = std::move(server_);
      closed_ = true;
    }
    server.reset();
    client_.Close();
  }

 private:
  // A single Buffer is stored as it is (no copy): callers must not modify
  // bytes they put.
  static Result<Buffer> Contiguous(const GatherList& bytes) {
    if (bytes.segments.size() == 1) return bytes.segments[0];
    return bytes.Flatten();
  }

  static Result<std::string> Address(const Key& key) {
    if (key.connector != "zmq") {
      return InvalidArgument("key of connector '" + key.connector + "' given to a zmq connector");
    }
    if (key.id.empty() || key.id.size() > zmq_store::kMaxIdBytes) {
      return InvalidArgument("zmq key id must be 1 to " + std::to_string(zmq_store::kMaxIdBytes) +
                             " bytes");
    }
    auto it = key.attrs.find("addr");
    if (it == key.attrs.end() || !zmq_store::IsTcpAddress(it->second)) {
      return InvalidArgument("zmq key " + key.id + " has no server address (attr addr)");
    }
    return it->second;
  }

  // The server this connector's Puts go to; a client starts one on first use.
  Result<std::shared_ptr<ObjectServer>> OwnServer() {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return FailedPrecondition("zmq connector is closed");
    if (!server_) {
      ServerOptions so;
      so.host = o_.host;
      so.port = 0;
      so.max_bytes = o_.max_bytes;
      so.chunk_bytes = o_.chunk_bytes;
      so.timeout_ms = o_.timeout_ms;
      XSILO_ASSIGN_OR_RETURN(server_, ObjectServer::Start(so));
    }
    return server_;
  }

  const ZmqOptions o_;
  mutable std::mutex mu_;
  std::shared_ptr<ObjectServer> server_;
  bool closed_ = false;
  RemoteClient client_;
};

}  // namespace

Result<std::unique_ptr<Connector>> MakeZmqConnector(const ConnectorOptions& options) {
  const OptionTable& t = ZmqConnectorOptionTable();
  XSILO_RETURN_IF_ERROR(t.CheckKeys(options));
  ZmqOptions o;
  o.host = t.String(options, "host");
  if (o.host.empty()) return InvalidArgument("zmq option host must not be empty");
  XSILO_ASSIGN_OR_RETURN(std::string role, t.Enum(options, "role"));
  o.client = role == "client";
  XSILO_ASSIGN_OR_RETURN(int64_t port, t.Int(options, "port"));
  XSILO_ASSIGN_OR_RETURN(int64_t timeout, t.Int(options, "timeout_ms"));
  XSILO_ASSIGN_OR_RETURN(int64_t max_bytes, t.Int(options, "max_bytes"));
  XSILO_ASSIGN_OR_RETURN(int64_t chunk, t.Int(options, "chunk_bytes"));
  o.port = static_cast<int>(port);
  o.timeout_ms = static_cast<int>(timeout);
  o.max_bytes = static_cast<uint64_t>(max_bytes);
  o.chunk_bytes = static_cast<uint64_t>(chunk);
  std::shared_ptr<ObjectServer> server;
  if (!o.client) {
    ServerOptions so;
    so.host = o.host;
    so.port = o.port;
    so.max_bytes = o.max_bytes;
    so.chunk_bytes = o.chunk_bytes;
    so.timeout_ms = o.timeout_ms;
    XSILO_ASSIGN_OR_RETURN(server, ObjectServer::Start(so));
  }
  return std::unique_ptr<Connector>(
      std::make_unique<ZmqConnector>(std::move(o), std::move(server)));
}

}  // namespace xsilo
