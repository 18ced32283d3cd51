// Future<T>: deferred keys set by one party and awaited by another.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

#include "store/redis_server.h"
#include "store/store_test_util.h"
#include "xsilo/s3/server.h"
#include "xsilo/store/future.h"

namespace xsilo {
namespace {

using namespace std::chrono_literals;

using testing::MissCounter;

std::shared_ptr<Store> FreshStore(const std::string& kind, MissCounter** misses = nullptr) {
  auto counting =
      std::make_unique<MissCounter>(*MakeConnector(testing::FreshConnectorConfig(kind)));
  if (misses) *misses = counting.get();
  return *Store::Create("f-" + kind + "-" + RandomObjectId().substr(0, 8), std::move(counting));
}

// Polls `condition` every 2 ms for up to 30 s.
bool Eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// Tells, from this process, that a child process awaiting a Future has
// found it unset and waits. Each connector's waiter leaves its own trace: a
// file waiter watches the directory with inotify, a redis waiter blocks in
// BLPOP, and an s3 waiter polls with HEAD requests, which go to an S3
// server of this probe's own that counts them.
class ChildWaitProbe {
 public:
  explicit ChildWaitProbe(const std::string& kind)
      : kind_(kind), config_(testing::FreshConnectorConfig(kind)) {
    if (kind_ != "s3") return;
    S3ServerOptions o;
    o.access_key = config_.options.at("access_key");
    o.secret_key = config_.options.at("secret_key");
    o.on_request = [this](const S3FaultRequest& r) {
      std::lock_guard<std::mutex> lock(mu_);
      if (r.method == "HEAD" && !key_id_.empty() && r.path.ends_with(key_id_)) ++heads_;
    };
    auto server = S3Server::Start(o);
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    if (!server.ok()) return;
    server_ = std::move(server).value();
    config_.options["endpoint"] = server_->endpoint();
  }
  ~ChildWaitProbe() {
    if (redis_) redisFree(redis_);
  }

  // The config of the store whose futures the child awaits.
  const ConnectorConfig& config() const { return config_; }

  // Call before the child starts awaiting `key`.
  void Arm(const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    key_id_ = key.id;
    if (kind_ == "redis") blocked_before_ = BlockedRedisClients();
  }

  bool ChildWaits(pid_t pid) {
    if (kind_ == "file") return HasInotifyFd(pid);
    if (kind_ == "redis") return BlockedRedisClients() > blocked_before_;
    // The child sends its second HEAD only after the first found nothing.
    std::lock_guard<std::mutex> lock(mu_);
    return heads_ >= 2;
  }

 private:
  static bool HasInotifyFd(pid_t pid) {
    std::error_code ec;
    const std::filesystem::path fds = "/proc/" + std::to_string(pid) + "/fd";
    for (const auto& fd : std::filesystem::directory_iterator(fds, ec)) {
      std::error_code link_ec;
      if (std::filesystem::read_symlink(fd.path(), link_ec) == "anon_inode:inotify") return true;
    }
    return false;
  }

  // Clients of the test redis-server blocked in a command such as BLPOP,
  // or -1 if it cannot be asked.
  long long BlockedRedisClients() {
    if (!redis_) redis_ = redisConnect("127.0.0.1", testing::RedisTestPort());
    if (!redis_ || redis_->err) return -1;
    auto* r = static_cast<redisReply*>(redisCommand(redis_, "INFO clients"));
    long long blocked = -1;
    if (r && r->type == REDIS_REPLY_STRING) {
      const std::string info(r->str, r->len);
      const std::string field = "blocked_clients:";
      if (size_t at = info.find(field); at != std::string::npos) {
        blocked = std::atoll(info.c_str() + at + field.size());
      }
    }
    freeReplyObject(r);
    return blocked;
  }

  const std::string kind_;
  ConnectorConfig config_;
  redisContext* redis_ = nullptr;
  long long blocked_before_ = 0;
  std::mutex mu_;
  std::string key_id_;
  int heads_ = 0;
  std::unique_ptr<S3Server> server_;  // last: stopped before the members its hook uses
};

class FutureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FutureTest, TimesOutUntilSetThenDelivers) {
  MissCounter* misses = nullptr;
  auto store = FreshStore(GetParam(), &misses);
  auto f = Future<std::string>::Create(store);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_FALSE(*f->done());
  EXPECT_EQ(f->Get(std::chrono::milliseconds(0)).status().code(), StatusCode::kTimeout);
  EXPECT_EQ(f->Get(std::chrono::milliseconds(30)).status().code(), StatusCode::kTimeout);
  const int missed_before = misses->misses();
  std::thread setter([&] {
    // Sets only once the Get below has found the value unset and waits.
    EXPECT_TRUE(misses->WaitForMoreMissesThan(missed_before)) << "the Get never looked";
    auto other = Future<std::string>::Deserialize(f->Serialize());
    ASSERT_TRUE(other.ok());
    ASSERT_TRUE(other->Set("hello").ok());
  });
  auto v = f->Get(std::chrono::seconds(60));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "hello");
  EXPECT_TRUE(*f->done());
}

TEST_P(FutureTest, ManyWaitersAllWake) {
  MissCounter* misses = nullptr;
  auto store = FreshStore(GetParam(), &misses);
  auto f = Future<std::string>::Create(store);
  ASSERT_TRUE(f.ok());
  constexpr int kWaiters = 6;
  std::vector<std::thread> waiters;
  std::atomic<int> woke{0};
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&] {
      Future<std::string> mine = *f;
      auto v = mine.Get(std::chrono::seconds(60));
      if (v.ok() && *v == "all") ++woke;
    });
  }
  // Every waiter has found the value unset and waits.
  EXPECT_TRUE(misses->WaitForThreadsMissing(kWaiters)) << "not every waiter looked";
  ASSERT_TRUE(f->Set("all").ok());
  for (auto& w : waiters) w.join();
  EXPECT_EQ(woke.load(), kWaiters);
}

TEST_P(FutureTest, ProxyOfAFutureWaitsForTheValue) {
  auto store = FreshStore(GetParam());
  auto f = Future<std::string>::Create(store);
  ASSERT_TRUE(f.ok());
  Proxy<std::string> early = f->MakeProxy(std::chrono::milliseconds(0));
  EXPECT_EQ(early.Resolve().code(), StatusCode::kNotFound);
  Proxy<std::string> proxy = f->MakeProxy(std::chrono::seconds(60));
  std::future<Status> resolving = proxy.ResolveAsync();
  ASSERT_TRUE(f->Set("later").ok());
  EXPECT_TRUE(resolving.get().ok());
  EXPECT_EQ(**proxy.Get(), "later");
  EXPECT_TRUE(early.Resolve().ok()) << "a failed resolve is retried";
}

TEST_P(FutureTest, SetAndAwaitedAcrossProcesses) {
  auto store = FreshStore(GetParam());
  // The child sets, this process awaits.
  auto f = Future<std::string>::Create(store);
  ASSERT_TRUE(f.ok());
  int pid = testing::SpawnStoreChild("future-set", f->Serialize());
  auto v = f->Get(std::chrono::seconds(60));
  EXPECT_EQ(testing::WaitChild(pid), 0);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "from child");
  // The child awaits, this process sets once the child waits.
  ChildWaitProbe probe(GetParam());
  auto awaited =
      Store::Create("f-awaited-" + RandomObjectId().substr(0, 8), *MakeConnector(probe.config()));
  ASSERT_TRUE(awaited.ok()) << awaited.status().ToString();
  auto g = Future<std::string>::Create(*awaited);
  ASSERT_TRUE(g.ok());
  probe.Arm(g->key());
  pid = testing::SpawnStoreChild("future-get", g->Serialize());
  EXPECT_TRUE(Eventually([&] { return probe.ChildWaits(pid); }))
      << "the child never started waiting for the value";
  ASSERT_TRUE(g->Set("from parent").ok());
  EXPECT_EQ(testing::WaitChild(pid), 0);
}

INSTANTIATE_TEST_SUITE_P(Connectors, FutureTest, ::testing::Values("file", "redis", "s3"),
                         [](const auto& info) { return info.param; });

// Redis futures are notified through a per-key signal list, and evicting
// the key removes it.
TEST(RedisFuture, UsesASignalListThatEvictRemoves) {
  ConnectorConfig config = testing::FreshConnectorConfig("redis");
  auto store = *Store::Create("f-signal", *MakeConnector(config));
  auto f = Future<std::string>::Create(store);
  ASSERT_TRUE(f.ok());
  std::string signal = config.options.at("prefix") + ":" + f->key().id + ":signal";
  redisContext* c = redisConnect("127.0.0.1", testing::RedisTestPort());
  ASSERT_TRUE(c && !c->err);
  auto llen = [&] {
    auto* r = static_cast<redisReply*>(redisCommand(c, "LLEN %s", signal.c_str()));
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    return n;
  };
  EXPECT_EQ(llen(), 0);
  ASSERT_TRUE(f->Set("x").ok());
  EXPECT_EQ(llen(), 1) << "Set pushes a signal";
  ASSERT_TRUE(f->Get(std::chrono::seconds(60)).ok());
  ASSERT_TRUE(store->Evict(f->key()).ok());
  EXPECT_EQ(llen(), 0) << "evict deletes the signal list";
  redisFree(c);
}

}  // namespace
}  // namespace xsilo
