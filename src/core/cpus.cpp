#include "xsilo/core/cpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace xsilo {
namespace {

// Parses a whole decimal integer (surrounding whitespace allowed).
bool ParseInt(std::string_view s, long long* out) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path);
  if (!f) return false;
  std::ostringstream s;
  s << f.rdbuf();
  *out = s.str();
  return true;
}

// The least positive quota of `file` in `dir` + each prefix of `path`,
// `read` turning a directory into a quota (0: none).
template <typename Read>
double LeastAlongPath(const std::string& dir, std::string path, Read read) {
  // The kernel writes absolute paths; one outside the reader's cgroup
  // namespace climbs out of it ("/../.."): then only the mount's root.
  if (path.empty() || path[0] != '/' || path.find("/..") != std::string::npos) path = "/";
  double least = 0;
  while (true) {
    const double q = read(dir + path);
    if (q > 0 && (least == 0 || q < least)) least = q;
    if (path.empty() || path == "/") break;
    const size_t slash = path.find_last_of('/');
    path = slash == std::string::npos ? std::string() : path.substr(0, slash);
  }
  return least;
}

double Least(double a, double b) {
  if (a <= 0) return b;
  if (b <= 0) return a;
  return std::min(a, b);
}

}  // namespace

double CpuMaxQuota(std::string_view cpu_max) {
  const size_t space = cpu_max.find_first_of(" \t");
  if (space == std::string_view::npos) return 0;
  long long quota = 0, period = 0;
  if (!ParseInt(cpu_max.substr(0, space), &quota) || !ParseInt(cpu_max.substr(space), &period))
    return 0;  // "max ..." is unlimited
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<double>(quota) / static_cast<double>(period);
}

double CfsQuota(std::string_view quota_us, std::string_view period_us) {
  long long quota = 0, period = 0;
  if (!ParseInt(quota_us, &quota) || !ParseInt(period_us, &period)) return 0;
  if (quota <= 0 || period <= 0) return 0;  // -1 is unlimited
  return static_cast<double>(quota) / static_cast<double>(period);
}

double CgroupCpuQuota(std::string_view proc_self_cgroup, const std::string& cgroup_root) {
  double least = 0;
  size_t pos = 0;
  while (pos < proc_self_cgroup.size()) {
    size_t eol = proc_self_cgroup.find('\n', pos);
    if (eol == std::string_view::npos) eol = proc_self_cgroup.size();
    const std::string_view line = proc_self_cgroup.substr(pos, eol - pos);
    pos = eol + 1;
    // "ID:CONTROLLERS:PATH"; PATH may itself hold colons.
    const size_t c1 = line.find(':');
    const size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    const std::string path(line.substr(c2 + 1));
    if (controllers.empty()) {  // version 2
      auto read = [](const std::string& d) {
        std::string s;
        return ReadFile(d + "/cpu.max", &s) ? CpuMaxQuota(s) : 0.0;
      };
      // A host of version 2 alone mounts it at the root (which then has
      // cgroup.controllers); a hybrid host of both at "unified".
      std::string unused;
      const bool at_root = ReadFile(cgroup_root + "/cgroup.controllers", &unused);
      least = Least(least, LeastAlongPath(cgroup_root + (at_root ? "" : "/unified"), path, read));
      continue;
    }
    bool cpu = false;
    for (size_t b = 0; b <= controllers.size();) {
      size_t e = controllers.find(',', b);
      if (e == std::string_view::npos) e = controllers.size();
      cpu = cpu || controllers.substr(b, e - b) == "cpu";
      b = e + 1;
    }
    if (!cpu) continue;
    auto read = [](const std::string& d) {
      std::string q, p;
      return ReadFile(d + "/cpu.cfs_quota_us", &q) && ReadFile(d + "/cpu.cfs_period_us", &p)
                 ? CfsQuota(q, p)
                 : 0.0;
    };
    std::vector<std::string> mounts{cgroup_root + "/" + std::string(controllers)};
    if (controllers != "cpu") mounts.push_back(cgroup_root + "/cpu");
    for (const auto& m : mounts) least = Least(least, LeastAlongPath(m, path, read));
  }
  return least;
}

double ProcessCpuQuota() {
  static const double quota = [] {
    std::string text;
    return ReadFile("/proc/self/cgroup", &text) ? CgroupCpuQuota(text, "/sys/fs/cgroup") : 0.0;
  }();
  return quota;
}

double CpuCapacity() {
  int cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
  const double quota = ProcessCpuQuota();
  return std::max(1e-3, quota > 0 && quota < cpus ? quota : static_cast<double>(std::max(1, cpus)));
}

int DefaultPoolThreads() { return std::min(UsableCpus(), 4); }

int UsableCpus() {
  // Compared as a double: a quota far above the CPUs could overflow an int.
  return std::max(1, static_cast<int>(std::ceil(CpuCapacity() - 1e-9)));
}

}  // namespace xsilo
