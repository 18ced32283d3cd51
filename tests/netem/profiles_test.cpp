#include <gtest/gtest.h>

#include <cmath>

#include "xsilo/netem/netem.h"

namespace xsilo::netem {
namespace {

TEST(Profiles, BuiltInEnvironments) {
  auto envs = Environments();
  ASSERT_TRUE(envs.ok()) << envs.status().ToString();
  EXPECT_EQ(*envs,
            (std::vector<std::string>{"lan", "geo-proximal", "ca-va", "ca-hk", "geo-distributed"}));
}

TEST(Profiles, ProfileLinkTakesARegionOrAOneClientEnvironment) {
  auto region = ProfileLink("hong-kong", 0.1);
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  EXPECT_DOUBLE_EQ(region->delay_ms, 83.3);
  EXPECT_DOUBLE_EQ(region->rate_MBps, 513 * 0.1);
  EXPECT_EQ(region->jitter_ms, 0);
  EXPECT_EQ(region->loss, 0);
  auto env = ProfileLink("ca-hk", 0.1);
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_DOUBLE_EQ(env->delay_ms, region->delay_ms);
  EXPECT_DOUBLE_EQ(env->rate_MBps, region->rate_MBps);
  EXPECT_EQ(ProfileLink("geo-distributed", 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ProfileLink("lan", 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ProfileLink("mars", 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ProfileLink("hong-kong", 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(Profiles, CaHkIsTwoSitesWithScaledRates) {
  auto t = LoadTopology("ca-hk", 0.5);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->sites.size(), 2u);
  EXPECT_FALSE(t->loopback);
  EXPECT_EQ(t->sites[0].name, "server");
  EXPECT_EQ(t->sites[0].region, "north-california");
  EXPECT_EQ(t->sites[1].name, "client1");
  EXPECT_EQ(t->sites[1].region, "hong-kong");
  for (auto [from, to] : {std::pair{0, 1}, std::pair{1, 0}}) {
    EXPECT_DOUBLE_EQ(t->links[from][to].delay_ms, 83.3);
    EXPECT_DOUBLE_EQ(t->links[from][to].rate_MBps, 513 * 0.5);
  }
  const LinkTarget& target = t->sites[1].target;
  EXPECT_DOUBLE_EQ(target.rtt_ms, 166.6);
  EXPECT_DOUBLE_EQ(target.single_MBps, 16.3 * 0.5);
  EXPECT_DOUBLE_EQ(target.multi_MBps, 513 * 0.5);
  // The client's buffers hold one single-connection window (plus overhead).
  const double window = 16.3 * 0.5 * 1e6 * 0.1666;
  WindowSizing sizing = SizeForWindow(static_cast<uint64_t>(window));
  EXPECT_EQ(t->sites[1].tcp_rmem_max, sizing.tcp_buffer);
  EXPECT_EQ(t->sites[1].mtu, sizing.mtu);
  EXPECT_GE(t->sites[1].tcp_rmem_max, window);
  EXPECT_LE(t->sites[1].tcp_rmem_max, 2 * window);
  EXPECT_EQ(t->sites[1].tcp_wmem_max, t->sites[1].tcp_rmem_max);
  // The server's never limit a connection.
  EXPECT_GE(t->sites[0].tcp_rmem_max, 4 * t->sites[1].tcp_rmem_max);
}

TEST(Profiles, GeoDistributedJoinsClientsThroughTheServer) {
  auto t = LoadTopology("geo-distributed", 1);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->sites.size(), 8u);
  EXPECT_EQ(t->sites[7].name, "client7");
  EXPECT_EQ(t->sites[7].region, "bahrain");
  EXPECT_EQ(t->sites[1].region, "north-california");
  // oregon (client2) <-> hong-kong (client4)
  EXPECT_DOUBLE_EQ(t->links[2][4].delay_ms, 11.0 + 83.3);
  EXPECT_DOUBLE_EQ(t->links[2][4].rate_MBps, 513);
  EXPECT_DOUBLE_EQ(t->links[4][2].rate_MBps, 513);
}

TEST(Profiles, LanIsLoopback) {
  auto t = LoadTopology("lan", 1);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->loopback);
}

TEST(Profiles, Errors) {
  EXPECT_EQ(LoadTopology("mars", 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(LoadTopology("ca-va", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadTopology("ca-va", -1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadTopology("ca-va", 1, "/nonexistent/profiles.json").status().code(),
            StatusCode::kNotFound);
}

TEST(Profiles, WindowIsWholeSegments) {
  for (uint64_t window : {60'000ull, 271'558ull, 2'700'000ull, 40'000'000ull}) {
    WindowSizing s = SizeForWindow(window);
    SCOPED_TRACE(window);
    EXPECT_GE(s.segments, 8u);
    EXPECT_LE(s.mtu, 64000u);
    EXPECT_GE(s.mtu, 1280u);
    const double payload = s.mtu - 52.0;
    EXPECT_NEAR(s.segments * payload, static_cast<double>(window), payload / 2 + 1);
    // The buffer exceeds the window by the kernel's overhead.
    EXPECT_GT(static_cast<double>(s.tcp_buffer), 1.2 * static_cast<double>(window));
    EXPECT_LT(static_cast<double>(s.tcp_buffer), 1.5 * static_cast<double>(window));
  }
  EXPECT_EQ(SizeForWindow(2'700'000).segments, 43u);  // 2.7 MB in 63 KB segments
  EXPECT_EQ(SizeForWindow(271'558).segments, 8u);     // small windows: smaller MTU
  EXPECT_EQ(SizeForWindow(271'558).mtu, 33997u);
}

TEST(Profiles, QueueHoldsOneRoundTripAtTheRate) {
  LinkShape l{.delay_ms = 50, .rate_MBps = 10};
  EXPECT_EQ(DefaultQueueBytes(l, 1500), 1'000'000u);    // 10 MB/s x 100 ms
  EXPECT_EQ(DefaultQueueBytes(l, 64000), 16u * 64000);  // at least 16 packets
}

TEST(Profiles, SiteAddresses) {
  EXPECT_EQ(SiteAddress(0), "198.18.0.1");
  EXPECT_EQ(SiteAddress(7), "198.18.0.8");
}

}  // namespace
}  // namespace xsilo::netem
