// Store: codecs, cache, metrics, batch forms, close, registry.
#include <gtest/gtest.h>

#include <cstring>

#include "store/store_test_util.h"
#include "transport/test_util.h"
#include "xsilo/store/proxy.h"

namespace {
struct Point {
  int32_t x = 0, y = 0;
  friend bool operator==(const Point&, const Point&) = default;
};
}  // namespace

template <>
struct xsilo::Codec<Point> {
  static Result<GatherList> Encode(const Point& p) {
    GatherList g;
    g.Append(Buffer::CopyFrom(&p, sizeof(p)));
    return g;
  }
  static Result<Point> Decode(const Buffer& b) {
    if (b.size() != sizeof(Point)) return Corrupt("not a Point");
    Point p;
    std::memcpy(&p, b.data(), sizeof(p));
    return p;
  }
};

namespace xsilo {
namespace {

using testing::CountingConnector;
using testing::FreshConnectorConfig;

std::shared_ptr<Store> MakeStore(StoreOptions options = {}, CountingConnector** counter = nullptr,
                                 const std::string& kind = "memory") {
  auto inner = MakeConnector(FreshConnectorConfig(kind));
  EXPECT_TRUE(inner.ok());
  auto counting = std::make_unique<CountingConnector>(std::move(inner).value());
  if (counter) *counter = counting.get();
  auto store = Store::Create("s-" + RandomObjectId().substr(0, 8), std::move(counting), options);
  EXPECT_TRUE(store.ok());
  return *store;
}

TEST(Store, RoundTripsEveryCodec) {
  auto store = MakeStore();
  auto kb = store->Put(Buffer::CopyFrom("raw"));
  ASSERT_TRUE(kb.ok());
  EXPECT_EQ((*store->Get<Buffer>(*kb))->view(), "raw");

  auto ks = store->Put(std::string("text"));
  ASSERT_TRUE(ks.ok());
  EXPECT_EQ(**store->Get<std::string>(*ks), "text");

  TensorMap tensors;
  tensors.emplace("w", testing::PatternTensor(1 << 20, 3));
  tensors.emplace("b", *Tensor::Zeros(DType::kF32, {7}));
  auto kt = store->Put(tensors);
  ASSERT_TRUE(kt.ok());
  auto got = store->Get<TensorMap>(*kt);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((**got).at("w").data.view(), tensors.at("w").data.view());
  EXPECT_EQ((**got).at("b").shape, std::vector<int64_t>{7});
  // Decoding is zero-copy: tensors are views into the fetched bytes.
  auto bytes = store->GetBytes(*kt);
  ASSERT_TRUE(bytes.ok() && bytes->has_value());
  auto decoded = Codec<TensorMap>::Decode(**bytes);
  ASSERT_TRUE(decoded.ok());
  EXPECT_TRUE(decoded->at("w").data.SharesStorageWith(**bytes));

  Message m = testing::PatternMessage(4096, 9, 3);
  auto km = store->Put(m);
  ASSERT_TRUE(km.ok());
  auto gm = store->Get<Message>(*km);
  ASSERT_TRUE(gm.ok() && gm->has_value());
  EXPECT_EQ((*gm)->round, 3);
  EXPECT_TRUE(testing::PatternIntact(**gm));

  auto kp = store->Put(Point{3, -4});
  ASSERT_TRUE(kp.ok());
  EXPECT_EQ(**store->Get<Point>(*kp), (Point{3, -4}));
  // A decode failure is a Status.
  EXPECT_EQ(store->Get<Point>(*ks).status().code(), StatusCode::kCorrupt);
}

TEST(Store, MissingAndEvicted) {
  CountingConnector* counter;
  auto store = MakeStore({}, &counter);
  auto key = store->Put(std::string("gone soon"));
  ASSERT_TRUE(key.ok());
  ASSERT_TRUE(store->Get<std::string>(*key)->has_value());  // now cached
  EXPECT_TRUE(*store->Exists(*key));
  ASSERT_TRUE(store->Evict(*key).ok());
  EXPECT_FALSE(*store->Exists(*key));
  EXPECT_FALSE(store->Get<std::string>(*key)->has_value()) << "evict must drop the cached copy";
  EXPECT_TRUE(store->Evict(*key).ok());
}

TEST(Store, BatchForms) {
  auto store = MakeStore();
  auto keys = store->PutBatch<std::string>({"a", "bb", ""});
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  ASSERT_EQ(keys->size(), 3u);
  TensorMap t;
  t.emplace("w", testing::PatternTensor(1000, 1));
  auto tkeys = store->PutBatch<TensorMap>({t, t});  // multi-segment objects
  ASSERT_TRUE(tkeys.ok());
  Key missing = (*keys)[0];
  missing.id = RandomObjectId();
  auto got = store->GetBatch<std::string>({(*keys)[1], missing, (*keys)[2], (*keys)[0]});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*(*got)[0], "bb");
  EXPECT_FALSE((*got)[1].has_value());
  EXPECT_EQ(*(*got)[2], "");
  EXPECT_EQ(*(*got)[3], "a");
  auto tgot = store->GetBatch<TensorMap>(*tkeys);
  ASSERT_TRUE(tgot.ok());
  EXPECT_EQ((*tgot)[1]->at("w").data.view(), t.at("w").data.view());
  ASSERT_TRUE(store->EvictBatch(*keys).ok());
  for (const Key& k : *keys) EXPECT_FALSE(*store->Exists(k));
}

TEST(Store, CacheIsLruAndByteBounded) {
  CountingConnector* counter;
  auto store = MakeStore({.cache_bytes = 1000}, &counter);
  std::vector<Key> keys;
  for (int i = 0; i < 3; ++i) {
    keys.push_back(*store->Put(std::string(400, static_cast<char>('a' + i))));
  }
  ASSERT_TRUE(store->Get<std::string>(keys[0]).ok());  // miss
  ASSERT_TRUE(store->Get<std::string>(keys[0]).ok());  // hit
  EXPECT_EQ(counter->gets.load(), 1);
  ASSERT_TRUE(store->Get<std::string>(keys[1]).ok());  // miss
  ASSERT_TRUE(store->Get<std::string>(keys[2]).ok());  // miss: evicts keys[0], the least recent
  StoreMetrics m = store->metrics();
  EXPECT_EQ(m.cache_hits, 1u);
  EXPECT_EQ(m.cache_misses, 3u);
  EXPECT_EQ(m.cache_entries, 2u);
  EXPECT_LE(m.cache_bytes, 1000u);
  ASSERT_TRUE(store->Get<std::string>(keys[2]).ok());  // hit
  EXPECT_EQ(counter->gets.load(), 3);
  ASSERT_TRUE(store->Get<std::string>(keys[0]).ok());  // miss again
  EXPECT_EQ(counter->gets.load(), 4);
  // An object larger than the cache is never cached.
  Key big = *store->Put(std::string(2000, 'z'));
  ASSERT_TRUE(store->Get<std::string>(big).ok());
  ASSERT_TRUE(store->Get<std::string>(big).ok());
  EXPECT_EQ(counter->gets.load(), 6);
  // cache_bytes = 0 disables caching.
  CountingConnector* counter2;
  auto nocache = MakeStore({.cache_bytes = 0}, &counter2);
  Key k = *nocache->Put(std::string("x"));
  ASSERT_TRUE(nocache->Get<std::string>(k).ok());
  ASSERT_TRUE(nocache->Get<std::string>(k).ok());
  EXPECT_EQ(counter2->gets.load(), 2);
  EXPECT_EQ(nocache->metrics().cache_hits, 0u);
}

TEST(Store, MetricsCountOperationsAndSizes) {
  auto store = MakeStore({.cache_bytes = 0});
  Key a = *store->Put(std::string(100, 'a'));
  Key b = *store->Put(std::string(300, 'b'));
  ASSERT_TRUE(store->Get<std::string>(a).ok());
  ASSERT_TRUE(store->Exists(b).ok());
  auto p = store->ProxyFor<std::string>(b);
  ASSERT_TRUE(p.Resolve().ok());
  ASSERT_TRUE(store->Evict(a).ok());
  StoreMetrics m = store->metrics();
  EXPECT_EQ(m.put.count, 2u);
  EXPECT_EQ(m.put.total_bytes, 400u);
  EXPECT_EQ(m.put.max_bytes, 300u);
  EXPECT_EQ(m.encode.count, 2u);
  EXPECT_EQ(m.get.count, 2u);  // Get + the proxy's resolve
  EXPECT_EQ(m.get.total_bytes, 400u);
  EXPECT_EQ(m.decode.count, 2u);
  EXPECT_EQ(m.exists.count, 1u);
  EXPECT_EQ(m.evict.count, 1u);
  EXPECT_EQ(m.resolve.count, 1u);
  EXPECT_EQ(m.resolve.total_bytes, 300u);
  for (const OpMetrics* op : {&m.put, &m.get, &m.resolve}) {
    EXPECT_GT(op->total_ns, 0u);
    EXPECT_GE(op->total_ns, op->max_ns);
    EXPECT_LE(op->mean_ns(), static_cast<double>(op->max_ns));
  }
  store->ResetMetrics();
  EXPECT_EQ(store->metrics().put.count, 0u);
  auto quiet = MakeStore({.metrics = false});
  ASSERT_TRUE(quiet->Put(std::string("x")).ok());
  EXPECT_EQ(quiet->metrics().put.count, 0u);
}

TEST(Store, CloseMakesEveryCallFail) {
  auto store = MakeStore();
  Key k = *store->Put(std::string("x"));
  store->Close();
  store->Close();  // idempotent
  EXPECT_TRUE(store->closed());
  EXPECT_EQ(store->Put(std::string("y")).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Get<std::string>(k).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Exists(k).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Evict(k).code(), StatusCode::kFailedPrecondition);
}

TEST(Store, TagsNeedAPlacementAwareConnector) {
  auto store = MakeStore();
  EXPECT_EQ(store->Put(std::string("x"), {.subset_tags = {"gpu"}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Store::Create("", nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST(StoreRegistry, CreatesOncePerName) {
  StoreRegistry registry;
  StoreConfig config{"models", FreshConnectorConfig("memory"), {}};
  auto a = registry.GetOrCreate(config);
  auto b = registry.GetOrCreate(config);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(registry.Find("models").get(), a->get());
  EXPECT_EQ(registry.Names(), std::vector<std::string>{"models"});
  auto other = Store::FromConfig(config);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(registry.Register(*other).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(registry.Register(*a).ok());  // the same store again is fine
  // A closed store is replaced.
  (*a)->Close();
  EXPECT_EQ(registry.Find("models"), nullptr);
  auto c = registry.GetOrCreate(config);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->get(), a->get());
  registry.Unregister("models");
  EXPECT_EQ(registry.Find("models"), nullptr);
  // A config whose connector cannot be built is an error naming the store.
  auto bad = registry.GetOrCreate({"broken", {"tape", {}}, {}});
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("broken"), std::string::npos);
}

TEST(StoreConfig, JsonRoundTrips) {
  StoreConfig c{"s", {"file", {{"dir", "/tmp/x"}}}, {.cache_bytes = 12345, .metrics = false}};
  auto back = StoreConfig::FromJson(c.ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->name, "s");
  EXPECT_EQ(back->connector.options, c.connector.options);
  EXPECT_EQ(back->options.cache_bytes, 12345u);
  EXPECT_FALSE(back->options.metrics);
  ProxyReference r{c,
                   Key{"file", "abc", 10, {}},
                   {.evict_on_resolve = true, .resolve_timeout = std::chrono::milliseconds(7)}};
  auto rb = ProxyReference::FromJson(r.ToJson());
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(rb->key, r.key);
  EXPECT_TRUE(rb->options.evict_on_resolve);
  EXPECT_EQ(rb->options.resolve_timeout.count(), 7);
  EXPECT_FALSE(ProxyReference::FromJson("{}").ok());
  EXPECT_FALSE(ProxyReference::FromJson("[1]").ok());
  EXPECT_FALSE(StoreConfig::FromJson(R"({"name":"x"})").ok());
}

}  // namespace
}  // namespace xsilo
