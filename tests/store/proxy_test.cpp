// Proxy<T>: laziness, resolve-once under contention, async, evict-on-resolve,
// serialization and resolution in another process.
#include <gtest/gtest.h>

#include <latch>
#include <thread>

#include "store/store_test_util.h"
#include "transport/test_util.h"
#include "xsilo/core/codec.h"
#include "xsilo/store/proxy.h"

namespace xsilo {
namespace {

using testing::CountingConnector;
using testing::FreshConnectorConfig;

std::shared_ptr<Store> CountedStore(CountingConnector** counter, const std::string& kind = "memory",
                                    uint64_t cache_bytes = 0) {
  auto inner = MakeConnector(FreshConnectorConfig(kind));
  EXPECT_TRUE(inner.ok());
  auto counting = std::make_unique<CountingConnector>(std::move(inner).value());
  *counter = counting.get();
  return *Store::Create("p-" + RandomObjectId().substr(0, 8), std::move(counting),
                        {.cache_bytes = cache_bytes});
}

TEST(Proxy, IsLazyUntilTouched) {
  CountingConnector* counter;
  auto store = CountedStore(&counter);
  auto proxy = store->MakeProxy(std::string("payload"));
  ASSERT_TRUE(proxy.ok());
  EXPECT_EQ(counter->gets.load(), 0);
  EXPECT_FALSE(proxy->is_resolved());
  Proxy<std::string> copy = *proxy;  // copies share one resolution
  auto value = copy.Get();
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(**value, "payload");
  EXPECT_TRUE(proxy->is_resolved());
  EXPECT_EQ(*proxy->Extract(), "payload");
  EXPECT_EQ(counter->gets.load(), 1);
}

TEST(Proxy, SixteenThreadsResolveOnceAndReachTheConnectorOnce) {
  CountingConnector* counter;
  auto store = CountedStore(&counter);  // cache off: every resolve would reach the connector
  counter->get_delay = std::chrono::milliseconds(5);
  TensorMap tensors;
  tensors.emplace("w", testing::PatternTensor(1 << 20, 5));
  constexpr int kThreads = 16, kProxies = 20;
  for (int round = 0; round < kProxies; ++round) {
    auto proxy = store->MakeProxy(tensors);
    ASSERT_TRUE(proxy.ok());
    int before = counter->gets.load();
    std::latch start(kThreads);
    std::vector<const TensorMap*> seen(kThreads, nullptr);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        Proxy<TensorMap> mine = *proxy;
        start.arrive_and_wait();
        auto got = (t % 2 == 0) ? mine.Get() : Result<const TensorMap*>(nullptr);
        if (t % 2 == 1) {
          if (mine.Resolve().ok()) got = mine.Get();
        }
        if (got.ok()) seen[t] = *got;
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(counter->gets.load() - before, 1) << "round " << round;
    for (int t = 0; t < kThreads; ++t) {
      ASSERT_NE(seen[t], nullptr) << t;
      EXPECT_EQ(seen[t], seen[0]) << "every thread sees the one target";
    }
    EXPECT_EQ(seen[0]->at("w").data.view(), tensors.at("w").data.view());
  }
}

TEST(Proxy, FactoryProxyRetriesAfterAFailureAndCannotSerialize) {
  int calls = 0;
  Proxy<std::string> proxy([&]() -> Result<std::string> {
    if (++calls == 1) return Unavailable("first try fails");
    return std::string("second");
  });
  EXPECT_EQ(proxy.Resolve().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(proxy.is_resolved());
  EXPECT_EQ(*proxy.Extract(), "second");
  EXPECT_TRUE(proxy.Resolve().ok());
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(proxy.Serialize().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(proxy.reference().has_value());
}

TEST(Proxy, ResolveAsyncReturnsAFuture) {
  CountingConnector* counter;
  auto store = CountedStore(&counter);
  auto proxy = store->MakeProxy(std::string("async"));
  ASSERT_TRUE(proxy.ok());
  std::future<Status> f = proxy->ResolveAsync();
  std::future<Status> g = proxy->ResolveAsync();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_TRUE(f.get().ok());
  EXPECT_TRUE(g.get().ok());
  EXPECT_TRUE(proxy->is_resolved());
  EXPECT_EQ(**proxy->Get(), "async");
  EXPECT_EQ(counter->gets.load(), 1);
  // A failing resolve reports through the future too.
  auto missing = store->ProxyFor<std::string>(Key{"memory", RandomObjectId(), 0, {}});
  EXPECT_EQ(missing.ResolveAsync().get().code(), StatusCode::kNotFound);
}

TEST(Proxy, EvictOnResolve) {
  CountingConnector* counter;
  auto store = CountedStore(&counter, "memory", 1 << 20);
  auto proxy = store->MakeProxy(std::string("once"), {.evict_on_resolve = true});
  ASSERT_TRUE(proxy.ok());
  Key key = proxy->reference()->key;
  EXPECT_TRUE(*store->Exists(key));
  ASSERT_TRUE(proxy->Resolve().ok());
  EXPECT_FALSE(*store->Exists(key));
  EXPECT_EQ(**proxy->Get(), "once") << "the resolved target outlives the stored object";
  // Without the option the object stays.
  auto keep = store->MakeProxy(std::string("kept"));
  ASSERT_TRUE(keep->Resolve().ok());
  EXPECT_TRUE(*store->Exists(keep->reference()->key));
  // A second proxy of the evicted key cannot resolve.
  EXPECT_EQ(store->ProxyFor<std::string>(key).Resolve().code(), StatusCode::kNotFound);
}

TEST(Proxy, PopulatedTargetNeedsNoFetch) {
  CountingConnector* counter;
  auto store = CountedStore(&counter);
  auto proxy = store->MakeProxy(std::string("local"), {.populate_target = true});
  ASSERT_TRUE(proxy.ok());
  EXPECT_TRUE(proxy->is_resolved());
  EXPECT_EQ(**proxy->Get(), "local");
  EXPECT_EQ(counter->gets.load(), 0);
  // Its serialized form still resolves from the store.
  StoreRegistry registry;
  auto remote = Proxy<std::string>::Deserialize(*proxy->Serialize(), &registry);
  ASSERT_TRUE(remote.ok());
  EXPECT_FALSE(remote->is_resolved());
}

TEST(Proxy, SerializesToASmallReference) {
  auto store = *Store::Create("small-ref", *MakeConnector(FreshConnectorConfig("file")));
  TensorMap tensors;
  tensors.emplace("w", testing::PatternTensor(4 << 20, 8));
  auto proxy = store->MakeProxy(tensors);
  ASSERT_TRUE(proxy.ok());
  auto text = proxy->Serialize();
  ASSERT_TRUE(text.ok());
  EXPECT_LT(text->size(), 1024u) << *text;
  // A fresh registry plays the other process: it creates the store once.
  StoreRegistry registry;
  auto a = Proxy<TensorMap>::Deserialize(*text, &registry);
  auto b = Proxy<TensorMap>::Deserialize(*text, &registry);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(registry.Names().empty()) << "nothing happens before a resolve";
  auto got = a->Get();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)->at("w").data.view(), tensors.at("w").data.view());
  ASSERT_TRUE(b->Resolve().ok());
  EXPECT_EQ(registry.Names(), std::vector<std::string>{"small-ref"});
  EXPECT_FALSE(Proxy<TensorMap>::Deserialize("{\"key\":1}", &registry).ok());
}

class CrossProcessProxy : public ::testing::TestWithParam<std::string> {};

TEST_P(CrossProcessProxy, ResolvesInAnotherProcess) {
  auto store = *Store::Create("xp-" + GetParam(), *MakeConnector(FreshConnectorConfig(GetParam())));
  TensorMap tensors;
  tensors.emplace("w", testing::PatternTensor(3'000'000, 13));
  std::string sum =
      "XSILO_STORE_CHILD_SUM=" + std::to_string(Checksum(tensors.at("w").data.span()));

  auto proxy = store->MakeProxy(tensors);
  ASSERT_TRUE(proxy.ok());
  EXPECT_EQ(testing::WaitChild(testing::SpawnStoreChild("resolve", *proxy->Serialize(), {sum})), 0);
  EXPECT_TRUE(*store->Exists(proxy->reference()->key));

  // Evict-on-resolve: the child's resolve removes the object for everyone.
  auto once = store->MakeProxy(tensors, {.evict_on_resolve = true});
  ASSERT_TRUE(once.ok());
  EXPECT_EQ(testing::WaitChild(testing::SpawnStoreChild("resolve", *once->Serialize(), {sum})), 0);
  EXPECT_FALSE(*store->Exists(once->reference()->key));
  // A second consumer finds nothing: NotFound.
  int code = testing::WaitChild(testing::SpawnStoreChild("resolve", *once->Serialize(), {sum}));
  EXPECT_EQ(code, 10 + static_cast<int>(StatusCode::kNotFound));
}

INSTANTIATE_TEST_SUITE_P(Connectors, CrossProcessProxy, ::testing::Values("file", "redis", "s3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace xsilo
