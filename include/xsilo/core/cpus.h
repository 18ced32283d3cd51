// How many CPUs this process may use: for sizing worker pools, and for
// turning a codec's CPU time into the wall time it will take.
#pragma once

#include <string>
#include <string_view>

namespace xsilo {

// The CPUs the calling thread may run on (its affinity mask, as `taskset`
// or a container's cpuset leaves it), bounded by the CPU quota of the
// process's cgroup (ProcessCpuQuota) rounded up; at least 1.
// std::thread::hardware_concurrency counts the host's CPUs whatever the
// container or taskset allows, and a pool sized by it on a host of 64 CPUs
// in a container of one would run 64 threads on one CPU's time.
int UsableCpus();

// The threads a codec or hashing pool runs when not told (threads = 0):
// UsableCpus, at most 4.
int DefaultPoolThreads();

// The CPU time per second this process may get: the CPUs of the calling
// thread's affinity mask, or the cgroup's quota if less (1.5 for a quota of
// 150000 per 100000 us). What a measure of how busy the CPUs were divides by.
double CpuCapacity();

// The CPU quota of this process's cgroup in CPUs (quota over period), the
// least along the path from its cgroup to the root; 0 when there is none.
// Read once (from /proc/self/cgroup and /sys/fs/cgroup) and kept.
double ProcessCpuQuota();

// The same read from the given files: `proc_self_cgroup` is the text of
// /proc/self/cgroup, `cgroup_root` where the cgroup file systems are
// mounted. Version 2 (line "0::PATH") reads PATH's cpu.max under
// `cgroup_root` when that holds cgroup.controllers (version 2 alone), else
// under `cgroup_root`/unified (a host of both); version 1 (a line whose
// controllers include "cpu") reads cpu.cfs_quota_us and cpu.cfs_period_us
// under `cgroup_root`/CONTROLLERS or `cgroup_root`/cpu. Each directory from
// PATH up to the root is read, so that a container that sees its own cgroup
// as the root finds its quota too; a PATH that climbs out of the namespace
// ("/../..") reads the root only. Files missing or not understood count as
// no quota.
double CgroupCpuQuota(std::string_view proc_self_cgroup, const std::string& cgroup_root);

// One cgroup file's quota in CPUs, 0 when unlimited or not understood:
// version 2's cpu.max ("max 100000", "150000 100000"), version 1's
// cpu.cfs_quota_us and cpu.cfs_period_us ("-1" is unlimited).
double CpuMaxQuota(std::string_view cpu_max);
double CfsQuota(std::string_view quota_us, std::string_view period_us);

}  // namespace xsilo
