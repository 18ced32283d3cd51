// Two endpoints and a relay: an object owned by B is read through A's
// endpoint directly when B's peer address can be dialled, and through the
// relay's pipe when it cannot; both deliver the exact bytes.
#include <gtest/gtest.h>

#include <thread>

#include "endpoint/endpoint_test_util.h"
#include "net/http_client.h"
#include "transport/test_util.h"

namespace xsilo::testing {
namespace {

using endpoint::Path;

constexpr uint64_t kBig = 64ull << 20;

struct TwoSites {
  std::string ca;
  std::unique_ptr<endpoint::Relay> relay;
  std::unique_ptr<endpoint::Endpoint> a, b;

  // b_reachable: B listens for peers; otherwise B advertises `b_advertise`
  // (nothing, or an address where nobody listens). a_listens: A has a peer
  // listener too, advertising `a_advertise` (default: the listener).
  // punch: try the hole-punched path (on loopback it always works, so the
  // relay's tests leave it off).
  explicit TwoSites(bool b_reachable, std::vector<std::string> b_advertise = {},
                    endpoint::RelayOptions relay_options = {}, bool a_listens = false,
                    std::vector<std::string> a_advertise = {}, bool punch = false) {
    relay = StartRelay(std::move(relay_options), &ca);
    endpoint::EndpointOptions o;
    o.relay = "127.0.0.1:" + std::to_string(relay->port());
    o.relay_ca = ca;
    o.punch = punch;
    if (a_listens) o.peer_listen = "127.0.0.1:0";
    o.advertise = std::move(a_advertise);
    a = StartEndpoint(o);
    o.peer_listen.clear();
    if (b_reachable) o.peer_listen = "127.0.0.1:0";
    o.advertise = std::move(b_advertise);
    b = StartEndpoint(o);
  }
};

// A port nothing listens on.
std::string DeadAddress() {
  int port = 0;
  int fd = *net::ListenTcp({"127.0.0.1", 0}, &port);
  net::CloseFd(fd);
  return "127.0.0.1:" + std::to_string(port);
}

// Reads B's object through A and returns the path A reported.
std::string PathThroughA(const TwoSites& s, const Key& key) {
  auto r = net::HttpCall({"127.0.0.1", s.a->port()}, "HEAD",
                         "/objects/" + key.id + "?endpoint=" + key.attrs.at("endpoint"), nullptr,
                         std::chrono::seconds(30));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->headers["x-xsilo-path"] : "";
}

void ExpectBigObjectThroughA(const TwoSites& s, Path want) {
  ASSERT_TRUE(s.a->registered() && s.b->registered());
  auto via_b = ConnectorFor(*s.b);
  auto via_a = ConnectorFor(*s.a);
  Buffer big = PatternTensor(kBig, 3).data;
  auto key = via_b->Put(big);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_EQ(key->attrs.at("endpoint"), s.b->uuid());
  auto got = via_a->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ(Checksum((*got)->span()), Checksum(big.span()));
  EXPECT_EQ(s.a->served(want), 1u);
  EXPECT_EQ(s.a->table().objects(), 0u) << "A keeps no copy of B's object";
  EXPECT_EQ(PathThroughA(s, *key), endpoint::PathName(want));
  // The other operations reach the owner the same way. B wrote this
  // object, so B refuses A's delete (a peer changes only what it wrote).
  EXPECT_TRUE(*via_a->Exists(*key));
  EXPECT_EQ(via_a->Evict(*key).code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(*via_b->Exists(*key));
  auto later = via_a->NewKey();  // A's own key
  ASSERT_TRUE(later.ok());
  Key on_b = *later;
  on_b.attrs["endpoint"] = s.b->uuid();
  GatherList g;
  g.Append(Buffer::CopyFrom("set through A"));
  ASSERT_TRUE(via_a->Set(on_b, g).ok());
  auto back = via_b->Get(on_b);
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ((*back)->view(), "set through A");
  ASSERT_TRUE(via_a->Evict(on_b).ok()) << "A deletes what it wrote";
  EXPECT_FALSE(*via_b->Exists(on_b));
  for (Path other : {Path::kDirect, Path::kReverse, Path::kPunched, Path::kRelayed}) {
    if (other != want) {
      EXPECT_EQ(s.a->served(other), 0u) << endpoint::PathName(other);
    }
  }
}

TEST(EndpointPaths, DirectWhenTheOwnerCanBeDialled) {
  TwoSites s(true);
  ExpectBigObjectThroughA(s, Path::kDirect);
  EXPECT_EQ(s.relay->pipes_opened(), 0u);
}

TEST(EndpointPaths, RelayedWhenTheOwnerHasNoPeerListener) {
  TwoSites s(false);
  ExpectBigObjectThroughA(s, Path::kRelayed);
  EXPECT_GE(s.relay->pipes_opened(), 1u);
}

// During a relayed GET the requester-to-owner direction is silent after the
// request; the pipe must live as long as the other direction moves bytes,
// however much longer than one receive timeout that takes. The hook holds
// each forwarded window 100 ms: 64 windows, about 6.4 s, against a 3 s
// timeout (a gap of 3 s between two windows would be needed to fail).
TEST(EndpointPaths, ARelayedTransferLongerThanTheIoTimeoutCompletes) {
  endpoint::RelayOptions ro;
  ro.io_timeout = std::chrono::seconds(3);
  ro.on_pipe_progress = [](uint64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  };
  TwoSites s(false, {}, ro);
  ASSERT_TRUE(s.a->registered() && s.b->registered());
  Buffer object = PatternTensor(16ull << 20, 9).data;  // 64 windows of 256 KiB
  auto key = ConnectorFor(*s.b)->Put(object);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  const auto start = std::chrono::steady_clock::now();
  auto got = ConnectorFor(*s.a)->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ(Checksum((*got)->span()), Checksum(object.span()));
  EXPECT_EQ(s.a->served(Path::kRelayed), 1u);
  EXPECT_GT(std::chrono::steady_clock::now() - start, ro.io_timeout)
      << "the transfer must outlast one receive timeout to test this";
}

// B cannot be dialled but can dial A: the relay asks B to dial A's peer
// listener, and A runs the same pinned session on the socket it accepted.
TEST(EndpointPaths, ReverseWhenOnlyTheRequesterCanBeDialled) {
  TwoSites s(false, {}, {}, /*a_listens=*/true);
  ExpectBigObjectThroughA(s, Path::kReverse);
  EXPECT_EQ(s.relay->pipes_opened(), 0u);
}

// Neither side can be dialled; ICE finds a UDP pair (on one machine, the
// host candidates) and the session runs over pseudo-TCP on it.
TEST(EndpointPaths, PunchedWhenNeitherSideCanBeDialled) {
  TwoSites s(false, {}, {}, false, {}, /*punch=*/true);
  ASSERT_TRUE(s.a->registered() && s.b->registered());
  Buffer object = PatternTensor(4ull << 20, 6).data;
  auto key = ConnectorFor(*s.b)->Put(object);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto got = ConnectorFor(*s.a)->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ(Checksum((*got)->span()), Checksum(object.span()));
  EXPECT_EQ(s.a->served(Path::kPunched), 1u);
  EXPECT_EQ(s.relay->pipes_opened(), 0u);
}

TEST(EndpointPaths, RelayedWhenNeitherSideCanBeDialled) {
  TwoSites s(false, {DeadAddress()}, {}, /*a_listens=*/true, {DeadAddress()});
  ExpectBigObjectThroughA(s, Path::kRelayed);
}

TEST(EndpointPaths, RelayedWhenTheAdvertisedAddressCannotBeDialled) {
  TwoSites s(false, {DeadAddress()});
  ExpectBigObjectThroughA(s, Path::kRelayed);
}

TEST(EndpointPaths, UnknownOwnerIsUnavailableNotMissing) {
  TwoSites s(true);
  Key k{"endpoint", RandomObjectId(), 0, {{"endpoint", "not-registered-anywhere"}}};
  EXPECT_EQ(ConnectorFor(*s.a)->Get(k).status().code(), StatusCode::kUnavailable);
}

TEST(EndpointPaths, PutPastTheOwnersBoundIsResourceExhaustedOnBothPaths) {
  for (bool direct : {true, false}) {
    std::string ca;
    auto relay = StartRelay({}, &ca);
    endpoint::EndpointOptions o;
    o.relay = "127.0.0.1:" + std::to_string(relay->port());
    o.relay_ca = ca;
    o.punch = false;
    auto a = StartEndpoint(o);
    if (direct) o.peer_listen = "127.0.0.1:0";
    o.max_bytes = 1 << 20;
    auto b = StartEndpoint(o);
    auto c = MakeConnector(
        {"endpoint",
         {{"address", "127.0.0.1:" + std::to_string(a->port())}, {"put_to", b->uuid()}}});
    ASSERT_TRUE(c.ok());
    auto k = (*c)->Put(PatternTensor(kBig, 4).data);
    EXPECT_EQ(k.status().code(), StatusCode::kResourceExhausted) << k.status().ToString();
    EXPECT_EQ(b->table().objects(), 0u);
    EXPECT_EQ(a->table().objects(), 0u);
    auto small = (*c)->Put(Buffer::CopyFrom("fits"));
    ASSERT_TRUE(small.ok()) << small.status().ToString();
    EXPECT_EQ(b->table().objects(), 1u);
    EXPECT_EQ(a->served(direct ? Path::kDirect : Path::kRelayed), 2u);
  }
}

}  // namespace
}  // namespace xsilo::testing
