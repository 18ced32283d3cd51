#include "xsilo/fl/config.h"

#include <gtest/gtest.h>

namespace xsilo::fl {
namespace {

constexpr const char* kJob = R"(# a client of a geo-distributed job
[transport]
name = "grpc"            # registered transport
address = 'fl.example.org:50051'
rank = 3
world_size = 8
connect_timeout_s = 30.5

[backend]
tls_ca = "/etc/xsilo/ca.pem"
tls_cert = "/etc/xsilo/client.pem"
tls_key = "/etc/xsilo/client.key"
streams = 4

[fl]
tier = "medium"
rounds = 1_000
local_steps = 20
quorum = "80%"
round_deadline_s = 120
clients_per_round = 5

[mlp]
learning_rate = 5e-2
batch_size = 64

[data]
alpha = 0.5
beta = 0
)";

TEST(Config, ParsesTheTomlSubset) {
  auto c = Config::Parse(kJob);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(*c->String("transport.name", ""), "grpc");
  EXPECT_EQ(*c->String("transport.address", ""), "fl.example.org:50051");
  EXPECT_EQ(*c->Int("fl.rounds", 0), 1000);
  EXPECT_DOUBLE_EQ(*c->Double("mlp.learning_rate", 0), 0.05);
  EXPECT_DOUBLE_EQ(*c->Double("data.beta", 1), 0.0);  // an integer where a float is expected
  EXPECT_EQ(*c->Int("fl.absent", 7), 7);
  EXPECT_EQ(c->String("fl.rounds", "").status().code(), StatusCode::kInvalidArgument);
  auto b = Config::Parse("[a.b]\nx = true # c\ny = \"q\\\"\\n\"\n");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(*b->Bool("a.b.x", false));
  EXPECT_EQ(*b->String("a.b.y", ""), "q\"\n");
}

TEST(Config, RejectsWhatItDoesNotUnderstandNamingTheLine) {
  for (const char* bad : {"x = [1, 2]", "x = {a = 1}", "[[t]]", "x = 'open", "x = bare", "x = 1 2",
                          "= 3", "[t\nx=1", "x = 1\nx = 2", "x = \"\"\"a\"\"\""}) {
    auto c = Config::Parse(bad);
    EXPECT_FALSE(c.ok()) << bad;
    if (!c.ok()) {
      EXPECT_NE(c.status().message().find("line"), std::string::npos) << bad;
    }
  }
}

TEST(Config, FillsAJobIncludingPassThroughBackendOptions) {
  auto job = ReadJobConfig(*Config::Parse(kJob));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->transport, "grpc");
  EXPECT_EQ(job->transport_options.rank, 3);
  EXPECT_EQ(job->transport_options.world_size, 8);
  EXPECT_EQ(job->transport_options.connect_timeout.count(), 30500);
  EXPECT_EQ(job->transport_options.backend.at("tls_ca"), "/etc/xsilo/ca.pem");
  EXPECT_EQ(job->transport_options.backend.at("tls_key"), "/etc/xsilo/client.key");
  EXPECT_EQ(job->transport_options.backend.at("streams"), "4");
  EXPECT_EQ(job->tier, "medium");
  EXPECT_EQ(job->server.rounds, 1000u);
  EXPECT_EQ(job->server.local_work.steps, 20u);
  EXPECT_DOUBLE_EQ(job->server.quorum_fraction, 0.8);
  EXPECT_EQ(job->server.quorum_count, 0u);
  EXPECT_EQ(job->server.round_deadline.count(), 120000);
  EXPECT_EQ(job->server.clients_per_round, 5u);
  EXPECT_EQ(job->mlp.batch_size, 64u);
  EXPECT_DOUBLE_EQ(job->data.alpha, 0.5);
}

TEST(Config, UnknownKeysAndBadValuesAreErrors) {
  EXPECT_EQ(ReadJobConfig(*Config::Parse("[fl]\nround = 3\n")).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadJobConfig(*Config::Parse("[fl]\nrounds = -1\n")).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ReadJobConfig(*Config::Parse("[transport]\nrank = 9\nworld_size = 8\n")).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadJobConfig(*Config::Parse("[fl]\nquorum = 1.5\n")).status().code(),
            StatusCode::kInvalidArgument);
  auto epochs = ReadJobConfig(*Config::Parse("[fl]\nlocal_epochs = 2\n"));
  ASSERT_TRUE(epochs.ok());
  EXPECT_EQ(epochs->server.local_work.epochs, 2u);
  EXPECT_EQ(epochs->server.local_work.steps, 0u);
}

// Found by fuzz/fuzz_toml_config: a float passed through to the transport
// was printed with 6 digits (1048576.5 reached it as "1.04858e+06").
TEST(Config, PassThroughFloatsKeepEveryDigit) {
  auto job = ReadJobConfig(*Config::Parse("[backend]\nx = 1048576.5\ny = 0.1\nz = 5e-324\n"));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->transport_options.backend.at("x"), "1048576.5");
  EXPECT_EQ(job->transport_options.backend.at("y"), "0.1");
  EXPECT_EQ(job->transport_options.backend.at("z"), "5e-324");
}

// Seen reading the loader, then checked by fuzz/fuzz_toml_config's
// invariants on these inputs: timeouts were converted without a range
// check (1e300 s overflowed to a negative Duration, -1 s and 0 s were
// taken), and counts were narrowed to 32 bits (4294967297 clients per
// round became 1).
TEST(Config, TimeoutsAndCountsOutOfRangeAreErrors) {
  for (const char* bad :
       {"[transport]\nconnect_timeout_s = 1e300\n", "[transport]\nconnect_timeout_s = -1\n",
        "[transport]\nconnect_timeout_s = 0\n", "[transport]\nconnect_timeout_s = nan\n",
        "[fl]\nround_deadline_s = inf\n", "[fl]\nsend_timeout_s = 1e10\n",
        "[fl]\nclients_per_round = 4294967297\n", "[fl]\naggregation_threads = 4294967296\n",
        "[fl]\nmax_failed_rounds = 4294967297\n", "[fl]\nquorum = 4294967297\n"}) {
    auto job = ReadJobConfig(*Config::Parse(bad));
    EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  auto edge = ReadJobConfig(*Config::Parse(
      "[transport]\nconnect_timeout_s = 1e9\n[fl]\nclients_per_round = 4294967295\n"));
  ASSERT_TRUE(edge.ok()) << edge.status().ToString();
  EXPECT_EQ(edge->transport_options.connect_timeout.count(), int64_t{1000000000000});
  EXPECT_EQ(edge->server.clients_per_round, 4294967295u);
}

TEST(Quorum, CountOrFraction) {
  ServerOptions o;
  ASSERT_TRUE(ParseQuorum("5", o).ok());
  EXPECT_EQ(o.quorum_count, 5u);
  EXPECT_EQ(o.quorum_fraction, 0.0);
  ASSERT_TRUE(ParseQuorum("0.75", o).ok());
  EXPECT_EQ(o.quorum_count, 0u);
  EXPECT_DOUBLE_EQ(o.quorum_fraction, 0.75);
  ASSERT_TRUE(ParseQuorum("1.0", o).ok());
  EXPECT_DOUBLE_EQ(o.quorum_fraction, 1.0);
  ASSERT_TRUE(ParseQuorum("50%", o).ok());
  EXPECT_DOUBLE_EQ(o.quorum_fraction, 0.5);
  for (const char* bad : {"0", "-2", "0.0", "1.5", "abc", "", "120%", "4294967296"}) {
    EXPECT_FALSE(ParseQuorum(bad, o).ok()) << bad;
  }
}

}  // namespace
}  // namespace xsilo::fl
