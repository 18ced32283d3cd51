#include "xsilo/core/cpus.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include "require.h"

namespace xsilo {
namespace {

namespace fs = std::filesystem;

TEST(Cpus, QuotaFilesParse) {
  EXPECT_EQ(CpuMaxQuota("max 100000\n"), 0);
  EXPECT_EQ(CpuMaxQuota("150000 100000\n"), 1.5);
  EXPECT_EQ(CpuMaxQuota("50000 100000"), 0.5);
  EXPECT_EQ(CpuMaxQuota(""), 0);
  EXPECT_EQ(CpuMaxQuota("150000"), 0);
  EXPECT_EQ(CpuMaxQuota("150000 0"), 0);
  EXPECT_EQ(CpuMaxQuota("15x 100000"), 0);
  EXPECT_EQ(CfsQuota("-1\n", "100000\n"), 0);
  EXPECT_EQ(CfsQuota("200000\n", "100000\n"), 2);
  EXPECT_EQ(CfsQuota("", "100000"), 0);
  EXPECT_EQ(CfsQuota("200000", "abc"), 0);
}

class FakeCgroups : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/xsilo-cgroup-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    const fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string root_;
};

TEST_F(FakeCgroups, Version2TakesTheLeastQuotaUpToTheRoot) {
  Write("cgroup.controllers", "cpuset cpu io memory pids\n");
  Write("cpu.max", "max 100000\n");
  Write("a/cpu.max", "300000 100000\n");
  Write("a/b/cpu.max", "max 100000\n");
  EXPECT_EQ(CgroupCpuQuota("0::/a/b\n", root_), 3);
  Write("a/b/cpu.max", "120000 100000\n");
  EXPECT_EQ(CgroupCpuQuota("0::/a/b\n", root_), 1.2);
  // A path with a colon in it is the whole third field.
  Write("a/b:c/cpu.max", "70000 100000\n");
  EXPECT_EQ(CgroupCpuQuota("0::/a/b:c\n", root_), 0.7);
  // No cpu.max anywhere (a cgroup without the cpu controller): no quota.
  EXPECT_EQ(CgroupCpuQuota("0::/c/d\n", root_ + "/none"), 0);
}

// A path outside the reader's cgroup namespace climbs out of the mount:
// only the root is read, not a directory beside the mount.
TEST_F(FakeCgroups, APathThatClimbsOutReadsTheRootOnly) {
  Write("root/cgroup.controllers", "cpu\n");
  Write("outside/cpu.max", "10000 100000\n");
  EXPECT_EQ(CgroupCpuQuota("0::/../outside\n", root_ + "/root"), 0);
  Write("root/cpu.max", "200000 100000\n");
  EXPECT_EQ(CgroupCpuQuota("0::/../outside\n", root_ + "/root"), 2);
}

TEST_F(FakeCgroups, Version2MountedUnderUnified) {
  Write("unified/job/cpu.max", "100000 100000\n");
  EXPECT_EQ(CgroupCpuQuota("1:cpuset:/\n0::/job\n", root_), 1);
  // On a host of version 2 alone "unified" is just a cgroup's name.
  Write("cgroup.controllers", "cpu\n");
  EXPECT_EQ(CgroupCpuQuota("0::/job\n", root_), 0);
}

// A container sees its own cgroup as the root of the mount while
// /proc/self/cgroup names the host's path: the root's file still counts.
TEST_F(FakeCgroups, AContainersQuotaAtTheMountRoot) {
  Write("cgroup.controllers", "cpu\n");
  Write("cpu.max", "250000 100000\n");
  EXPECT_EQ(CgroupCpuQuota("0::/docker/0123abcd\n", root_), 2.5);
}

TEST_F(FakeCgroups, Version1ReadsTheCpuController) {
  Write("cpu,cpuacct/job/cpu.cfs_quota_us", "50000\n");
  Write("cpu,cpuacct/job/cpu.cfs_period_us", "100000\n");
  Write("memory/job/cpu.cfs_quota_us", "10000\n");  // not the cpu controller's
  Write("memory/job/cpu.cfs_period_us", "100000\n");
  const std::string self = "5:memory:/job\n2:cpu,cpuacct:/job\n1:name=systemd:/\n";
  EXPECT_EQ(CgroupCpuQuota(self, root_), 0.5);
  // Unlimited (-1) is no quota.
  Write("cpu,cpuacct/job/cpu.cfs_quota_us", "-1\n");
  EXPECT_EQ(CgroupCpuQuota(self, root_), 0);
  // Mounted as "cpu" alone.
  Write("cpu/job/cpu.cfs_quota_us", "400000\n");
  Write("cpu/job/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(CgroupCpuQuota(self, root_), 4);
}

TEST(Cpus, UsableCpusFollowsTheAffinityMask) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  const int allowed = CPU_COUNT(&all);
  const double quota = ProcessCpuQuota();
  const int expect_all =
      quota > 0 ? std::min(allowed, static_cast<int>(std::ceil(quota - 1e-9))) : allowed;
  EXPECT_EQ(UsableCpus(), std::max(1, expect_all));
  EXPECT_LE(CpuCapacity(), allowed);
  EXPECT_GE(CpuCapacity(), quota > 0 ? std::min<double>(quota, allowed) : allowed);
  // Pinned to one CPU (on a thread of its own, which the mask belongs to).
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; ++c)
    if (CPU_ISSET(c, &all)) first = c;
  ASSERT_GE(first, 0);
  int pinned = 0;
  double capacity = 0;
  bool set = false;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    set = sched_setaffinity(0, sizeof(one), &one) == 0;
    if (set) {
      pinned = UsableCpus();
      capacity = CpuCapacity();
    }
  });
  t.join();
  XSILO_REQUIRE(set, "sched_setaffinity allowed");
  EXPECT_EQ(pinned, 1);
  EXPECT_LE(capacity, 1.0);
}

}  // namespace
}  // namespace xsilo
