// Scenario 1 of issue 17, across processes: a client process is SIGKILLed
// in the middle of a round while it uploads its Medium-tier update (20.6 MB)
// over grpc+s3 through an upload grant. The round completes at quorum
// without it; the upload's parts are aborted (and nothing is left in the
// bucket) once its grant lapses; the client is started again and takes
// part in the next rounds.
//
// The server party is this process (FedAvgServer over grpc+s3 with the
// embedded object server); the clients are `xsilo fl client` processes.
// The object server is reached through a TCP proxy (store.embedded_advertise)
// that stops forwarding once 12 MiB of uploads went through: the victim is
// then stalled mid-upload, deterministically, when it is killed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "store/builtin.h"
#include "transport/tcp_proxy.h"
#include "transport/test_util.h"
#include "xsilo/fl/fedavg.h"
#include "xsilo/fl/mlp.h"
#include "xsilo/hybrid/hybrid.h"
#include "xsilo/s3/client.h"
#include "xsilo/s3/credentials.h"
#include "xsilo/transport/registry.h"

extern char** environ;

namespace xsilo::fl {
namespace {

using namespace std::chrono_literals;

pid_t SpawnClient(const std::string& config, const std::string& log) {
  std::vector<std::string> args = {XSILO_CLI, "fl", "client", "--config", config, "--quiet"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(FedAvgFaults, AClientKilledMidUploadIsLeftOutItsPartsAbortedAndItRejoins) {
  constexpr int kClients = 3, kVictim = 3;
  const int s3_port = testing::FreeTcpPort();
  testing::TcpProxy proxy(s3_port);
  const std::string address = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  const auto dir =
      std::filesystem::temp_directory_path() / ("xsilo-client-crash-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);

  // Grants lapse after presign_s: the victim's is then aborted.
  TransportOptions o;
  o.rank = 0;
  o.world_size = kClients + 1;
  o.address = address;
  o.connect_timeout = 60s;
  o.backend = {{"store.embedded_port", std::to_string(s3_port)},
               {"store.embedded_advertise", "127.0.0.1:" + std::to_string(proxy.port())},
               {"presign_s", "8"},
               {"threshold", "never"}};
  auto server_t = TransportRegistry::Global().Create("grpc+s3", o);
  ASSERT_TRUE(server_t.ok()) << server_t.status().ToString();

  // Clients 1 and 2 send inline; the victim uploads its update through its
  // grant, one part at a time (connections=1), so parts are done when it
  // stalls.
  std::map<int, std::string> configs;
  for (int r = 1; r <= kClients; ++r) {
    configs[r] = (dir / ("client-" + std::to_string(r) + ".toml")).string();
    std::ofstream f(configs[r]);
    f << "[transport]\nname = \"grpc+s3\"\naddress = \"" << address
      << "\"\nworld_size = " << kClients + 1 << "\nrank = " << r
      << "\nconnect_timeout_s = 120\n[backend]\n"
      << (r == kVictim ? "connections = \"1\"\n" : "threshold = \"never\"\n")
      << "[fl]\ntier = \"medium\"\nlocal_steps = 1\nidle_timeout_s = 300\nsend_timeout_s = 120\n";
  }
  std::map<int, pid_t> pids;
  for (int r = 1; r <= kClients; ++r) {
    pids[r] = SpawnClient(configs[r], (dir / ("client-" + std::to_string(r) + ".log")).string());
    ASSERT_GT(pids[r], 0);
  }
  proxy.HoldAfter(12 << 20);
  ASSERT_TRUE((*server_t)->Start().ok());

  auto shape = MlpShapeForTier("medium");
  ASSERT_TRUE(shape.ok());
  auto model = MlpInitialParameters(*shape, 1);
  ASSERT_TRUE(model.ok());
  ServerOptions so;
  so.rounds = 3;
  so.quorum_count = 2;
  so.local_work = {.epochs = 0, .steps = 1};
  // Round 0 waits this out for the killed client; honest updates take
  // about a second, and the margin covers a loaded 2-core machine.
  so.round_deadline = 30s;
  so.finish_deadline = 30s;
  auto job = std::async(std::launch::async, [&] {
    FedAvgServer server(**server_t, so);
    return server.Run(*model);
  });

  // The victim stalls mid-upload: some parts are stored, the rest never.
  ASSERT_TRUE(proxy.WaitHeld(120s)) << "the victim's upload never started";
  auto connector = HybridConnectorOf(**server_t);
  ASSERT_NE(connector, nullptr);
  auto cfg = connector->config().options;
  auto secret = S3ConnectorSecret(cfg);  // config() carries no secret
  ASSERT_TRUE(secret.ok()) << secret.status().ToString();
  S3ClientOptions co;
  co.endpoint = "http://127.0.0.1:" + std::to_string(s3_port);  // past the held proxy
  co.addressing = S3Addressing::kPath;
  co.credentials = StaticCredentials({cfg["access_key"], *secret});
  auto s3 = S3Client::Create(co);
  ASSERT_TRUE(s3.ok()) << s3.status().ToString();
  const std::string bucket = cfg["bucket"];
  auto uploads = (*s3)->ListMultipartUploads({.bucket = bucket});
  ASSERT_TRUE(uploads.ok()) << uploads.status().ToString();
  size_t parts_stored = 0;
  for (const auto& u : *uploads) {
    auto parts = (*s3)->ListParts({bucket, u.key}, u.upload_id);
    ASSERT_TRUE(parts.ok()) << parts.status().ToString();
    parts_stored += parts->size();
  }
  EXPECT_GE(parts_stored, 1u) << "no part of the victim's upload was stored before the kill";

  ASSERT_EQ(::kill(pids[kVictim], SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pids[kVictim], &status, 0), pids[kVictim]);
  EXPECT_TRUE(WIFSIGNALED(status));
  proxy.Release();
  pids[kVictim] = SpawnClient(configs[kVictim], (dir / "client-3-restarted.log").string());
  ASSERT_GT(pids[kVictim], 0);

  auto report = job.get();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->rounds.size(), 3u);
  EXPECT_TRUE(report->rounds[0].completed);
  EXPECT_EQ(report->rounds[0].contributors, (std::vector<int32_t>{1, 2}));
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_TRUE(report->rounds[i].completed);
    EXPECT_EQ(report->rounds[i].contributors, (std::vector<int32_t>{1, 2, 3}))
        << "round " << i << "; restarted client's log:\n"
        << Slurp((dir / "client-3-restarted.log").string());
  }
  for (int r = 1; r <= kClients; ++r) {
    ASSERT_EQ(::waitpid(pids[r], &status, 0), pids[r]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "client " << r << ":\n"
        << Slurp((dir / ("client-" + std::to_string(r) + ".log")).string());
  }

  // Every grant lapses after presign_s and its upload is aborted: the
  // victim's parts go, and nothing stays in the bucket.
  bool clean = false;
  for (int i = 0; i < 600 && !clean; ++i) {
    auto left = (*s3)->ListMultipartUploads({.bucket = bucket});
    auto objects = (*s3)->ListObjects({.bucket = bucket});
    clean = left.ok() && left->empty() && objects.ok() && objects->objects.empty();
    if (!clean) std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(clean) << "uploads or objects were left in the bucket";
  (*server_t)->Stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace xsilo::fl
