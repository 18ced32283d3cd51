// Multi-process exchanges of models over grpc (1 and 4 streams) and grpc+s3.
//
// grpc+s3, the paper's hybrid backend, across processes: the transport
// conformance suite with the embedded object server, and a FedAvg-shaped
// exchange (1 server, 7 client processes, models both ways, 3 rounds)
// against an S3 endpoint that only the server holds credentials for: the
// clients download by presigned GET and upload through presigned PUT
// grants. The bucket is listed empty afterwards.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

#include "hybrid/embedded_s3.h"
#include "log_capture.h"
#include "s3/s3rver.h"
#include "transport/conformance.h"
#include "transport/test_util.h"
#include "xsilo/core/encode_stream.h"
#include "xsilo/hybrid/hybrid.h"
#include "xsilo/s3/client.h"
#include "xsilo/s3/credentials.h"
#include "xsilo/s3/server.h"
#include "xsilo/transport/compression.h"

extern char** environ;

// Embedded object server in a child of rank 0; clients hold no credentials
// and fetch through presigned URLs.
XSILO_TRANSPORT_CONFORMANCE(GrpcS3Embedded, {.backend = "grpc+s3",
                                             .backend_options = {{"threshold", "65536"}},
                                             .network = true,
                                             .label = "grpc_s3_embedded"});

// auto+s3: grpc and the embedded object server, the path chosen per message
// by the measured link (on loopback: inline once a round trip is known; the
// store by the 10 MiB default before).
XSILO_TRANSPORT_CONFORMANCE(AutoS3, {.backend = "auto+s3", .network = true, .label = "auto_s3"});

// TLS on both legs: grpc with mutual TLS and the embedded object server on
// https, both with one self-signed pair (made by the environment below),
// which every party trusts as its CA; presigned URLs are https.
namespace xsilo::testing {
inline std::string HybridTlsDir() { return "/tmp/xsilo-hybrid-tls-" + std::to_string(::getpid()); }
}  // namespace xsilo::testing
XSILO_TRANSPORT_CONFORMANCE(
    GrpcS3Tls,
    {.backend = "grpc+s3",
     .backend_options = {{"threshold", "65536"},
                         {"tls_cert", xsilo::testing::HybridTlsDir() + "/cert.pem"},
                         {"tls_key", xsilo::testing::HybridTlsDir() + "/key.pem"},
                         {"tls_ca", xsilo::testing::HybridTlsDir() + "/cert.pem"},
                         {"tls_server_name", "localhost"},
                         {"store.tls_cert", xsilo::testing::HybridTlsDir() + "/cert.pem"},
                         {"store.tls_key", xsilo::testing::HybridTlsDir() + "/key.pem"},
                         {"store.ca_file", xsilo::testing::HybridTlsDir() + "/cert.pem"}},
     .network = true,
     .label = "grpc_s3_tls"});

// s3rver as the external S3 endpoint: every party uploads and downloads
// through it with explicit keys. The parameters are built when gtest
// registers the tests (also when it only lists them), so they carry an
// endpoint whose port is fixed then; the server itself is started by the
// environment below, once per process and only when one of these tests
// runs. Receiver child processes get the options (endpoint included) from
// their parent.
XSILO_TRANSPORT_CONFORMANCE(GrpcS3rver,
                            {.backend = "grpc+s3",
                             .backend_options = {{"threshold", "65536"},
                                                 {"store.endpoint", SharedS3rverEndpoint()},
                                                 {"store.bucket", kSharedS3rverBucket},
                                                 {"store.access_key", S3rver::kAccessKey},
                                                 {"store.secret_key", S3rver::kSecretKey},
                                                 {"store.addressing", "path"}},
                             .network = true,
                             .label = "grpc_s3rver",
                             .huge_payloads = false});

namespace xsilo::testing {
namespace {

// Starts the shared s3rver before the tests if a GrpcS3rver test is
// selected; a missing s3rver fails the run with its message.
class S3rverEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const auto* unit = ::testing::UnitTest::GetInstance();
    for (int i = 0; i < unit->total_test_suite_count(); ++i) {
      const auto* suite = unit->GetTestSuite(i);
      if (std::string_view(suite->name()).starts_with("GrpcS3rver/") &&
          suite->test_to_run_count() > 0) {
        // Non-fatal: a fatal failure here would make gtest skip every test,
        // and ctest counts a skip as a pass. The tests run and fail instead.
        Status up = StartSharedS3rver();
        if (!up.ok()) ADD_FAILURE() << up.ToString();
        return;
      }
    }
  }
};

[[maybe_unused]] ::testing::Environment* const g_s3rver_environment =
    ::testing::AddGlobalTestEnvironment(new S3rverEnvironment);

// The self-signed pair of the GrpcS3Tls tests, made once per test process
// (receiver children use their parent's, named in the options they get).
class HybridTlsEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    std::filesystem::create_directories(HybridTlsDir());
    Status st = GenerateSelfSignedCertificate(
        HybridTlsDir() + "/cert.pem", HybridTlsDir() + "/key.pem", {"localhost", "127.0.0.1"});
    if (!st.ok()) ADD_FAILURE() << st.ToString();
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(HybridTlsDir(), ec);
  }
};

[[maybe_unused]] ::testing::Environment* const g_hybrid_tls_environment =
    ::testing::AddGlobalTestEnvironment(new HybridTlsEnvironment);

}  // namespace
}  // namespace xsilo::testing

namespace xsilo {
namespace {

using namespace std::chrono_literals;
using testing::PatternIntact;
using testing::PatternMessage;

constexpr const char* kPartyEnv = "XSILO_GRPC_S3_PARTY";
constexpr int kClients = 7;
constexpr int kRounds = 3;
constexpr uint64_t kModelBytes = 20'610'072;  // the Medium tier, float32

TransportOptions PartyOptions(int rank, const std::string& address,
                              const std::map<std::string, std::string>& store) {
  TransportOptions o;
  o.rank = rank;
  o.world_size = kClients + 1;
  o.address = address;
  o.backend = store;
  return o;
}

// Client process: receive the model, return an update of the same size.
int RunClient(const std::string& backend, int rank, const std::string& address,
              const std::map<std::string, std::string>& store) {
  auto t = TransportRegistry::Global().Create(backend, PartyOptions(rank, address, store));
  if (!t.ok() || !(*t)->Start().ok()) return 2;
  for (int r = 0; r < kRounds; ++r) {
    auto model = (*t)->Receive(120s);
    if (!model.ok() || !PatternIntact(*model) || model->round != r) return 3;
    Message update = PatternMessage(kModelBytes, 1000 * rank + r, r);
    update.type = "update";
    if (!(*t)->Send(0, std::move(update), 120s).ok()) return 4;
  }
  // Stay until the server says it is done, so our uploads are not evicted
  // early; confirm, so that the server knows we got it before we leave.
  auto bye = (*t)->Receive(120s);
  if (!bye.ok() || bye->type != "bye") return 5;
  Message done;
  done.type = "done";
  Status said = (*t)->Send(0, std::move(done), 60s);
  (*t)->Stop();
  return said.ok() ? 0 : 6;
}

std::string Encode(const std::map<std::string, std::string>& m) {
  std::string s;
  for (const auto& [k, v] : m) s += (s.empty() ? "" : ",") + k + "=" + v;
  return s;
}

pid_t SpawnClient(const std::string& backend, int rank, const std::string& address,
                  const std::map<std::string, std::string>& store) {
  return testing::SpawnSelfWithEnv(std::string(kPartyEnv) + "=" + std::to_string(rank) + "|" +
                                   address + "|" + backend + "|" + Encode(store));
}

// A FedAvg-shaped exchange: a server party in this process, kClients client
// processes (RunClient), Medium-tier models down and updates up for kRounds
// rounds, then "bye"/"done" and every client's exit status.
void RunSevenClientExchange(const std::string& backend,
                            const std::map<std::string, std::string>& server_options,
                            const std::map<std::string, std::string>& client_options) {
  std::string address = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  auto server =
      TransportRegistry::Global().Create(backend, PartyOptions(0, address, server_options));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<pid_t> clients;
  for (int c = 1; c <= kClients; ++c) {
    clients.push_back(SpawnClient(backend, c, address, client_options));
  }
  ASSERT_TRUE((*server)->Start().ok());
  std::vector<int32_t> peers;
  for (int c = 1; c <= kClients; ++c) peers.push_back(c);
  for (int r = 0; r < kRounds; ++r) {
    Message model = PatternMessage(kModelBytes, r, r);
    model.type = "model";
    ASSERT_TRUE((*server)->Broadcast(peers, model, 120s).ok()) << "round " << r;
    std::set<int32_t> from;
    for (int n = 0; n < kClients; ++n) {
      auto u = (*server)->Receive(120s);
      ASSERT_TRUE(u.ok()) << u.status().ToString();
      EXPECT_TRUE(PatternIntact(*u));
      EXPECT_EQ(u->round, r);
      EXPECT_EQ(u->tensors.begin()->second.nbytes(), kModelBytes);
      from.insert(u->sender);
    }
    EXPECT_EQ(from.size(), size_t{kClients});
  }
  // Every client answers "bye" with "done" and leaves. A client's Stop
  // drains: its delivery confirmation of "bye" is written before it says
  // goodbye, so the broadcast is confirmed by every client.
  Message bye;
  bye.type = "bye";
  Status said = (*server)->Broadcast(peers, bye, 60s);
  EXPECT_TRUE(said.ok()) << said.ToString();
  std::set<int32_t> done_from;
  for (int n = 0; n < kClients; ++n) {
    auto done = (*server)->Receive(60s);
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_EQ(done->type, "done");
    done_from.insert(done->sender);
  }
  EXPECT_EQ(done_from.size(), size_t{kClients});
  for (pid_t pid : clients) {
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "client exit status " << st;
  }
  (*server)->Stop();
}

TEST(GrpcS3, SevenClientProcessesThreeRoundsBothWaysLeaveTheBucketEmpty) {
  S3ServerOptions so;
  so.access_key = "test-access";
  so.secret_key = "test-secret-key";
  so.buckets = {"fl-run"};
  // Requests made with a presigned URL, by method.
  std::atomic<int> presigned_gets{0}, presigned_puts{0}, presigned_parts{0}, completions{0};
  so.on_request = [&](const S3FaultRequest& r) {
    if (r.query.find("X-Amz-Signature=") == std::string::npos) return;
    if (r.method == "GET") ++presigned_gets;
    if (r.method == "PUT") ++presigned_puts;
    if (r.method == "PUT" && r.query.find("partNumber=") != std::string::npos) ++presigned_parts;
    if (r.method == "POST" && r.query.find("uploadId=") != std::string::npos) ++completions;
  };
  auto s3 = S3Server::Start(so);
  ASSERT_TRUE(s3.ok()) << s3.status().ToString();
  // Only the server knows the endpoint and the keys; it grants uploads.
  std::map<std::string, std::string> store = {
      {"store.endpoint", (*s3)->endpoint()}, {"store.bucket", "fl-run"},
      {"store.access_key", so.access_key},   {"store.secret_key", so.secret_key},
      {"store.addressing", "path"},          {"grants", "1"}};
  RunSevenClientExchange("grpc+s3", store, {});
  if (::testing::Test::HasFatalFailure()) return;
  // Every model went down by presigned GET (ranged, so at least one request
  // each) and every update came up through a multipart grant: its parts in
  // parallel (a Medium model is more than one 5 MiB part), then one
  // completion each.
  EXPECT_GE(presigned_gets.load(), kClients * kRounds);
  EXPECT_EQ(completions.load(), kClients * kRounds);
  EXPECT_EQ(presigned_parts.load(), presigned_puts.load());
  EXPECT_EQ(presigned_parts.load(), kClients * kRounds * int(kModelBytes / (5 << 20)));

  S3ClientOptions co;
  co.endpoint = (*s3)->endpoint();
  co.addressing = S3Addressing::kPath;
  co.credentials = StaticCredentials({so.access_key, so.secret_key});
  auto client = S3Client::Create(co);
  ASSERT_TRUE(client.ok());
  auto listed = (*client)->ListObjects({.bucket = "fl-run", .fetch_all = true});
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_TRUE(listed->objects.empty())
      << listed->objects.size() << " objects left, first " << listed->objects.front().key;
}

// The same FedAvg-shaped exchange over plain grpc (the models travel as
// chunked frames on the clients' dial-out streams): 1 server, 7 client
// processes, Medium-tier models both ways, 3 rounds.
void ExchangeOverGrpc(const std::map<std::string, std::string>& options) {
  RunSevenClientExchange("grpc", options, options);
}

// Where the embedded server keeps objects: tmpfs when there is one.
std::filesystem::path EmbeddedBase() {
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0) {
    return "/dev/shm";
  }
  return std::filesystem::temp_directory_path();
}

std::vector<std::filesystem::path> OurEmbeddedDirs() {
  std::vector<std::filesystem::path> out;
  const std::string prefix = "xsilo-s3-" + std::to_string(::getpid()) + "-";
  for (const auto& e : std::filesystem::directory_iterator(EmbeddedBase())) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path());
  }
  return out;
}

// Rank `rank` of a world of two on `address`.
Result<std::unique_ptr<Transport>> PairParty(const std::string& backend, const std::string& address,
                                             int rank,
                                             std::map<std::string, std::string> options = {}) {
  TransportOptions o;
  o.rank = rank;
  o.world_size = 2;
  o.address = address;
  o.backend = std::move(options);
  return TransportRegistry::Global().Create(backend, o);
}

// Rank 0's embedded server keeps objects in a private tmpfs directory that
// rank 0 writes its own uploads into; the directory goes with the
// transport, and one left by a dead process is swept at the next start.
TEST(GrpcS3Embedded, ObjectsLiveInTmpfsAndGoWithTheTransport) {
  const auto stale = EmbeddedBase() / "xsilo-s3-2147483646-left";  // no such pid
  std::filesystem::create_directories(stale / "xsilo");
  std::string address = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  auto party = [&](int rank) { return PairParty("grpc+s3", address, rank); };
  auto server = party(0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(stale));
  auto dirs = OurEmbeddedDirs();
  ASSERT_EQ(dirs.size(), 1u);
  auto client = party(1);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::thread start([&] { ASSERT_TRUE((*server)->Start().ok()); });
  ASSERT_TRUE((*client)->Start().ok());
  start.join();

  Message model = PatternMessage(12 << 20, 1, 0);  // above the 10 MiB threshold
  ASSERT_TRUE((*server)->Send(1, model, 60s).ok());
  auto got = (*client)->Receive(60s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(PatternIntact(*got));
  // Up through a grant: a multipart upload of 2 parts, completed by URL.
  Message update = PatternMessage((12 << 20) + 7, 2, 0);
  ASSERT_TRUE((*client)->Send(0, update, 60s).ok());
  auto up = (*server)->Receive(60s);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  EXPECT_TRUE(PatternIntact(*up));

  (*client)->Stop();
  (*server)->Stop();
  client->reset();
  server->reset();
  EXPECT_FALSE(std::filesystem::exists(dirs[0]));
  EXPECT_TRUE(OurEmbeddedDirs().empty());
}

// A grant carries the smallest part its store accepts (min_part_bytes), so
// a credential-less party cuts a 12 MiB update into as many parts as it has
// part URLs (32) instead of S3's two parts of at least 5 MiB: every
// connection carries a share, as on a long link each must.
TEST(GrpcS3, AGrantCarriesTheStoresSmallestPartSoTheUploadUsesEveryConnection) {
  S3ServerOptions so;
  so.access_key = "test-access";
  so.secret_key = "test-secret-key";
  so.buckets = {"parts"};
  so.min_part_bytes = 256 << 10;
  std::atomic<int> parts{0}, completions{0};
  so.on_request = [&](const S3FaultRequest& r) {
    if (r.query.find("X-Amz-Signature=") == std::string::npos) return;
    if (r.method == "PUT" && r.query.find("partNumber=") != std::string::npos) ++parts;
    if (r.method == "POST" && r.query.find("uploadId=") != std::string::npos) ++completions;
  };
  auto s3 = S3Server::Start(so);
  ASSERT_TRUE(s3.ok()) << s3.status().ToString();
  // Without the key, the grant says S3's 5 MiB.
  for (const std::string min_part : {"", "262144"}) {
    SCOPED_TRACE("min_part_bytes '" + min_part + "'");
    parts = 0;
    completions = 0;
    std::map<std::string, std::string> store = {
        {"store.endpoint", (*s3)->endpoint()}, {"store.bucket", "parts"},
        {"store.access_key", so.access_key},   {"store.secret_key", so.secret_key},
        {"store.addressing", "path"},          {"grants", "1"}};
    if (!min_part.empty()) store["min_part_bytes"] = min_part;
    std::string address = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
    auto server = PairParty("grpc+s3", address, 0, store);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    auto client = PairParty("grpc+s3", address, 1);  // no credentials: grants only
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    std::thread start([&] { ASSERT_TRUE((*server)->Start().ok()); });
    ASSERT_TRUE((*client)->Start().ok());
    start.join();
    // A message from rank 0 brings the client its grants.
    ASSERT_TRUE((*server)->Send(1, PatternMessage(1024, 1, 0), 60s).ok());
    ASSERT_TRUE((*client)->Receive(60s).ok());
    ASSERT_TRUE((*client)->Send(0, PatternMessage((12 << 20) + 7, 2, 0), 60s).ok());
    auto up = (*server)->Receive(60s);
    ASSERT_TRUE(up.ok()) << up.status().ToString();
    EXPECT_TRUE(PatternIntact(*up));
    EXPECT_EQ(completions.load(), 1);
    EXPECT_EQ(parts.load(), min_part.empty() ? 2 : 32);
    (*client)->Stop();
    (*server)->Stop();
  }
}

// An object server with parts of 256 KiB that counts the parts PUT, and
// a pair of grpc+s3 parties over it (threshold 1: everything to the
// store): rank 0 with credentials, rank 1 with grants only.
struct GrantPair {
  std::unique_ptr<S3Server> s3;
  std::atomic<int> parts{0};
  std::unique_ptr<Transport> server, client;

  void Start(const std::map<std::string, std::string>& extra = {}) {
    S3ServerOptions so;
    so.access_key = "test-access";
    so.secret_key = "test-secret-key";
    so.buckets = {"parts"};
    so.min_part_bytes = 256 << 10;
    so.on_request = [this](const S3FaultRequest& r) {
      if (r.method == "PUT" && r.query.find("partNumber=") != std::string::npos) ++parts;
    };
    auto started = S3Server::Start(so);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    s3 = std::move(started).value();
    std::map<std::string, std::string> store = {
        {"store.endpoint", s3->endpoint()},  {"store.bucket", "parts"},
        {"store.access_key", so.access_key}, {"store.secret_key", so.secret_key},
        {"store.addressing", "path"},        {"grants", "1"},
        {"min_part_bytes", "262144"},        {"threshold", "1"}};
    std::map<std::string, std::string> own = {{"threshold", "1"}};
    for (const auto& [k, v] : extra) store[k] = own[k] = v;
    std::string address = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
    auto s = PairParty("grpc+s3", address, 0, store);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    auto c = PairParty("grpc+s3", address, 1, own);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    server = std::move(s).value();
    client = std::move(c).value();
    std::thread start([&] { ASSERT_TRUE(server->Start().ok()); });
    ASSERT_TRUE(client->Start().ok());
    start.join();
  }
  // A message from rank 0 tops up the client's grants.
  void Grant() {
    ASSERT_TRUE(server->Send(1, PatternMessage(1024, 1, 0), 60s).ok());
    ASSERT_TRUE(client->Receive(60s).ok());
  }
  ~GrantPair() {
    if (client) client->Stop();
    if (server) server->Stop();
  }
};

// The hybrid's log of a failing grant upload, debug lines included, quotes
// no presigned URL's signature or credential: the object server stops after
// the grants were issued, so the client's upload fails, is logged, and the
// message goes inline. The log is captured at debug.
TEST(GrpcS3, AFailingGrantUploadLogsNoSignature) {
  GrantPair pair;
  ASSERT_NO_FATAL_FAILURE(pair.Start());
  ASSERT_NO_FATAL_FAILURE(pair.Grant());
  pair.s3.reset();  // every URL of the client's grants now fails to connect
  std::string text;
  Status sent;
  Result<Message> got = Unavailable("not received");
  {
    LogCapture log("debug");
    sent = pair.client->Send(0, PatternMessage((3 << 20) + 5, 4, 0), 60s);
    got = pair.server->Receive(60s);
    text = log.text();
  }
  ASSERT_TRUE(sent.ok()) << sent.ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(PatternIntact(*got)) << "the message went inline, whole";

  // The failing path ran and named the URL it failed on.
  ASSERT_NE(text.find("failed, sending inline"), std::string::npos) << text;
  ASSERT_NE(text.find("redacted"), std::string::npos) << "no URL was named:\n" << text;
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  for (const std::string name :
       {"x-amz-signature=", "x-amz-credential=", "x-amz-security-token="}) {
    for (size_t at = lower.find(name); at != std::string::npos; at = lower.find(name, at + 1)) {
      EXPECT_EQ(lower.compare(at + name.size(), 8, "redacted"), 0)
          << name << " carries a value in the log:\n"
          << text;
    }
  }
}

// A message still being produced goes up through a multipart grant as it
// comes: parts are on the store before it is finished. One abandoned, or
// whose final tensors are not the bytes streamed, goes whole through the
// same grant; an encoder's failure fails the send.
TEST(GrpcS3, AStreamedSendGoesUpAsItIsProducedOrWholeWhenItWentAnotherWay) {
  GrantPair pair;
  ASSERT_NO_FATAL_FAILURE(pair.Start());
  ASSERT_NO_FATAL_FAILURE(pair.Grant());
  const uint64_t size = 12 << 20, piece = 1 << 20;
  auto send = [&](std::shared_ptr<EncodeStream> stream) {
    auto done = std::make_shared<std::promise<Status>>();
    std::future<Status> f = done->get_future();
    pair.client->stream_sink()->SendStreamAsync(0, std::move(stream),
                                                [done](const Status& s) { done->set_value(s); });
    return f;
  };
  {
    ASSERT_TRUE(pair.client->stream_sink()->StreamsSends(0));
    Message m = PatternMessage(size, 3, 0);
    const Buffer data = m.tensors.at("w").data;
    auto stream = std::make_shared<EncodeStream>(size);
    stream->SetInputBytes(size);
    auto sent = send(stream);
    for (uint64_t off = 0; off < size / 2; off += piece) {
      stream->Append(data.SliceUnchecked(off, piece), piece);
    }
    for (int i = 0; i < 6000 && pair.parts.load() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_GE(pair.parts.load(), 1) << "no part went up before the message was finished";
    for (uint64_t off = size / 2; off < size; off += piece) {
      stream->Append(data.SliceUnchecked(off, piece), piece);
    }
    stream->Finish(m);
    ASSERT_TRUE(sent.get().ok());
    auto got = pair.server->Receive(60s);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(PatternIntact(*got));
  }
  for (const std::string way : {"abandoned", "other bytes"}) {
    SCOPED_TRACE(way);
    ASSERT_NO_FATAL_FAILURE(pair.Grant());
    ASSERT_TRUE(pair.client->stream_sink()->StreamsSends(0));
    Message m = PatternMessage(size, 4, 0);
    const Buffer data = m.tensors.at("w").data;
    auto stream = std::make_shared<EncodeStream>(size);
    auto sent = send(stream);
    const int parts_before = pair.parts.load();
    if (way == "abandoned") {
      stream->Append(data.SliceUnchecked(0, 4 << 20), 4 << 20);
      stream->Abandon();
    } else {  // the same bytes, but a copy: not the message's own Buffers
      stream->Append(Buffer::CopyFrom(data.data(), data.size()), size);
    }
    stream->Finish(m);
    ASSERT_TRUE(sent.get().ok());
    auto got = pair.server->Receive(60s);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(PatternIntact(*got));
    // Whole through the grant, not inline: 12 MiB in its 32 parts.
    EXPECT_GE(pair.parts.load() - parts_before, 32);
  }
  {
    ASSERT_NO_FATAL_FAILURE(pair.Grant());
    auto stream = std::make_shared<EncodeStream>(size);
    auto sent = send(stream);
    stream->Finish(Internal("the encoder failed"));
    Status s = sent.get();
    EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  }
}

// Weights as a trained layer has them (the exponent bytes compress).
Message WeightsMessage(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, 0.05f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  Message m;
  m.type = "update";
  m.tensors.emplace("w", *Tensor::Make(DType::kF32, {static_cast<int64_t>(n)},
                                       Buffer::CopyFrom(v.data(), v.size() * 4)));
  m.tensors.emplace("b", *Tensor::Make(DType::kF32, {4}, Buffer::CopyFrom(v.data(), 16)));
  return m;
}

// The compressing decorator streams a compressed message of a party
// without credentials into its grant (unless compression.stream=0); it
// arrives bit for bit either way.
TEST(GrpcS3, ACompressedMessageOfAPartyWithoutCredentialsIsStreamedIntoItsGrant) {
  for (const std::string stream : {"1", "0"}) {
    SCOPED_TRACE("compression.stream=" + stream);
    GrantPair pair;
    ASSERT_NO_FATAL_FAILURE(pair.Start({{"compression", "lossless"},
                                        {"compression.when", "always"},
                                        {"compression.stream", stream}}));
    ASSERT_NO_FATAL_FAILURE(pair.Grant());
    const Message m = WeightsMessage(3 << 20, 5);
    ASSERT_TRUE(pair.client->Send(0, m, 60s).ok());
    auto got = pair.server->Receive(60s);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (const char* name : {"w", "b"}) {
      ASSERT_TRUE(got->tensors.count(name)) << name;
      EXPECT_EQ(got->tensors.at(name).dtype, DType::kF32);
      EXPECT_EQ(got->tensors.at(name).data.view(), m.tensors.at(name).data.view()) << name;
    }
    auto summary = CompressionSummaryOf(*pair.client);
    ASSERT_TRUE(summary.has_value());
    EXPECT_EQ(summary->messages_compressed, 1u);
    EXPECT_EQ(summary->messages_streamed, stream == "1" ? 1u : 0u);
    EXPECT_GE(pair.parts.load(), 2);
  }
}

// The embedded object server accepts the parts its grants announce:
// kMinPartBytes, far below S3's 5 MiB.
TEST(GrpcS3Embedded, AcceptsMultipartPartsOfItsAnnouncedMinimum) {
  std::string address = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  auto server = PairParty("grpc+s3", address, 0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto connector = HybridConnectorOf(**server);
  ASSERT_TRUE(connector && connector->presigned_multipart());
  auto key = connector->NewKey();
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto grant = connector->presigned_multipart()->PresignMultipartPut(*key, 32, 600s);
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  Buffer data = testing::PatternTensor(8 << 20, 3).data;
  UrlUploadArgs up;
  up.part_urls = grant->part_urls;
  up.complete_url = grant->complete_url;
  up.body.Append(data);
  up.connections = 32;
  up.min_part_bytes = EmbeddedS3::kMinPartBytes;
  auto n = HttpPutUrlParts(up);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 32u);  // 8 MiB in parts of 256 KiB
  key->size = data.size();
  auto got = connector->Get(*key);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->view(), data.view());
}

// A party that has only received from a peer still has a figure for the
// link to it: its own fetch of the peer's stored object (the compression
// decorator decides a client's first update by it). On loopback the
// server's first big message is preceded by a store probe the client
// fetches.
TEST(AutoS3, AReceiverKnowsTheLinkFromItsOwnFetchBeforeItSends) {
  std::string address = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  auto party = [&](int rank) { return PairParty("auto+s3", address, rank); };
  auto server = party(0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = party(1);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::thread start([&] { ASSERT_TRUE((*server)->Start().ok()); });
  ASSERT_TRUE((*client)->Start().ok());
  start.join();
  EXPECT_EQ((*client)->link_observer()->MeasuredGoodputBps(0), 0);
  ASSERT_TRUE((*server)->Send(1, PatternMessage(12 << 20, 1, 0), 60s).ok());
  auto got = (*client)->Receive(60s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(PatternIntact(*got));
  EXPECT_GT((*client)->link_observer()->MeasuredGoodputBps(0), 0);
  (*client)->Stop();
  (*server)->Stop();
}

// LearnLink waits before the first big message for the receiver's echoes
// (a round trip), so that a decorator (compression) reads it; before
// Start it returns at once.
TEST(AutoS3, LearnLinkMeasuresTheLinkBeforeTheFirstBigMessage) {
  std::string address = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  auto party = [&](int rank) { return PairParty("auto+s3", address, rank); };
  auto server = party(0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = party(1);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_LT((*server)->link_observer()->MeasuredRttS(1), 0) << "nothing measured before the start";
  (*server)->link_observer()->LearnLink({1}, 12 << 20);  // not started: nothing to wait for
  std::thread start([&] { ASSERT_TRUE((*server)->Start().ok()); });
  ASSERT_TRUE((*client)->Start().ok());
  start.join();
  (*server)->link_observer()->LearnLink({1}, 12 << 20);
  const double rtt = (*server)->link_observer()->MeasuredRttS(1);
  EXPECT_GE(rtt, 0) << "LearnLink waited for the echoes";
  ASSERT_TRUE((*server)->Send(1, PatternMessage(12 << 20, 1, 0), 60s).ok());
  auto got = (*client)->Receive(60s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(PatternIntact(*got));
  (*client)->Stop();
  (*server)->Stop();
}

// store.tls_cert/tls_key put the embedded object server on https and
// store.ca_file is what the parties verify it with: with the right CA the
// model goes by the store both ways; a client that trusts another CA cannot
// fetch it (so the store leg is TLS, checked), and the receive fails
// rather than delivering anything.
TEST(GrpcS3Embedded, HttpsStoreVerifiedByTheCaFileOfEachParty) {
  const std::string dir = testing::HybridTlsDir() + "-store";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(
      GenerateSelfSignedCertificate(dir + "/cert.pem", dir + "/key.pem", {"127.0.0.1"}).ok());
  ASSERT_TRUE(
      GenerateSelfSignedCertificate(dir + "/other.pem", dir + "/other-key.pem", {"127.0.0.1"})
          .ok());
  for (const std::string client_ca : {"cert.pem", "other.pem"}) {
    SCOPED_TRACE("client trusts " + client_ca);
    std::string address = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
    auto party = [&](int rank, const std::string& ca) {
      return PairParty("grpc+s3", address, rank,
                       {{"store.tls_cert", dir + "/cert.pem"},
                        {"store.tls_key", dir + "/key.pem"},
                        {"store.ca_file", dir + "/" + ca}});
    };
    auto server = party(0, "cert.pem");
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    auto client = party(1, client_ca);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    std::thread start([&] { ASSERT_TRUE((*server)->Start().ok()); });
    ASSERT_TRUE((*client)->Start().ok());
    start.join();
    Message model = PatternMessage(12 << 20, 1, 0);  // above the 10 MiB threshold
    ASSERT_TRUE((*server)->Send(1, model, 60s).ok());
    auto got = (*client)->Receive(client_ca == "cert.pem" ? 60s : 15s);
    if (client_ca == "cert.pem") {
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(PatternIntact(*got));
      Message update = PatternMessage((12 << 20) + 7, 2, 0);  // up through a grant
      ASSERT_TRUE((*client)->Send(0, update, 60s).ok());
      auto up = (*server)->Receive(60s);
      ASSERT_TRUE(up.ok()) << up.status().ToString();
      EXPECT_TRUE(PatternIntact(*up));
    } else {
      EXPECT_FALSE(got.ok());
    }
    (*client)->Stop();
    (*server)->Stop();
  }
  // An external store's TLS is its own: the embedded server's pair is refused there.
  auto refused = PairParty("grpc+s3", "127.0.0.1:1", 0,
                           {{"store.endpoint", "https://127.0.0.1:1"},
                            {"store.bucket", "b"},
                            {"store.tls_cert", dir + "/cert.pem"},
                            {"store.tls_key", dir + "/key.pem"}});
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
  std::filesystem::remove_all(dir);
}

TEST(GrpcSevenClients, ThreeRoundsBothWaysOneStream) { ExchangeOverGrpc({}); }

TEST(GrpcSevenClients, ThreeRoundsBothWaysFourStreams) { ExchangeOverGrpc({{"streams", "4"}}); }

}  // namespace

// The embedded server's process is SIGKILLed: its supervisor starts another
// on the same directory, port and credentials. A request sent while it is
// down is retried with backoff and answered by the new one; every object
// stored before the kill is there, byte for byte. A multipart upload in
// progress lived in the dead server's memory and is gone (documented in
// docs/reliability.md; the hybrid layer then sends inline).
TEST(GrpcS3Embedded, AKilledServerIsRestartedOnTheSameDirectoryAndKeepsItsObjects) {
  auto s3 = EmbeddedS3::Start("127.0.0.1", 0, "127.0.0.1");
  ASSERT_TRUE(s3.ok()) << s3.status().ToString();
  S3ClientOptions co;
  co.endpoint = (*s3)->endpoint();
  co.addressing = S3Addressing::kPath;
  co.credentials = StaticCredentials({(*s3)->access_key(), (*s3)->secret_key()});
  co.max_retries = 8;  // backoff from 100 ms: ~25 s in all
  auto client = S3Client::Create(co);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const std::string bucket = EmbeddedS3::kBucket;
  std::map<std::string, Message> stored;
  for (uint64_t size : {uint64_t{3} << 20, uint64_t{100}, uint64_t{0}}) {
    std::string key = "object-" + std::to_string(size);
    Tensor t = testing::PatternTensor(size, size + 1);
    PutObjectArgs put{bucket, key, {}};
    put.body.Append(t.data);
    ASSERT_TRUE((*client)->PutObject(put).ok());
    stored[key].tensors["w"] = t;
  }
  auto upload = (*client)->CreateMultipartUpload({bucket, "in-progress"});
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();

  auto servers = [&] {
    std::vector<pid_t> out;
    std::ifstream in("/proc/" + std::to_string((*s3)->supervisor_pid()) + "/task/" +
                     std::to_string((*s3)->supervisor_pid()) + "/children");
    for (pid_t p; in >> p;) out.push_back(p);
    return out;
  };
  std::vector<pid_t> first = servers();
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(::kill(first[0], SIGKILL), 0);

  // Sent at once: it meets the dead server (or the new one) and retries.
  for (const auto& [key, m] : stored) {
    auto got = (*client)->GetObject({bucket, key});
    ASSERT_TRUE(got.ok()) << key << ": " << got.status().ToString();
    const Buffer& want = m.tensors.at("w").data;
    ASSERT_EQ(got->data.size(), want.size()) << key;
    EXPECT_TRUE(want.empty() || std::memcmp(got->data.data(), want.data(), want.size()) == 0)
        << key;
  }
  std::vector<pid_t> second = servers();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_NE(second[0], first[0]);
  auto listed = (*client)->ListObjects({.bucket = bucket});
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->objects.size(), stored.size());
  auto uploads = (*client)->ListMultipartUploads({.bucket = bucket});
  ASSERT_TRUE(uploads.ok()) << uploads.status().ToString();
  EXPECT_TRUE(uploads->empty()) << "a multipart upload survived the restart";

  // Both processes go with the transport, and the directory with them.
  const pid_t supervisor = (*s3)->supervisor_pid();
  const std::string dir = (*s3)->directory();
  s3->reset();
  EXPECT_NE(::kill(supervisor, 0), 0);
  EXPECT_NE(::kill(second[0], 0), 0);
  EXPECT_FALSE(std::filesystem::exists(dir));
}

int RunGrpcS3PartyIfRequested() {
  const char* spec = std::getenv(kPartyEnv);
  if (!spec) return -1;
  std::vector<std::string> f;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, '|')) f.push_back(item);
  std::map<std::string, std::string> store;
  if (f.size() < 3) return 9;
  std::stringstream opts(f.size() > 3 ? f[3] : "");
  while (std::getline(opts, item, ',')) {
    auto eq = item.find('=');
    if (eq != std::string::npos) store[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return RunClient(f[2], std::stoi(f[0]), f[1], store);
}

}  // namespace xsilo
