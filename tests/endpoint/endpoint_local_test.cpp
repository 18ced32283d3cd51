// The endpoint's local API and the connector's options: the size bound,
// persistence, bad inputs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "endpoint/endpoint_test_util.h"
#include "net/http_client.h"

namespace xsilo::testing {
namespace {

TEST(EndpointConnector, UnknownOptionIsInvalidArgument) {
  auto c = MakeConnector({"endpoint", {{"address", "127.0.0.1:1"}, {"bogus", "1"}}});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  c = MakeConnector({"endpoint", {}});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  c = MakeConnector({"endpoint", {{"address", "nowhere"}}});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  c = MakeConnector({"endpoint", {{"address", "127.0.0.1:1"}, {"timeout_ms", "0"}}});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  c = MakeConnector({"endpoint", {{"address", "127.0.0.1:1"}, {"put_to", "a/b"}}});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
}

TEST(EndpointConnector, UnreachableEndpointIsUnavailable) {
  // A port that was just free: nothing listens there.
  int port = 0;
  int fd = *net::ListenTcp({"127.0.0.1", 0}, &port);
  net::CloseFd(fd);
  auto c = MakeConnector(
      {"endpoint", {{"address", "127.0.0.1:" + std::to_string(port)}, {"timeout_ms", "2000"}}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->Put(Buffer::CopyFrom("x")).status().code(), StatusCode::kUnavailable);
  Key k{"endpoint", "abc", 1, {{"endpoint", "someone"}}};
  EXPECT_EQ((*c)->Get(k).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ((*c)->NewKey().status().code(), StatusCode::kUnavailable);
}

TEST(EndpointConnector, KeyWithoutOwnerIsInvalidArgument) {
  auto e = StartEndpoint({});
  auto c = ConnectorFor(*e);
  Key k{"endpoint", "abc", 1, {}};
  EXPECT_EQ(c->Get(k).status().code(), StatusCode::kInvalidArgument);
  k.attrs["endpoint"] = "../etc";
  EXPECT_EQ(c->Exists(k).status().code(), StatusCode::kInvalidArgument);
}

TEST(Endpoint, PutPastTheBoundIsResourceExhaustedAndStoresNothing) {
  endpoint::EndpointOptions o;
  o.max_bytes = 1 << 20;
  auto e = StartEndpoint(o);
  auto c = ConnectorFor(*e);
  auto small = c->Put(Buffer::CopyFrom(std::string(600 << 10, 'a')));
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  auto big = c->Put(Buffer::CopyFrom(std::string(600 << 10, 'b')));
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted) << big.status().ToString();
  EXPECT_EQ(e->table().objects(), 1u);
  EXPECT_EQ(e->table().bytes(), uint64_t{600 << 10});
  // A large refused put is answered before its body is sent (100-continue):
  // the refusal arrives as such, not as a reset connection.
  auto huge = c->Put(Buffer::CopyFrom(std::string(64 << 20, 'c')));
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status().ToString();
  ASSERT_TRUE(c->Evict(*small).ok());
  EXPECT_TRUE(c->Put(Buffer::CopyFrom(std::string(600 << 10, 'b'))).ok());
}

TEST(Endpoint, DirectoryKeepsObjectsAndUuidAcrossRestarts) {
  endpoint::EndpointOptions o;
  o.dir = TempDir("endpoint-persist");
  Key key;
  std::string uuid;
  {
    auto e = StartEndpoint(o);
    uuid = e->uuid();
    auto k = ConnectorFor(*e)->Put(Buffer::CopyFrom("kept"));
    ASSERT_TRUE(k.ok());
    key = *k;
    EXPECT_EQ(key.attrs.at("endpoint"), uuid);
  }
  auto e = StartEndpoint(o);
  EXPECT_EQ(e->uuid(), uuid);
  auto got = ConnectorFor(*e)->Get(key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->view(), "kept");
}

TEST(Endpoint, StatusCountsLocalServes) {
  auto e = StartEndpoint({});
  auto c = ConnectorFor(*e);
  auto k = c->Put(Buffer::CopyFrom("x"));
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE(c->Get(*k).ok());
  auto r = net::HttpCall({"127.0.0.1", e->port()}, "GET", "/objects/" + k->id, nullptr,
                         std::chrono::seconds(5));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->headers["x-xsilo-path"], "local");
  EXPECT_GE(e->served(endpoint::Path::kLocal), 3u);
  EXPECT_NE(e->StatusJson().find("\"objects\":1"), std::string::npos) << e->StatusJson();
}

// The local API acts with the site's identity: off loopback it needs a
// token, and with a token every call must carry it (#58 gap 3).
TEST(Endpoint, ALocalApiOffLoopbackNeedsAToken) {
  endpoint::EndpointOptions o;
  o.listen = "0.0.0.0:0";
  auto e = endpoint::Endpoint::Start(o);
  ASSERT_EQ(e.status().code(), StatusCode::kInvalidArgument) << e.status().ToString();
  EXPECT_NE(e.status().message().find("not loopback"), std::string::npos);
  o.token = "a-token-of-this-site";
  auto with_token = endpoint::Endpoint::Start(o);
  ASSERT_TRUE(with_token.ok()) << with_token.status().ToString();
  (*with_token)->Stop();
}

TEST(Endpoint, WithATokenEveryLocalCallMustCarryIt) {
  endpoint::EndpointOptions o;
  o.token = "the-right-token-" + RandomObjectId();
  auto e = StartEndpoint(o);
  const std::string address = "127.0.0.1:" + std::to_string(e->port());
  const auto dir = std::filesystem::temp_directory_path() / ("xsilo-token-" + RandomObjectId());
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    const auto path = dir / name;
    std::ofstream(path) << text << "\n";
    std::filesystem::permissions(
        path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    return path.string();
  };

  // Without the token and with a wrong one: 401 on every route.
  auto bare = MakeConnector({"endpoint", {{"address", address}}});
  ASSERT_TRUE(bare.ok());
  auto refused = (*bare)->Put(Buffer::CopyFrom("x"));
  EXPECT_EQ(refused.status().code(), StatusCode::kUnauthenticated) << refused.status().ToString();
  auto wrong = MakeConnector(
      {"endpoint", {{"address", address}, {"token_file", write("wrong", o.token + "x")}}});
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ((*wrong)->Put(Buffer::CopyFrom("x")).status().code(), StatusCode::kUnauthenticated);
  for (const char* target : {"/status", "/uuid", "/objects/abc"}) {
    auto r =
        net::HttpCall({"127.0.0.1", e->port()}, "GET", target, nullptr, std::chrono::seconds(10));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 401) << target;
    EXPECT_EQ(r->headers.count("x-xsilo-endpoint"), 0u) << "the uuid leaked on " << target;
  }
  EXPECT_EQ(e->table().objects(), 0u);

  // With it: the connector works, and its config names the file only.
  auto right =
      MakeConnector({"endpoint", {{"address", address}, {"token_file", write("right", o.token)}}});
  ASSERT_TRUE(right.ok()) << right.status().ToString();
  auto key = (*right)->Put(Buffer::CopyFrom("kept"));
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto got = (*right)->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->view(), "kept");
  EXPECT_EQ((*right)->config().ToJson().find(o.token), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace xsilo::testing
