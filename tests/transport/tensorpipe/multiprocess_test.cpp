// tensorpipe across processes, FedAvg-shaped: 1 server and 7 client
// processes exchange Medium-tier models (float32) both ways for 3 rounds,
// over the basic channel and over mpt lanes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <set>
#include <sstream>

#include "transport/test_util.h"
#include "xsilo/core/tiers.h"
#include "xsilo/transport/registry.h"

namespace xsilo {
namespace {

using namespace std::chrono_literals;
using testing::PatternIntact;
using testing::PatternMessage;

constexpr const char* kPartyEnv = "XSILO_TENSORPIPE_PARTY";
constexpr int kClients = 7;
constexpr int kRounds = 3;
constexpr uint64_t kModelBytes = 20'610'072;  // the Medium tier, float32
static_assert(kModelBytes == 4 * kModelTiers[1].parameters);

TransportOptions PartyOptions(int rank, const std::string& address, const std::string& lanes) {
  TransportOptions o;
  o.rank = rank;
  o.world_size = kClients + 1;
  o.address = address;
  o.connect_timeout = 60s;
  if (lanes != "1") o.backend["lanes"] = lanes;
  return o;
}

// Client process: receive the model, return an update of the same size.
int RunClient(int rank, const std::string& address, const std::string& lanes) {
  auto t = TransportRegistry::Global().Create("tensorpipe", PartyOptions(rank, address, lanes));
  if (!t.ok() || !(*t)->Start().ok()) return 2;
  for (int r = 0; r < kRounds; ++r) {
    auto model = (*t)->Receive(120s);
    if (!model.ok() || !PatternIntact(*model) || model->round != r || model->sender != 0) return 3;
    Message update = PatternMessage(kModelBytes, 1000 * rank + r, r);
    update.type = "update";
    if (!(*t)->Send(0, std::move(update), 120s).ok()) return 4;
  }
  // Leave only once the server said so: stopping closes the connection.
  auto bye = (*t)->Receive(120s);
  (*t)->Stop();
  return bye.ok() && bye->type == "bye" ? 0 : 5;
}

pid_t SpawnClient(int rank, const std::string& address, const std::string& lanes) {
  return testing::SpawnSelfWithEnv(std::string(kPartyEnv) + "=" + std::to_string(rank) + "|" +
                                   address + "|" + lanes);
}

void RunServer(const std::string& lanes) {
  std::string address = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  auto server = TransportRegistry::Global().Create("tensorpipe", PartyOptions(0, address, lanes));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<pid_t> clients;
  for (int c = 1; c <= kClients; ++c) {
    clients.push_back(SpawnClient(c, address, lanes));
    ASSERT_GT(clients.back(), 0);
  }
  Status started = (*server)->Start();
  ASSERT_TRUE(started.ok()) << started.ToString();

  std::vector<int32_t> peers;
  for (int c = 1; c <= kClients; ++c) peers.push_back(c);
  for (int r = 0; r < kRounds; ++r) {
    Message model = PatternMessage(kModelBytes, r, r);
    model.type = "model";
    Status sent = (*server)->Broadcast(peers, model, 120s);
    ASSERT_TRUE(sent.ok()) << "round " << r << ": " << sent.ToString();
    std::set<int32_t> from;
    for (int n = 0; n < kClients; ++n) {
      auto u = (*server)->Receive(120s);
      ASSERT_TRUE(u.ok()) << u.status().ToString();
      EXPECT_TRUE(PatternIntact(*u));
      EXPECT_EQ(u->round, r);
      EXPECT_EQ(u->type, "update");
      EXPECT_EQ(u->tensors.at("w").nbytes(), kModelBytes);
      from.insert(u->sender);
    }
    EXPECT_EQ(from.size(), size_t{kClients});
  }
  Message bye;
  bye.type = "bye";
  Status said = (*server)->Broadcast(peers, bye, 60s);
  EXPECT_TRUE(said.ok()) << said.ToString();
  for (pid_t pid : clients) {
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "client exit status " << st;
  }
  (*server)->Stop();
}

TEST(TensorPipeMultiProcess, SevenClientsThreeRoundsBothWaysBasic) { RunServer("1"); }
TEST(TensorPipeMultiProcess, SevenClientsThreeRoundsBothWaysMpt4) { RunServer("4"); }

// Runs the client role if this process was spawned as one; -1 otherwise.
int RunPartyIfRequested() {
  const char* spec = std::getenv(kPartyEnv);
  if (spec == nullptr) return -1;
  std::vector<std::string> f;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, '|')) f.push_back(item);
  if (f.size() != 3) return 7;
  return RunClient(std::stoi(f[0]), f[1], f[2]);
}

}  // namespace
}  // namespace xsilo

int main(int argc, char** argv) {
  if (int code = xsilo::RunPartyIfRequested(); code >= 0) return code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
