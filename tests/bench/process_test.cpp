// The host CPU figures bench e2e reports: reading /proc/stat and the busy
// share over a window of samples.
#include "xsilo/bench/process.h"

#include <gtest/gtest.h>

namespace xsilo::bench {
namespace {

TEST(HostCpu, ReadsProcStat) {
  HostCpuSample a, b;
  ASSERT_TRUE(ReadHostCpu(&a));
  EXPECT_GT(a.total, 0u);
  EXPECT_LE(a.busy, a.total);
  EXPECT_GT(a.unix_s, 1.7e9);
  ASSERT_TRUE(ReadHostCpu(&b));
  EXPECT_GE(b.total, a.total) << "the counters only grow";
  EXPECT_GE(b.busy, a.busy);
}

TEST(HostCpu, BusyShareBetweenTheSamplesInsideTheWindow) {
  // Four samples a second apart: 2 CPUs (200 ticks a second), busy 50,
  // 150, 190 ticks in the seconds between them.
  const std::vector<HostCpuSample> s = {
      {100.0, 1000, 5000}, {101.0, 1050, 5200}, {102.0, 1200, 5400}, {103.0, 1390, 5600}};
  // Samples 1 and 2 only: 150 of 200.
  EXPECT_DOUBLE_EQ(HostBusyBetween(s, 100.5, 102.5), 0.75);
  // All four: 390 of 600.
  EXPECT_DOUBLE_EQ(HostBusyBetween(s, 100.0, 103.0), 0.65);
  // Samples 2 and 3: 190 of 200.
  EXPECT_DOUBLE_EQ(HostBusyBetween(s, 101.5, 200), 0.95);
  // Fewer than two samples inside: not measured.
  EXPECT_LT(HostBusyBetween(s, 100.2, 100.8), 0);
  EXPECT_LT(HostBusyBetween(s, 101.0, 101.5), 0);
  EXPECT_LT(HostBusyBetween({}, 0, 1e12), 0);
  // Counters that did not move (or went back): not measured.
  EXPECT_LT(HostBusyBetween({{1.0, 10, 100}, {2.0, 10, 100}}, 0, 3), 0);
  EXPECT_LT(HostBusyBetween({{1.0, 10, 100}, {2.0, 5, 200}}, 0, 3), 0);
}

}  // namespace
}  // namespace xsilo::bench
