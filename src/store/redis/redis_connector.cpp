// redis: objects in a Redis server, via hiredis.
//
// An object of N bytes is stored as parts "<prefix>:<id>:<i>" of at most
// part_bytes each (Redis caps a value at 512 MB), then a commit record
// "<prefix>:<id>" = "<size> <parts>" is written last, so a reader sees either
// nothing or the whole object. Options:
//   host        default 127.0.0.1
//   port        default 6379
//   password    default none (AUTH when set). Never part of config(), so a
//               serialized reference holds no password. A connector made
//               without one finds it in password_file, else among the
//               connectors this process made for the same host and port,
//               else in REDISCLI_AUTH (redis-cli's variable); else it sends
//               no AUTH, and a server that wants one answers NOAUTH.
//   password_file  a file (mode 600) holding the password; its path, not
//               its content, is part of config()
//   prefix      default "xsilo"
//   part_bytes  default 268435456 (256 MiB), at most 512 MiB
//   timeout_ms  default 30000, per command
//   pool        default 4, connections kept open
#include <hiredis/hiredis.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "store/builtin.h"
#include "xsilo/core/secret.h"

namespace xsilo {

namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

struct RedisOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string password, password_file;
  std::string prefix = "xsilo";
  uint64_t part_bytes = 256ull << 20;
  int timeout_ms = 30000;
  size_t pool = 4;
};

class RedisConnector final : public Connector {
 public:
  explicit RedisConnector(RedisOptions o) : o_(std::move(o)) {}

  std::string_view type() const override { return "redis"; }
  ConnectorConfig config() const override {
    ConnectorOptions m = {{"host", o_.host},
                          {"port", std::to_string(o_.port)},
                          {"prefix", o_.prefix},
                          {"part_bytes", std::to_string(o_.part_bytes)},
                          {"timeout_ms", std::to_string(o_.timeout_ms)},
                          {"pool", std::to_string(o_.pool)}};
    if (!o_.password_file.empty()) m["password_file"] = o_.password_file;  // the path only
    return {"redis", m};
  }

  Result<Key> Put(const GatherList& bytes) override {
    Key key{"redis", RandomObjectId(), bytes.size, {}};
    XSILO_RETURN_IF_ERROR(Write(key.id, bytes));
    return key;
  }

  Result<Key> NewKey() override { return Key{"redis", RandomObjectId(), 0, {}}; }

  Status Set(const Key& key, const GatherList& bytes) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    return Write(key.id, bytes);
  }

  Result<std::optional<Buffer>> Get(const Key& key) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    XSILO_ASSIGN_OR_RETURN(Context c, Acquire());
    auto meta = ReadMeta(c.get(), key.id);
    if (!meta.ok()) return Release(std::move(c), meta.status());
    if (!meta->has_value()) {
      Recycle(std::move(c));
      return std::optional<Buffer>();
    }
    auto [size, parts] = **meta;
    auto out = Buffer::Allocate(size);
    if (!out.ok()) return Release(std::move(c), out.status());
    uint64_t offset = 0;
    for (uint64_t i = 0; i < parts; ++i) {
      std::string part = PartKey(key.id, i);
      auto r = Command(c.get(), {"GET", part});
      if (!r.ok()) return Release(std::move(c), r.status());
      redisReply* reply = r->get();
      if (reply->type == REDIS_REPLY_NIL) {
        // Evicted between the commit record and this part.
        Recycle(std::move(c));
        return std::optional<Buffer>();
      }
      if (reply->type != REDIS_REPLY_STRING || offset + reply->len > size) {
        return Release(std::move(c), Corrupt("redis part " + part + " is malformed"));
      }
      std::memcpy(out->mutable_data() + offset, reply->str, reply->len);
      offset += reply->len;
    }
    if (offset != size) {
      return Release(std::move(c),
                     Corrupt("redis object " + key.id + " has " + std::to_string(offset) + " of " +
                             std::to_string(size) + " bytes"));
    }
    Recycle(std::move(c));
    return std::optional<Buffer>(std::move(out).value());
  }

  Result<bool> Exists(const Key& key) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    XSILO_ASSIGN_OR_RETURN(Context c, Acquire());
    auto r = Command(c.get(), {"EXISTS", MetaKey(key.id)});
    if (!r.ok()) return Release(std::move(c), r.status());
    bool exists = (*r)->type == REDIS_REPLY_INTEGER && (*r)->integer > 0;
    Recycle(std::move(c));
    return exists;
  }

  Status Evict(const Key& key) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    XSILO_ASSIGN_OR_RETURN(Context c, Acquire());
    auto meta = ReadMeta(c.get(), key.id);
    if (!meta.ok()) return Release(std::move(c), meta.status());
    // The commit record goes first, so readers stop seeing the object at once.
    auto r = Command(c.get(), {"DEL", MetaKey(key.id)});
    if (!r.ok()) return Release(std::move(c), r.status());
    if (meta->has_value()) {
      for (uint64_t i = 0; i < (*meta)->second; ++i) {
        auto d = Command(c.get(), {"DEL", PartKey(key.id, i)});
        if (!d.ok()) return Release(std::move(c), d.status());
      }
    }
    return Release(std::move(c), Status::OK());
  }

 private:
  std::string MetaKey(const std::string& id) const { return o_.prefix + ":" + id; }
  std::string PartKey(const std::string& id, uint64_t i) const {
    return o_.prefix + ":" + id + ":" + std::to_string(i);
  }

  Status CheckKey(const Key& key) const {
    if (key.connector != "redis") {
      return InvalidArgument("key of connector '" + key.connector + "' given to a redis connector");
    }
    return Status::OK();
  }

  Result<Context> Acquire() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        Context c = std::move(idle_.back());
        idle_.pop_back();
        return c;
      }
    }
    timeval tv{o_.timeout_ms / 1000, (o_.timeout_ms % 1000) * 1000};
    Context c(redisConnectWithTimeout(o_.host.c_str(), o_.port, tv));
    if (!c) return ResourceExhausted("cannot allocate a redis context");
    if (c->err) {
      return Unavailable("redis at " + o_.host + ":" + std::to_string(o_.port) + ": " + c->errstr);
    }
    redisSetTimeout(c.get(), tv);
    if (!o_.password.empty()) {
      auto r = Command(c.get(), {"AUTH", o_.password});
      if (!r.ok()) return r.status();
    }
    return c;
  }

  // Returns the connection to the pool unless it broke.
  void Recycle(Context c) {
    if (c && c->err == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      if (idle_.size() < o_.pool) idle_.push_back(std::move(c));
    }
  }
  Status Release(Context c, Status s) {
    Recycle(std::move(c));
    return s;
  }

  struct Arg {
    const char* data;
    size_t len;
    Arg(const std::string& s) : data(s.data()), len(s.size()) {}  // NOLINT
    Arg(const char* s) : data(s), len(std::strlen(s)) {}          // NOLINT
    Arg(const uint8_t* d, size_t n) : data(reinterpret_cast<const char*>(d)), len(n) {}
  };

  Result<Reply> Command(redisContext* c, std::vector<Arg> args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const Arg& a : args) {
      argv.push_back(a.data);
      lens.push_back(a.len);
    }
    Reply r(static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (!r) return Unavailable(std::string("redis: ") + (c->err ? c->errstr : "no reply"));
    if (r->type == REDIS_REPLY_ERROR) {
      std::string msg(r->str, r->len);
      if (msg.rfind("NOAUTH", 0) == 0) {
        return PermissionDenied("redis: " + msg +
                                " (give password_file or set REDISCLI_AUTH: references carry "
                                "no password)");
      }
      if (msg.rfind("WRONGPASS", 0) == 0) return PermissionDenied("redis: " + msg);
      if (msg.rfind("OOM", 0) == 0) return ResourceExhausted("redis: " + msg);
      return Internal("redis: " + msg);
    }
    return r;
  }

  // (size, parts) from the commit record, nullopt when absent.
  Result<std::optional<std::pair<uint64_t, uint64_t>>> ReadMeta(redisContext* c,
                                                                const std::string& id) {
    XSILO_ASSIGN_OR_RETURN(Reply r, Command(c, {"GET", MetaKey(id)}));
    if (r->type == REDIS_REPLY_NIL) return std::optional<std::pair<uint64_t, uint64_t>>();
    if (r->type != REDIS_REPLY_STRING)
      return Corrupt("redis commit record of " + id + " malformed");
    std::string_view s(r->str, r->len);
    uint64_t size = 0, parts = 0;
    auto sp = s.find(' ');
    if (sp == std::string_view::npos ||
        std::from_chars(s.data(), s.data() + sp, size).ec != std::errc() ||
        std::from_chars(s.data() + sp + 1, s.data() + s.size(), parts).ec != std::errc()) {
      return Corrupt("redis commit record of " + id + " malformed");
    }
    if ((size == 0) != (parts == 0) || parts > size) {
      return Corrupt("redis commit record of " + id + " inconsistent");
    }
    return std::optional<std::pair<uint64_t, uint64_t>>({size, parts});
  }

  Status Write(const std::string& id, const GatherList& bytes) {
    XSILO_ASSIGN_OR_RETURN(Context c, Acquire());
    uint64_t parts = (bytes.size + o_.part_bytes - 1) / o_.part_bytes;
    size_t seg = 0;
    uint64_t seg_off = 0;
    for (uint64_t i = 0; i < parts; ++i) {
      uint64_t remaining = std::min(o_.part_bytes, bytes.size - i * o_.part_bytes);
      std::string part = PartKey(id, i);
      bool first = true;
      // SET the first piece, APPEND the rest: pieces come straight from the
      // gather list's segments.
      while (remaining > 0 || first) {
        while (seg < bytes.segments.size() && seg_off == bytes.segments[seg].size()) {
          ++seg;
          seg_off = 0;
        }
        uint64_t n = seg < bytes.segments.size()
                         ? std::min(remaining, bytes.segments[seg].size() - seg_off)
                         : 0;
        const uint8_t* p = n > 0 ? bytes.segments[seg].data() + seg_off : nullptr;
        auto r = Command(c.get(), {first ? "SET" : "APPEND", part, Arg(p, n)});
        if (!r.ok()) return Release(std::move(c), r.status());
        seg_off += n;
        remaining -= n;
        first = false;
      }
    }
    auto r = Command(
        c.get(), {"SET", MetaKey(id), std::to_string(bytes.size) + " " + std::to_string(parts)});
    return Release(std::move(c), r.status());
  }

  const RedisOptions o_;
  std::mutex mu_;
  std::vector<Context> idle_;
};

// The passwords of the connectors this process made, by "host:port": a
// connector rebuilt here from a config (which carries none) finds its own.
std::mutex passwords_mu;
std::map<std::string, std::string>& KnownPasswords() {
  static auto* known = new std::map<std::string, std::string>;
  return *known;
}

}  // namespace

Result<std::unique_ptr<Connector>> MakeRedisConnector(const ConnectorOptions& options) {
  const OptionTable& t = RedisConnectorOptionTable();
  XSILO_RETURN_IF_ERROR(t.CheckKeys(options));
  RedisOptions o;
  o.host = t.String(options, "host");
  o.password = t.String(options, "password");
  o.password_file = t.String(options, "password_file");
  if (!o.password.empty() && !o.password_file.empty()) {
    return InvalidArgument("redis connector: give password or password_file, not both");
  }
  o.prefix = t.String(options, "prefix");
  XSILO_ASSIGN_OR_RETURN(int64_t port, t.Int(options, "port"));
  XSILO_ASSIGN_OR_RETURN(int64_t part, t.Int(options, "part_bytes"));
  XSILO_ASSIGN_OR_RETURN(int64_t timeout, t.Int(options, "timeout_ms"));
  XSILO_ASSIGN_OR_RETURN(int64_t pool, t.Int(options, "pool"));
  o.port = static_cast<int>(port);
  o.part_bytes = static_cast<uint64_t>(part);
  o.timeout_ms = static_cast<int>(timeout);
  o.pool = static_cast<size_t>(pool);
  const std::string server = o.host + ":" + std::to_string(o.port);
  if (!o.password_file.empty()) {
    auto read = ReadSecretFile(o.password_file);
    if (!read.ok()) return read.status().WithContext("redis connector password_file");
    o.password = *std::move(read);
  }
  if (o.password.empty()) {
    std::lock_guard<std::mutex> lock(passwords_mu);
    if (auto it = KnownPasswords().find(server); it != KnownPasswords().end()) {
      o.password = it->second;
    }
  }
  if (o.password.empty()) {
    if (const char* env = std::getenv("REDISCLI_AUTH"); env != nullptr) o.password = env;
  }
  if (!o.password.empty()) {
    std::lock_guard<std::mutex> lock(passwords_mu);
    KnownPasswords()[server] = o.password;
  }
  return std::unique_ptr<Connector>(std::make_unique<RedisConnector>(std::move(o)));
}

}  // namespace xsilo
