// Processes as the benchmarks see them: memory figures from /proc, the
// children of this process, this executable, free ports.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace xsilo::bench {

// A "<key>: <n> kB" line of /proc/<pid>/status in bytes ("self" for this
// process); 0 when absent. VmRSS is the resident set, VmHWM its peak.
uint64_t StatusBytes(const std::string& pid, const char* key);

// Resets the peak resident set (VmHWM) of `pid` to its current RSS. False
// when the kernel refused (no /proc/<pid>/clear_refs access).
bool ResetPeakRss(const std::string& pid = "self");

// The open descriptors of `pid` (entries of /proc/<pid>/fd); -1 when they
// cannot be read (the process is gone).
int OpenFds(const std::string& pid = "self");

// This process's descendants (children, their children, ...), from every
// thread's /proc children list: a helper such as the embedded S3 server
// runs as a grandchild, under its supervisor.
std::vector<pid_t> ChildPids();

// ResetPeakRss of every descendant.
void ResetChildrenPeakRss();

// The peak resident sets (VmHWM) of our descendants not in `skip`, summed.
uint64_t ChildrenPeakRss(const std::set<pid_t>& skip = {});

// A TCP port on 127.0.0.1 that was free a moment ago; 0 when none.
int FreeLoopbackPort();

// Starts this executable again with `assignment` ("NAME=VALUE") added to
// its environment, no arguments: how a benchmark program runs its own
// client role in child processes. -1 when it could not start.
pid_t SpawnSelfWithEnv(const std::string& assignment);

// The path of this executable ("/proc/self/exe" when unreadable).
std::string SelfExe();

// The host's CPU time at one moment: /proc/stat's first line (all CPUs),
// in clock ticks, busy being all but idle and iowait.
struct HostCpuSample {
  double unix_s = 0;  // the wall clock, seconds since the epoch
  uint64_t busy = 0, total = 0;
};

// Reads it now; false where /proc/stat cannot be read.
bool ReadHostCpu(HostCpuSample* s);

// The share of the host's CPU time busy between the first and the last of
// `samples` (in time order) that lie in [from, to]; < 0 with fewer than two
// there, or no time between them.
double HostBusyBetween(const std::vector<HostCpuSample>& samples, double from, double to);

}  // namespace xsilo::bench
