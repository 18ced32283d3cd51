// xsilo against a real distributed S3 engine: Ceph's RADOS Gateway on a
// one-node cluster (scripts/ceph-rgw.sh, brought up once per ctest run by
// the fixture test ceph_rgw.up). Without a gateway every test fails with
// the reason; none skips.
//
// - the s3 connector's conformance suite on the gateway;
// - grpc+s3 with the store on the gateway: 1 server and 7 client processes
//   exchange Medium-tier models both ways for 3 rounds; only the server holds
//   the gateway's keys, the clients fetch by presigned GET and upload through
//   presigned multipart grants, which the gateway's access log shows;
// - one Big-tier (265 MB) model down and one up the same way.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "ceph/rgw.h"
#include "store/connector_conformance.h"
#include "transport/test_util.h"
#include "xsilo/core/tiers.h"
#include "xsilo/s3/client.h"
#include "xsilo/s3/credentials.h"
#include "xsilo/transport/registry.h"

namespace xsilo::testing {
namespace {

// The conformance suite's connectors: one bucket, a fresh prefix per test,
// 8 MiB parts so that multipart uploads and many ranges are exercised.
ConnectorConfig RgwConnectorConfig() {
  static int counter = 0;
  auto rgw = FindRgw();
  if (!rgw.ok()) {
    ADD_FAILURE() << rgw.status().ToString();
    return ConnectorConfig{"s3", {{"bucket", "unreachable"}, {"endpoint", "http://127.0.0.1:1"}}};
  }
  return ConnectorConfig{
      "s3",
      {{"endpoint", rgw->endpoint},
       {"bucket", "xsilo-conformance"},
       {"access_key", rgw->access_key},
       {"secret_key", rgw->secret_key},
       {"addressing", "path"},
       {"prefix", "t" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "/"},
       {"part_bytes", std::to_string(8 << 20)},
       {"connections", "4"},
       {"concurrency", "4"}}};
}

}  // namespace
}  // namespace xsilo::testing

// The > 2 GiB case is left to the embedded server's instantiation: on a
// memstore OSD it would hold that much RAM.
XSILO_CONNECTOR_CONFORMANCE(Rgw, {.name = "rgw",
                                  .config = [] { return RgwConnectorConfig(); },
                                  .huge_payloads = false});

namespace xsilo {
namespace {

using namespace std::chrono_literals;
using testing::FindRgw;
using testing::PatternIntact;
using testing::PatternMessage;
using testing::Rgw;

constexpr const char* kPartyEnv = "XSILO_RGW_PARTY";
constexpr int kClients = 7;
constexpr int kRounds = 3;
constexpr uint64_t kMediumBytes = 20'610'072;  // the Medium tier, float32

TransportOptions Party(int rank, int world, const std::string& address,
                       std::map<std::string, std::string> backend) {
  TransportOptions o;
  o.rank = rank;
  o.world_size = world;
  o.address = address;
  o.backend = std::move(backend);
  return o;
}

// The server's options: the gateway, its keys, a bucket of the test's own,
// and upload grants for the clients, which get none of these.
std::map<std::string, std::string> ServerStore(const Rgw& rgw, const std::string& bucket) {
  return {{"store.endpoint", rgw.endpoint},     {"store.bucket", bucket},
          {"store.access_key", rgw.access_key}, {"store.secret_key", rgw.secret_key},
          {"store.addressing", "path"},         {"grants", "1"}};
}

std::unique_ptr<S3Client> RgwClient(const Rgw& rgw) {
  S3ClientOptions co;
  co.endpoint = rgw.endpoint;
  co.addressing = S3Addressing::kPath;
  co.credentials = StaticCredentials({rgw.access_key, rgw.secret_key});
  auto c = S3Client::Create(co);
  return c.ok() ? std::move(c).value() : nullptr;
}

// Every object of `bucket` was evicted; the bucket goes.
void ExpectEmptyAndDelete(const Rgw& rgw, const std::string& bucket) {
  auto client = RgwClient(rgw);
  ASSERT_NE(client, nullptr);
  auto listed = client->ListObjects({.bucket = bucket, .fetch_all = true});
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_TRUE(listed->objects.empty())
      << listed->objects.size() << " objects left, first " << listed->objects.front().key;
  auto uploads = client->ListMultipartUploads({.bucket = bucket});
  ASSERT_TRUE(uploads.ok()) << uploads.status().ToString();
  EXPECT_TRUE(uploads->empty()) << uploads->size() << " multipart uploads left";
  EXPECT_TRUE(client->DeleteBucket({bucket}).ok());
}

// Client process: no store options at all; each round, receive the model
// and send an update of the same size.
int RunClient(int rank, const std::string& address) {
  auto t = TransportRegistry::Global().Create("grpc+s3", Party(rank, kClients + 1, address, {}));
  if (!t.ok() || !(*t)->Start().ok()) return 2;
  for (int r = 0; r < kRounds; ++r) {
    auto model = (*t)->Receive(300s);
    if (!model.ok() || !PatternIntact(*model) || model->round != r) return 3;
    Message update = PatternMessage(kMediumBytes, 1000 * rank + r, r);
    update.type = "update";
    if (!(*t)->Send(0, std::move(update), 300s).ok()) return 4;
  }
  // Stay until the server is done with our uploads, then confirm.
  auto bye = (*t)->Receive(300s);
  if (!bye.ok() || bye->type != "bye") return 5;
  Message done;
  done.type = "done";
  Status said = (*t)->Send(0, std::move(done), 60s);
  (*t)->Stop();
  return said.ok() ? 0 : 6;
}

TEST(GrpcS3Rgw, SevenClientProcessesThreeRoundsBothWaysThroughPresignedUrls) {
  auto rgw = FindRgw();
  ASSERT_TRUE(rgw.ok()) << rgw.status().ToString();
  const std::string bucket = testing::FreshBucket("seven");
  const std::string address = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  auto server = TransportRegistry::Global().Create(
      "grpc+s3", Party(0, kClients + 1, address, ServerStore(*rgw, bucket)));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<pid_t> clients;
  for (int c = 1; c <= kClients; ++c) {
    clients.push_back(testing::SpawnSelfWithEnv(std::string(kPartyEnv) + "=" + std::to_string(c) +
                                                "|" + address));
    ASSERT_GT(clients.back(), 0);
  }
  ASSERT_TRUE((*server)->Start().ok());
  std::vector<int32_t> peers;
  for (int c = 1; c <= kClients; ++c) peers.push_back(c);
  for (int r = 0; r < kRounds; ++r) {
    Message model = PatternMessage(kMediumBytes, r, r);
    model.type = "model";
    ASSERT_TRUE((*server)->Broadcast(peers, model, 300s).ok()) << "round " << r;
    std::set<int32_t> from;
    for (int n = 0; n < kClients; ++n) {
      auto u = (*server)->Receive(300s);
      ASSERT_TRUE(u.ok()) << u.status().ToString();
      EXPECT_TRUE(PatternIntact(*u));
      EXPECT_EQ(u->round, r);
      EXPECT_EQ(u->tensors.begin()->second.nbytes(), kMediumBytes);
      from.insert(u->sender);
    }
    EXPECT_EQ(from.size(), size_t{kClients});
  }
  Message bye;
  bye.type = "bye";
  EXPECT_TRUE((*server)->Broadcast(peers, bye, 60s).ok());
  for (int n = 0; n < kClients; ++n) {
    auto done = (*server)->Receive(60s);
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_EQ(done->type, "done");
  }
  for (pid_t pid : clients) {
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "client exit status " << st;
  }
  (*server)->Stop();

  // What the gateway saw: every model fetched by presigned (ranged) GETs,
  // every update a multipart upload through presigned part URLs (a Medium
  // model is more than one 5 MiB part) and one presigned completion.
  auto seen = testing::CountPresigned(*rgw, bucket, kClients * kRounds);
  EXPECT_GE(seen.gets, kClients * kRounds);
  EXPECT_EQ(seen.completions, kClients * kRounds);
  EXPECT_EQ(seen.part_puts, seen.puts);
  EXPECT_EQ(seen.part_puts, kClients * kRounds * int(kMediumBytes / (5 << 20)));
  ExpectEmptyAndDelete(*rgw, bucket);
}

// One Big-tier model (DistilBERT's 66,362,880 float32 parameters, 265 MB)
// from the server to a client without credentials, and one back.
TEST(GrpcS3Rgw, BigTierBothWaysThroughPresignedUrls) {
  auto rgw = FindRgw();
  ASSERT_TRUE(rgw.ok()) << rgw.status().ToString();
  const uint64_t big = FindTier("big")->parameters * 4;
  const std::string bucket = testing::FreshBucket("big");
  const std::string address = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  auto server = TransportRegistry::Global().Create("grpc+s3",
                                                   Party(0, 2, address, ServerStore(*rgw, bucket)));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = TransportRegistry::Global().Create("grpc+s3", Party(1, 2, address, {}));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::thread start([&] { ASSERT_TRUE((*server)->Start().ok()); });
  ASSERT_TRUE((*client)->Start().ok());
  start.join();

  {
    Message model = PatternMessage(big, 7, 0);
    ASSERT_TRUE((*server)->Send(1, std::move(model), 600s).ok());
  }
  {
    auto got = (*client)->Receive(600s);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->tensors.at("w").nbytes(), big);
    EXPECT_TRUE(PatternIntact(*got));
  }
  {
    Message update = PatternMessage(big, 8, 0);
    ASSERT_TRUE((*client)->Send(0, std::move(update), 600s).ok());
  }
  {
    auto up = (*server)->Receive(600s);
    ASSERT_TRUE(up.ok()) << up.status().ToString();
    EXPECT_EQ(up->tensors.at("w").nbytes(), big);
    EXPECT_TRUE(PatternIntact(*up));
  }
  (*client)->Stop();
  (*server)->Stop();

  auto seen = testing::CountPresigned(*rgw, bucket, 1);
  EXPECT_GE(seen.gets, 1);  // ranged: many
  EXPECT_EQ(seen.completions, 1);
  EXPECT_GE(seen.part_puts, int(big / (64 << 20)));
  ExpectEmptyAndDelete(*rgw, bucket);
}

}  // namespace

int RunRgwPartyIfRequested() {
  const char* spec = std::getenv(kPartyEnv);
  if (spec == nullptr) return -1;
  std::string s = spec;
  auto bar = s.find('|');
  if (bar == std::string::npos) return 9;
  return RunClient(std::stoi(s.substr(0, bar)), s.substr(bar + 1));
}

}  // namespace xsilo
