// ucx: objects served by the process that put them, fetched over UCP.
//
// Each connector runs a UCP worker with a progress thread and a listener on
// host:port (at construction, or at the first put with serve=on_put) that
// serves the objects it put from memory.
// A key names the server holding the object (attr "address" = host:port), so
// any process holding the key and a ucx config fetches it from there. A
// connector rebuilt from config() does not bind the original port: it is a
// client of the servers its keys name, and starts its own server (on an
// ephemeral port) when it first puts. Options (docs/store.md, "ucx"):
//   host         default 127.0.0.1, the address served on and put in keys
//   port         default 0 (ephemeral); config() records the bound one
//   serve        "now" (default: listen at construction) or "on_put"
//   timeout_ms   default 30000, longest wait without progress
//   max_bytes    default 0 (unbounded), bytes this process's server holds
//   chunk_bytes  default 67108864 (64 MiB), largest piece of a transfer
//   tls          default "tcp", UCX transports (UCX_TLS); "" keeps UCX's
//                own choice (the environment's UCX_TLS, else all)
#include <mutex>

#include "store/builtin.h"
#include "store/ucx/ucx_worker.h"

namespace xsilo {

namespace {

using ucx::Op;
using ucx::ReplyStatus;

struct UcxOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  bool serve_now = true;
  int timeout_ms = 30000;
  uint64_t max_bytes = 0;
  uint64_t chunk_bytes = 64ull << 20;
  std::string tls = "tcp";
};

class UcxConnector final : public Connector {
 public:
  static Result<std::unique_ptr<Connector>> Make(UcxOptions o) {
    auto table = std::make_shared<ucx::ObjectTable>(o.max_bytes);
    ucx::WorkerOptions w;
    w.tls = o.tls;
    w.chunk_bytes = o.chunk_bytes;
    w.timeout = std::chrono::milliseconds(o.timeout_ms);
    XSILO_ASSIGN_OR_RETURN(auto worker, ucx::Worker::Start(w, table));
    std::unique_ptr<UcxConnector> c(new UcxConnector(std::move(o), table, std::move(worker)));
    if (c->o_.serve_now) {
      std::lock_guard<std::mutex> lock(c->mu_);
      XSILO_RETURN_IF_ERROR(c->ListenLocked(c->o_.port));
    }
    return std::unique_ptr<Connector>(std::move(c));
  }

  ~UcxConnector() override { Close(); }

  std::string_view type() const override { return "ucx"; }

  ConnectorConfig config() const override {
    int port = o_.port;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (o_.serve_now && bound_port_ != 0) port = bound_port_;
    }
    // A rebuilt connector serves only what it puts, on a port of its own.
    return {"ucx",
            {{"host", o_.host},
             {"port", std::to_string(port)},
             {"serve", "on_put"},
             {"timeout_ms", std::to_string(o_.timeout_ms)},
             {"max_bytes", std::to_string(o_.max_bytes)},
             {"chunk_bytes", std::to_string(o_.chunk_bytes)},
             {"tls", o_.tls}}};
  }

  Result<Key> Put(const GatherList& bytes) override {
    XSILO_ASSIGN_OR_RETURN(std::string address, ServingAddress());
    Key key{"ucx", RandomObjectId(), bytes.size, {{"address", address}}};
    XSILO_RETURN_IF_ERROR(StoreLocal(key.id, bytes));
    return key;
  }

  Result<Key> NewKey() override {
    XSILO_ASSIGN_OR_RETURN(std::string address, ServingAddress());
    return Key{"ucx", RandomObjectId(), 0, {{"address", address}}};
  }

  Status Set(const Key& key, const GatherList& bytes) override {
    XSILO_ASSIGN_OR_RETURN(std::string address, CheckKey(key));
    if (IsLocal(address)) return StoreLocal(key.id, bytes);
    XSILO_ASSIGN_OR_RETURN(ucx::CallResult r,
                           worker_->Call(address, {Op::kSet, bytes.size, key.id}, bytes));
    if (r.reply.status == ReplyStatus::kResourceExhausted) {
      return ResourceExhausted("ucx server at " + address + " has no room for " +
                               std::to_string(bytes.size) + " bytes (max_bytes)");
    }
    return Expect(r, ReplyStatus::kOk, address);
  }

  Result<std::optional<Buffer>> Get(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(std::string address, CheckKey(key));
    if (IsLocal(address)) {
      std::optional<GatherList> object = table_->Find(key.id);
      if (!object) return std::optional<Buffer>();
      if (object->segments.size() == 1) return std::optional<Buffer>(object->segments[0]);
      if (object->size == 0) return std::optional<Buffer>(Buffer());
      XSILO_ASSIGN_OR_RETURN(Buffer flat, object->Flatten());
      return std::optional<Buffer>(std::move(flat));
    }
    XSILO_ASSIGN_OR_RETURN(ucx::CallResult r,
                           worker_->Call(address, {Op::kGet, 0, key.id}, GatherList{}));
    if (r.reply.status == ReplyStatus::kNotFound) return std::optional<Buffer>();
    XSILO_RETURN_IF_ERROR(Expect(r, ReplyStatus::kOk, address));
    return std::optional<Buffer>(std::move(r.data));
  }

  Result<bool> Exists(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(std::string address, CheckKey(key));
    if (IsLocal(address)) return table_->Contains(key.id);
    XSILO_ASSIGN_OR_RETURN(ucx::CallResult r,
                           worker_->Call(address, {Op::kExists, 0, key.id}, GatherList{}));
    XSILO_RETURN_IF_ERROR(Expect(r, ReplyStatus::kOk, address));
    if (r.reply.size > 1) return Corrupt("ucx: malformed exists reply from " + address);
    return r.reply.size == 1;
  }

  Status Evict(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(std::string address, CheckKey(key));
    if (IsLocal(address)) {
      table_->Erase(key.id);
      return Status::OK();
    }
    XSILO_ASSIGN_OR_RETURN(ucx::CallResult r,
                           worker_->Call(address, {Op::kEvict, 0, key.id}, GatherList{}));
    return Expect(r, ReplyStatus::kOk, address);
  }

  void Close() override { worker_->Stop(); }

 private:
  UcxConnector(UcxOptions o, std::shared_ptr<ucx::ObjectTable> table,
               std::unique_ptr<ucx::Worker> worker)
      : o_(std::move(o)), table_(std::move(table)), worker_(std::move(worker)) {}

  Status ListenLocked(int port) {
    XSILO_ASSIGN_OR_RETURN(int bound, worker_->Listen(o_.host, port));
    bound_port_ = bound;
    bool v6 = o_.host.find(':') != std::string::npos;
    address_ = (v6 ? "[" + o_.host + "]" : o_.host) + ":" + std::to_string(bound);
    return Status::OK();
  }

  // This process's server address, starting the server if it is not up.
  Result<std::string> ServingAddress() {
    std::lock_guard<std::mutex> lock(mu_);
    if (address_.empty()) XSILO_RETURN_IF_ERROR(ListenLocked(0));
    return address_;
  }

  bool IsLocal(const std::string& address) const {
    std::lock_guard<std::mutex> lock(mu_);
    return !address_.empty() && address == address_;
  }

  Status StoreLocal(const std::string& id, const GatherList& bytes) {
    if (!table_->Reserve(bytes.size)) {
      return ResourceExhausted("ucx: an object of " + std::to_string(bytes.size) +
                               " bytes does not fit in max_bytes=" + std::to_string(o_.max_bytes) +
                               " (" + std::to_string(table_->bytes()) + " held)");
    }
    // The caller's buffers are kept, not copied.
    table_->Insert(id, bytes);
    return Status::OK();
  }

  // The server address of a ucx key.
  static Result<std::string> CheckKey(const Key& key) {
    if (key.connector != "ucx") {
      return InvalidArgument("key of connector '" + key.connector + "' given to a ucx connector");
    }
    auto it = key.attrs.find("address");
    if (it == key.attrs.end()) return InvalidArgument("ucx key " + key.id + " has no address");
    if (key.id.size() != ucx::kIdBytes) {
      return InvalidArgument("ucx key id '" + key.id + "' is not " + std::to_string(ucx::kIdBytes) +
                             " characters");
    }
    return it->second;
  }

  static Status Expect(const ucx::CallResult& r, ReplyStatus want, const std::string& address) {
    if (r.reply.status == want) return Status::OK();
    if (r.reply.status == ReplyStatus::kInvalid) {
      return InvalidArgument("ucx server at " + address + " refused the request");
    }
    return Corrupt("ucx: unexpected reply status " +
                   std::to_string(static_cast<int>(r.reply.status)) + " from " + address);
  }

  const UcxOptions o_;
  const std::shared_ptr<ucx::ObjectTable> table_;
  const std::unique_ptr<ucx::Worker> worker_;
  mutable std::mutex mu_;  // guards address_, bound_port_
  std::string address_;    // "host:port" once serving
  int bound_port_ = 0;
};

}  // namespace

Result<std::unique_ptr<Connector>> MakeUcxConnector(const ConnectorOptions& options) {
  const OptionTable& t = UcxConnectorOptionTable();
  XSILO_RETURN_IF_ERROR(t.CheckKeys(options));
  UcxOptions o;
  o.host = t.String(options, "host");
  if (o.host.empty()) return InvalidArgument("ucx option host must not be empty");
  o.tls = t.String(options, "tls");
  XSILO_ASSIGN_OR_RETURN(std::string serve, t.Enum(options, "serve"));
  o.serve_now = serve == "now";
  XSILO_ASSIGN_OR_RETURN(int64_t port, t.Int(options, "port"));
  XSILO_ASSIGN_OR_RETURN(int64_t timeout, t.Int(options, "timeout_ms"));
  XSILO_ASSIGN_OR_RETURN(int64_t max_bytes, t.Int(options, "max_bytes"));
  XSILO_ASSIGN_OR_RETURN(int64_t chunk, t.Int(options, "chunk_bytes"));
  o.port = static_cast<int>(port);
  o.timeout_ms = static_cast<int>(timeout);
  o.max_bytes = static_cast<uint64_t>(max_bytes);
  o.chunk_bytes = static_cast<uint64_t>(chunk);
  return UcxConnector::Make(std::move(o));
}

}  // namespace xsilo
