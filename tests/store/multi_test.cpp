// The multi connector: conformance, policy routing, dormant members.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "store/connector_conformance.h"
#include "store/store_test_util.h"
#include "transport/test_util.h"
#include "xsilo/store/future.h"
#include "xsilo/store/multi.h"

namespace xsilo::testing {
namespace {

// A dormant member with the highest priority, a size-bounded one and a
// catch-all, all on file connectors (so keys resolve across processes).
ConnectorConfig ConformanceMultiConfig() {
  MultiMember dormant{"dormant", FreshConnectorConfig("file"), {}};
  dormant.policy.host_pattern = "no-such-host-[0-9]+";
  dormant.policy.priority = 100;
  MultiMember small{"small", FreshConnectorConfig("file"), {}};
  small.policy.max_size = 1 << 20;
  small.policy.priority = 10;
  MultiMember big{"big", FreshConnectorConfig("file"), {}};
  return MultiConnectorConfig({dormant, small, big});
}

// Small objects to Redis, large ones stay with their producer and are
// served by a peer connector (zmq, ucx): the whole suite through the
// routing, keys resolved in another process included (issue #33 item 5).
ConnectorConfig SmallToRedisLargeToPeer(const std::string& peer_type) {
  MultiMember small{"small", FreshConnectorConfig("redis"), {}};
  small.policy.max_size = 1 << 20;
  small.policy.priority = 1;
  MultiMember large{"large", ConnectorConfig{peer_type, {}}, {}};
  return MultiConnectorConfig({small, large});
}

}  // namespace
}  // namespace xsilo::testing

XSILO_CONNECTOR_CONFORMANCE(Multi, {.name = "multi", .config = [] {
                                      return ::xsilo::testing::ConformanceMultiConfig();
                                    }});
XSILO_CONNECTOR_CONFORMANCE(MultiRedisZmq,
                            {.name = "redis_zmq", .config = [] {
                               return ::xsilo::testing::SmallToRedisLargeToPeer("zmq");
                             }});
#ifdef XSILO_HAVE_UCX
XSILO_CONNECTOR_CONFORMANCE(MultiRedisUcx,
                            {.name = "redis_ucx", .config = [] {
                               return ::xsilo::testing::SmallToRedisLargeToPeer("ucx");
                             }});
#endif

namespace xsilo {
namespace {

using testing::FreshConnectorConfig;

std::unique_ptr<Connector> Multi(const std::vector<MultiMember>& members) {
  auto c = MakeConnector(MultiConnectorConfig(members));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

std::string RouteOf(const Result<Key>& key) {
  if (!key.ok()) return "error: " + key.status().ToString();
  return key->attrs.at("multi.route");
}

TEST(MultiConnector, SmallObjectsGoToRedisAndLargeOnesStayWithTheirProducer) {
  auto c = MakeConnector(testing::SmallToRedisLargeToPeer("zmq"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto small = (*c)->Put(Buffer::CopyFrom(std::string(1000, 's')));
  auto large = (*c)->Put(testing::PatternTensor(3 << 20, 1).data);
  EXPECT_EQ(RouteOf(small), "small");
  EXPECT_EQ(small->attrs.at("multi.type"), "redis");
  EXPECT_EQ(RouteOf(large), "large");
  EXPECT_EQ(large->attrs.at("multi.type"), "zmq");
  EXPECT_EQ((*(*c)->Get(*large))->size(), 3u << 20);
  (*c)->Close();
}

TEST(MultiConnector, RoutesBySize) {
  MultiMember small{"small", FreshConnectorConfig("memory"), {.max_size = 1000, .priority = 1}};
  MultiMember big{"big", FreshConnectorConfig("file"), {.min_size = 1001}};
  auto c = Multi({small, big});
  EXPECT_EQ(RouteOf(c->Put(Buffer::CopyFrom(std::string(10, 'a')))), "small");
  EXPECT_EQ(RouteOf(c->Put(Buffer::CopyFrom(std::string(1000, 'a')))), "small");
  auto k = c->Put(Buffer::CopyFrom(std::string(5000, 'b')));
  EXPECT_EQ(RouteOf(k), "big");
  // The bytes really are in the big member's directory, under the key's id.
  EXPECT_TRUE(std::filesystem::exists(big.connector.options.at("dir") + "/" + k->id));
  EXPECT_EQ((*c->Get(*k))->size(), 5000u);
  EXPECT_TRUE(*c->Exists(*k));
  ASSERT_TRUE(c->Evict(*k).ok());
  EXPECT_FALSE(*c->Exists(*k));
}

TEST(MultiConnector, HighestPriorityWinsAndTiesGoToTheFirst) {
  MultiMember a{"a", FreshConnectorConfig("memory"), {.priority = 1}};
  MultiMember b{"b", FreshConnectorConfig("memory"), {.priority = 5}};
  MultiMember c{"c", FreshConnectorConfig("memory"), {.priority = 5}};
  EXPECT_EQ(RouteOf(Multi({a, b, c})->Put(Buffer::CopyFrom("x"))), "b");
  EXPECT_EQ(RouteOf(Multi({a, c, b})->Put(Buffer::CopyFrom("x"))), "c");
  b.policy.priority = -1;
  c.policy.priority = -1;
  EXPECT_EQ(RouteOf(Multi({b, c, a})->Put(Buffer::CopyFrom("x"))), "a");
}

TEST(MultiConnector, RoutesByTags) {
  MultiMember gpu{"gpu", FreshConnectorConfig("memory"), {.subset_tags = {"gpu", "fast"}}};
  MultiMember secure{"secure", FreshConnectorConfig("memory"), {.superset_tags = {"encrypted"}}};
  MultiMember plain{"plain", FreshConnectorConfig("memory"), {.priority = 1}};
  auto c = Multi({gpu, secure, plain});
  auto* placed = dynamic_cast<PlacementAwareConnector*>(c.get());
  ASSERT_NE(placed, nullptr);
  GatherList g;
  g.Append(Buffer::CopyFrom("obj"));
  // subset: the put's tags must all be among the policy's.
  EXPECT_EQ(RouteOf(placed->PutPlaced(g, {.subset_tags = {"gpu"}})), "gpu");
  EXPECT_EQ(RouteOf(placed->PutPlaced(g, {.subset_tags = {"gpu", "fast"}})), "gpu");
  EXPECT_EQ(RouteOf(placed->PutPlaced(g, {.subset_tags = {"gpu", "slow"}})),
            "error: FailedPrecondition: multi: no active member's policy accepts an object of 3 "
            "bytes on host '" +
                MultiHostName() + "'");
  // superset: the put's tags must include all of the policy's.
  EXPECT_EQ(RouteOf(placed->PutPlaced(g, {.superset_tags = {"encrypted", "eu"}})), "plain");
  plain.policy.superset_tags = {"public"};
  auto c2 = Multi({gpu, secure, plain});
  auto* placed2 = dynamic_cast<PlacementAwareConnector*>(c2.get());
  EXPECT_EQ(RouteOf(placed2->PutPlaced(g, {.superset_tags = {"encrypted", "eu"}})), "gpu")
      << "gpu has no superset requirement, plain needs 'public'";
  EXPECT_EQ(RouteOf(placed2->PutPlaced(g, {.superset_tags = {"public"}})), "plain");
  // Without hints, tags do not restrict.
  EXPECT_EQ(RouteOf(c->Put(Buffer::CopyFrom("x"))), "plain");
  // A Store passes its hints through.
  auto store = *Store::Create("tagged", Multi({gpu, plain}));
  auto k = store->Put(std::string("weights"), {.subset_tags = {"fast"}});
  EXPECT_EQ(RouteOf(k), "gpu");
  EXPECT_EQ(**store->Get<std::string>(*k), "weights");
}

TEST(MultiConnector, DormantMemberIsNeverChosenAndItsKeysFailClearly) {
  MultiMember away{
      "away", FreshConnectorConfig("file"), {.host_pattern = "elsewhere-[0-9]+", .priority = 9}};
  MultiMember here{"here", FreshConnectorConfig("file"), {}};
  auto c = Multi({away, here});
  EXPECT_EQ(RouteOf(c->Put(Buffer::CopyFrom("x"))), "here");
  Key k{"multi", RandomObjectId(), 1, {{"multi.route", "away"}, {"multi.type", "file"}}};
  auto got = c->Get(k);
  EXPECT_EQ(got.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(got.status().message().find("dormant"), std::string::npos) << got.status().ToString();
  EXPECT_NE(got.status().message().find("elsewhere-[0-9]+"), std::string::npos);
  EXPECT_EQ(c->Exists(k).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Evict(k).code(), StatusCode::kFailedPrecondition);
  // A member whose connector cannot be built here is dormant too.
  MultiMember broken{"broken", {"tape", {}}, {.priority = 50}};
  auto c2 = Multi({broken, here});
  EXPECT_EQ(RouteOf(c2->Put(Buffer::CopyFrom("x"))), "here");
  k.attrs["multi.route"] = "broken";
  EXPECT_EQ(c2->Get(k).status().code(), StatusCode::kFailedPrecondition);
  // Keys naming no member, or lacking the route, are invalid.
  k.attrs["multi.route"] = "nobody";
  EXPECT_EQ(c2->Get(k).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c2->Get(Key{"multi", "x", 0, {}}).status().code(), StatusCode::kInvalidArgument);
  // With every member dormant there is nowhere to put.
  auto c3 = Multi({away});
  EXPECT_EQ(c3->Put(Buffer::CopyFrom("x")).status().code(), StatusCode::kFailedPrecondition);
}

TEST(MultiConnector, MemberDormantOnAnotherHostFailsThereButResolvesHere) {
  // "here" is active on every host except one named "elsewhere".
  MultiMember here{
      "here", FreshConnectorConfig("file"), {.host_pattern = "(?!elsewhere$).*", .priority = 1}};
  MultiMember shared{"shared", FreshConnectorConfig("file"), {}};
  auto store = *Store::Create("multi-xhost", Multi({here, shared}));
  auto p = store->MakeProxy(std::string("local"));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(RouteOf(p->reference()->key), "here");
  std::string ref = *p->Serialize();
  EXPECT_EQ(testing::WaitChild(testing::SpawnStoreChild("resolve-string", ref)), 0);
  int code = testing::WaitChild(
      testing::SpawnStoreChild("resolve-string", ref, {"XSILO_HOSTNAME=elsewhere"}));
  EXPECT_EQ(code, 10 + static_cast<int>(StatusCode::kFailedPrecondition));
  // An object on a member without a host pattern resolves on both hosts.
  auto store2 = *Store::Create("multi-xhost-2", Multi({shared}));
  auto r = store2->MakeProxy(std::string("everywhere"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(testing::WaitChild(testing::SpawnStoreChild("resolve-string", *r->Serialize(),
                                                        {"XSILO_HOSTNAME=elsewhere"})),
            0);
}

TEST(MultiConnector, ConfigRoundTripsAndIsValidated) {
  MultiMember a{"a",
                FreshConnectorConfig("file"),
                {.min_size = 1,
                 .max_size = 99,
                 .subset_tags = {"x"},
                 .superset_tags = {"y"},
                 .host_pattern = ".*",
                 .priority = -3}};
  ConnectorConfig config = MultiConnectorConfig({a});
  auto c = MakeConnector(config);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->config().options, config.options);
  auto members = ParseMultiMembers(config.options);
  ASSERT_TRUE(members.ok());
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ((*members)[0].policy.subset_tags, std::set<std::string>{"x"});
  EXPECT_EQ((*members)[0].policy.priority, -3);
  EXPECT_EQ((*members)[0].connector.options, a.connector.options);

  auto bad = [](std::string connectors) {
    return MakeConnector({"multi", {{"connectors", std::move(connectors)}}}).status().code();
  };
  const std::string file = R"("connector":{"type":"file","options":{"dir":"/tmp/x"}})";
  EXPECT_EQ(bad("not json"), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad(R"([{"name":"a",)" + file + R"(,"colour":"red"}])"), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad(R"([{"name":"a",)" + file + R"(,"host_pattern":"("}])"),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(bad(R"([{"name":"a",)" + file + R"(},{"name":"a",)" + file + "}]"),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(bad(R"([{"name":"a/b",)" + file + "}]"), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad(R"([{"name":"a",)" + file + R"(,"min_size":5,"max_size":4}])"),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeConnector({"multi", {}}).status().code(), StatusCode::kInvalidArgument);
}

TEST(MultiConnector, FutureOnARedisMemberIsNotified) {
  MultiMember fast{"fast", FreshConnectorConfig("redis"), {.priority = 1}};
  MultiMember disk{"disk", FreshConnectorConfig("file"), {}};
  auto signal = std::make_unique<testing::MissCounter>(Multi({fast, disk}));
  testing::MissCounter* misses = signal.get();
  auto store = *Store::Create("multi-future", std::move(signal));
  auto f = Future<std::string>::Create(store);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->key().attrs.at("multi.route"), "fast");
  std::thread setter([&] {
    // Sets only once the Get below has found the value unset and waits.
    EXPECT_TRUE(misses->WaitForMoreMissesThan(0)) << "the Get never looked";
    EXPECT_TRUE(f->Set("routed").ok());
  });
  auto v = Future<std::string>(*f).Get(std::chrono::seconds(60));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "routed");
}

}  // namespace
}  // namespace xsilo
