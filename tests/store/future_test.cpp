// Future<T>: deferred keys set by one party and awaited by another.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <thread>

#include "store/redis_server.h"
#include "store/store_test_util.h"
#include "xsilo/store/future.h"

namespace xsilo {
namespace {

std::shared_ptr<Store> FreshStore(const std::string& kind) {
  return *Store::Create("f-" + kind + "-" + RandomObjectId().substr(0, 8),
                        *MakeConnector(testing::FreshConnectorConfig(kind)));
}

class FutureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FutureTest, TimesOutUntilSetThenDelivers) {
  auto store = FreshStore(GetParam());
  auto f = Future<std::string>::Create(store);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_FALSE(*f->done());
  EXPECT_EQ(f->Get(std::chrono::milliseconds(0)).status().code(), StatusCode::kTimeout);
  EXPECT_EQ(f->Get(std::chrono::milliseconds(30)).status().code(), StatusCode::kTimeout);
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
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
  auto store = FreshStore(GetParam());
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
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
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
  // The child awaits, this process sets.
  auto g = Future<std::string>::Create(store);
  ASSERT_TRUE(g.ok());
  pid = testing::SpawnStoreChild("future-get", g->Serialize());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
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
