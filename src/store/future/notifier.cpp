#include "store/future/notifier.h"

#include <hiredis/hiredis.h>

#include <charconv>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "store/builtin.h"
#include "xsilo/store/multi.h"

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

constexpr int kSignalTtlSeconds = 24 * 3600;

class RedisNotifier final : public KeyNotifier {
 public:
  explicit RedisNotifier(const ConnectorOptions& o) {
    if (auto it = o.find("host"); it != o.end()) host_ = it->second;
    if (auto it = o.find("port"); it != o.end()) port_ = std::atoi(it->second.c_str());
    if (auto it = o.find("password"); it != o.end()) password_ = it->second;
    if (auto it = o.find("prefix"); it != o.end()) prefix_ = it->second;
    if (auto it = o.find("timeout_ms"); it != o.end()) timeout_ms_ = std::atoi(it->second.c_str());
    if (timeout_ms_ <= 0) timeout_ms_ = 30000;
  }

  Status Notify(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(Context c, Connect(std::chrono::milliseconds(timeout_ms_)));
    std::string signal = SignalKey(key);
    XSILO_RETURN_IF_ERROR(Command(c.get(), {"RPUSH", signal, "1"}).status());
    return Command(c.get(), {"EXPIRE", signal, std::to_string(kSignalTtlSeconds)}).status();
  }

  Result<bool> Wait(const Key& key, std::chrono::milliseconds timeout) override {
    // The socket timeout must outlast the blocking command.
    XSILO_ASSIGN_OR_RETURN(Context c, Connect(timeout + std::chrono::seconds(5)));
    std::string signal = SignalKey(key);
    char seconds[32];
    auto end =
        std::to_chars(seconds, seconds + sizeof(seconds) - 1,
                      std::max<double>(timeout.count(), 1) / 1000.0, std::chars_format::fixed, 3)
            .ptr;
    *end = '\0';
    XSILO_ASSIGN_OR_RETURN(Reply r, Command(c.get(), {"BLPOP", signal, seconds}));
    if (r->type == REDIS_REPLY_NIL) return false;
    // Put the signal back for the other waiters.
    XSILO_RETURN_IF_ERROR(Command(c.get(), {"RPUSH", signal, "1"}).status());
    XSILO_RETURN_IF_ERROR(
        Command(c.get(), {"EXPIRE", signal, std::to_string(kSignalTtlSeconds)}).status());
    return true;
  }

  Status Forget(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(Context c, Connect(std::chrono::milliseconds(timeout_ms_)));
    return Command(c.get(), {"DEL", SignalKey(key)}).status();
  }

 private:
  std::string SignalKey(const Key& key) const { return prefix_ + ":" + key.id + ":signal"; }

  Result<Context> Connect(std::chrono::milliseconds timeout) {
    auto ms = timeout.count();
    timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
    timeval connect_tv{timeout_ms_ / 1000, (timeout_ms_ % 1000) * 1000};
    Context c(redisConnectWithTimeout(host_.c_str(), port_, connect_tv));
    if (!c) return ResourceExhausted("cannot allocate a redis context");
    if (c->err)
      return Unavailable("redis at " + host_ + ":" + std::to_string(port_) + ": " + c->errstr);
    redisSetTimeout(c.get(), tv);
    if (!password_.empty()) XSILO_RETURN_IF_ERROR(Command(c.get(), {"AUTH", password_}).status());
    return c;
  }

  Result<Reply> Command(redisContext* c, const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    Reply r(static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (!r) return Unavailable(std::string("redis: ") + (c->err ? c->errstr : "no reply"));
    if (r->type == REDIS_REPLY_ERROR) return Internal("redis: " + std::string(r->str, r->len));
    return r;
  }

  std::string host_ = "127.0.0.1";
  int port_ = 6379;
  std::string password_;
  std::string prefix_ = "xsilo";
  int timeout_ms_ = 30000;
};

// Routes by the member a multi key names; members that cannot notify are
// polled (Wait returns false at once so the caller polls).
class MultiNotifier final : public KeyNotifier {
 public:
  explicit MultiNotifier(std::vector<MultiMember> members) : members_(std::move(members)) {}

  Status Notify(const Key& key) override {
    auto [n, inner] = Route(key);
    return n ? n->Notify(inner) : Status::OK();
  }
  Result<bool> Wait(const Key& key, std::chrono::milliseconds timeout) override {
    auto [n, inner] = Route(key);
    if (!n) return Unimplemented("this member cannot notify");
    return n->Wait(inner, timeout);
  }
  Status Forget(const Key& key) override {
    auto [n, inner] = Route(key);
    return n ? n->Forget(inner) : Status::OK();
  }

 private:
  std::pair<KeyNotifier*, Key> Route(const Key& key) {
    auto inner = InnerKeyOf(key);
    if (!inner.ok()) return {nullptr, key};
    std::lock_guard<std::mutex> lock(mu_);
    auto it = notifiers_.find(inner->first);
    if (it == notifiers_.end()) {
      std::unique_ptr<KeyNotifier> n;
      for (const auto& m : members_) {
        if (m.name == inner->first) n = MakeKeyNotifier(m.connector);
      }
      it = notifiers_.emplace(inner->first, std::move(n)).first;
    }
    return {it->second.get(), inner->second};
  }

  const std::vector<MultiMember> members_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<KeyNotifier>> notifiers_;
};

}  // namespace

std::unique_ptr<KeyNotifier> MakeKeyNotifier(const ConnectorConfig& config) {
  if (config.type == "redis") return std::make_unique<RedisNotifier>(config.options);
  if (config.type == "multi") {
    auto members = ParseMultiMembers(config.options);
    if (members.ok()) return std::make_unique<MultiNotifier>(std::move(members).value());
  }
  return nullptr;
}

}  // namespace xsilo
