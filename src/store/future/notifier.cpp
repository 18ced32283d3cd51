#include "store/future/notifier.h"

#include <hiredis/hiredis.h>
#include <limits.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
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
// File keys: the connector's write ends with a rename into the directory,
// so a waiter watches the directory with inotify for that name. Notify has
// nothing to do. Where inotify is unavailable (no watch left, or a file
// system that does not report, such as NFS, for writes made elsewhere)
// WaitForKey's slices still re-check the file at least every second.
class FileNotifier final : public KeyNotifier {
 public:
  explicit FileNotifier(const ConnectorOptions& o) {
    if (auto it = o.find("dir"); it != o.end()) dir_ = it->second;
  }

  Status Notify(const Key&) override { return Status::OK(); }
  Status Forget(const Key&) override { return Status::OK(); }

  Result<bool> Wait(const Key& key, std::chrono::milliseconds timeout) override {
    if (dir_.empty() || key.id.empty() || key.id.find('/') != std::string::npos) {
      return Unimplemented("no directory to watch");
    }
    int fd = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (fd < 0) return ErrnoStatus("inotify_init1", errno);
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    if (::inotify_add_watch(fd, dir_.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
      return ErrnoStatus("inotify_add_watch " + dir_, errno);
    }
    // Set between the caller's check and the watch: seen here.
    struct stat st {};
    if (::stat((dir_ + "/" + key.id).c_str(), &st) == 0) return true;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    alignas(inotify_event) char buf[16 * (sizeof(inotify_event) + NAME_MAX + 1)];
    for (;;) {
      auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return ErrnoStatus("poll inotify", errno);
      if (r == 0) return false;
      ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n < 0) return ErrnoStatus("read inotify", errno);
      for (ssize_t off = 0; off < n;) {
        const auto* e = reinterpret_cast<const inotify_event*>(buf + off);
        if (e->len > 0 && key.id == e->name) return true;
        if (e->mask & IN_Q_OVERFLOW) return true;  // events lost: let the caller look
        off += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
      }
    }
  }

 private:
  std::string dir_;
};

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
  if (config.type == "file") return std::make_unique<FileNotifier>(config.options);
  if (config.type == "multi") {
    auto members = ParseMultiMembers(config.options);
    if (members.ok()) return std::make_unique<MultiNotifier>(std::move(members).value());
  }
  return nullptr;
}

}  // namespace xsilo
