// Up / Down / state of a netem instance.
//
// Up creates /run/netns/<prefix>.<site> with `ip netns add`, records the
// state file, then forks the router. The router child detaches (setsid),
// opens one TUN device inside each site's namespace (setns, open
// /dev/net/tun, TUNSETIFF "xs0", address and MTU by ioctl, TCP buffer
// sysctls), returns to the root namespace, reports "OK" on a pipe and
// forwards until SIGTERM. On SIGUSR1 it re-reads the links from the state
// file (SetLinks). Its TUN devices vanish with it. Down kills the
// router (checking its name, so a recycled pid is never hit), every process
// left in the sites, deletes the namespaces and the state directory.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "instance_internal.h"
#include "router.h"
#include "sys.h"
#include "xsilo/netem/netem.h"

namespace xsilo::netem {

using namespace internal;

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// The namespaces of this prefix that exist now.
std::vector<std::string> ExistingNamespaces(const std::string& prefix) {
  std::vector<std::string> names;
  DIR* d = opendir(internal::kNetnsDir);
  if (!d) return names;
  const std::string head = prefix + ".";
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(head, 0) == 0 && name.find('.', head.size()) == std::string::npos) {
      names.push_back(name);
    }
  }
  closedir(d);
  return names;
}

}  // namespace

Status CheckPrerequisites() {
  if (geteuid() != 0) {
    return PermissionDenied(
        "netem needs root (network namespaces, TUN devices and their sysctls need "
        "CAP_NET_ADMIN and CAP_SYS_ADMIN); run it as root or with sudo");
  }
  if (access("/dev/net/tun", F_OK) != 0) {
    return FailedPrecondition(
        "netem needs /dev/net/tun, which is missing (load the tun module: modprobe tun; in a "
        "container, pass the device through, e.g. --device /dev/net/tun)");
  }
  int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return FailedPrecondition(std::string("netem cannot open /dev/net/tun: ") + strerror(errno));
  }
  close(fd);
  auto ip = RunCommand({"ip", "-V"}, std::chrono::seconds(5));
  if (!ip.ok()) {
    return FailedPrecondition(
        "netem needs the `ip` command of iproute2 (apt-get install iproute2): " +
        ip.status().message());
  }
  return Status::OK();
}

Status Up(const Topology& t, const Options& o) {
  XSILO_RETURN_IF_ERROR(ValidatePrefix(o.prefix));
  XSILO_RETURN_IF_ERROR(ValidateTopology(t));
  if (!t.loopback) XSILO_RETURN_IF_ERROR(CheckPrerequisites());
  const bool any_nat = std::any_of(t.sites.begin(), t.sites.end(),
                                   [](const Site& s) { return s.nat != NatType::kNone; });
  if (any_nat) XSILO_RETURN_IF_ERROR(CheckNatPrerequisites());
  auto existing = LoadState(o);
  if (existing.ok() && (existing->router_alive || existing->topology.loopback)) {
    return AlreadyExists("netem instance '" + o.prefix + "' is up (" + existing->topology.env +
                         "); run `xsilo netem down` first");
  }
  XSILO_RETURN_IF_ERROR(Down(o));  // whatever a crashed instance left
  std::error_code ec;
  fs::create_directories(StateDir(o), ec);
  if (ec) return Internal("cannot create " + StateDir(o) + ": " + ec.message());
  if (t.loopback) return WriteState(t, o, 0);

  auto undo = [&o](Status s) {
    (void)Down(o);
    return s;
  };
  XSILO_RETURN_IF_ERROR(WriteState(t, o, 0));
  for (const Site& s : t.sites) {
    auto r = RunCommand({"ip", "netns", "add", NetnsName(o, s)}, o.timeout);
    if (!r.ok()) return undo(r.status());
  }
  for (size_t i = 0; i < t.sites.size(); ++i) {
    if (t.sites[i].nat == NatType::kNone) continue;
    Status s = SetUpNat(t, o, static_cast<int>(i));
    if (!s.ok()) return undo(s);
  }
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) return undo(Internal(std::string("pipe: ") + strerror(errno)));
  // The child is born with the router's signals blocked, so a SIGUSR1 (whose
  // default action kills) that arrives before its signalfd exists waits.
  sigset_t router_signals = RouterSignals();
  sigset_t caller_mask;
  pthread_sigmask(SIG_BLOCK, &router_signals, &caller_mask);
  pid_t pid = fork();
  if (pid != 0) pthread_sigmask(SIG_SETMASK, &caller_mask, nullptr);
  if (pid < 0) {
    close(ready[0]);
    close(ready[1]);
    return undo(Internal(std::string("fork: ") + strerror(errno)));
  }
  if (pid == 0) {
    close(ready[0]);
    RouterChild(t, o, ready[1]);
  }
  close(ready[1]);
  Status st = WriteState(t, o, pid);
  std::string reply;
  const auto deadline = std::chrono::steady_clock::now() + o.timeout;
  while (st.ok()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{ready[0], POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) == 0) {
      st = Timeout("the router did not start within " + std::to_string(o.timeout.count()) + " ms");
      break;
    }
    char buf[512];
    ssize_t n = read(ready[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  close(ready[0]);
  if (st.ok() && reply != "OK") {
    std::string log = ReadFile(StateDir(o) + "/router.log");
    st = Internal("the router failed to start: " + (reply.empty() ? "it exited" : reply) +
                  (log.empty() ? "" : "; its log: " + log));
  }
  if (!st.ok()) return undo(st);
  return Status::OK();
}

Status Down(const Options& o) {
  XSILO_RETURN_IF_ERROR(ValidatePrefix(o.prefix));
  std::set<std::string> names;
  int pid = 0;
  auto state = LoadState(o);
  if (state.ok()) {
    pid = state->router_pid;
    for (const auto& s : state->sites) {
      if (!s.netns.empty()) names.insert(s.netns);
      if (!s.nat_netns.empty()) names.insert(s.nat_netns);
    }
  }
  for (const auto& n : ExistingNamespaces(o.prefix)) names.insert(n);
  Status result;
  if (pid > 0 && internal::ProcessName(pid) == kRouterName) {
    Status s = internal::StopProcess(pid, o.timeout);
    if (!s.ok()) result = s;
  }
  for (const auto& name : names) {
    if (access((std::string(internal::kNetnsDir) + "/" + name).c_str(), F_OK) != 0) continue;
    for (pid_t p : internal::ProcessesInNetns(name)) {
      Status s = internal::StopProcess(p, std::chrono::milliseconds(2000));
      if (!s.ok() && result.ok()) result = s;
    }
    auto r = RunCommand({"ip", "netns", "delete", name}, o.timeout);
    if (!r.ok() && result.ok()) result = r.status();
  }
  std::error_code ec;
  fs::remove_all(StateDir(o), ec);
  if (ec && result.ok()) result = Internal("cannot remove " + StateDir(o) + ": " + ec.message());
  return result;
}

Status SetLinks(const std::vector<std::vector<LinkShape>>& links, const Options& o) {
  XSILO_ASSIGN_OR_RETURN(State state, LoadState(o));
  if (state.topology.loopback) {
    return FailedPrecondition("netem instance '" + o.prefix + "' (" + state.topology.env +
                              ") is plain loopback: it has no links to shape");
  }
  if (!state.router_alive) {
    return FailedPrecondition("the router of netem instance '" + o.prefix +
                              "' is not running; run `xsilo netem down` and `up` again");
  }
  if (!state.live_links) {
    return FailedPrecondition("the router of netem instance '" + o.prefix +
                              "' was started by an older xsilo that cannot change links live; "
                              "run `xsilo netem down` and `up` again");
  }
  Topology t = state.topology;
  t.links = links;
  XSILO_RETURN_IF_ERROR(ValidateTopology(t));
  const uint64_t version = state.links_version + 1;
  XSILO_RETURN_IF_ERROR(WriteState(t, o, state.router_pid, version));
  if (kill(state.router_pid, SIGUSR1) != 0) {
    return Internal("cannot signal the router (pid " + std::to_string(state.router_pid) +
                    "): " + strerror(errno));
  }
  // The router rewrites stats.json with the version it applied.
  const std::string stats = StateDir(o) + "/stats.json";
  const auto deadline = std::chrono::steady_clock::now() + o.timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    json j = json::parse(ReadFile(stats), nullptr, false);
    if (!j.is_discarded() && j.value("links_version", uint64_t{0}) >= version) {
      return Status::OK();
    }
    if (!internal::ProcessAlive(state.router_pid)) {
      return Internal("the router exited instead of applying the new links; its log: " +
                      ReadFile(StateDir(o) + "/router.log"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string log = ReadFile(StateDir(o) + "/router.log");
  return Timeout("the router did not confirm the new links within " +
                 std::to_string(o.timeout.count()) + " ms (the state file holds them already)" +
                 (log.empty() ? "" : "; its log: " + log));
}

Result<int> FindSite(const State& state, std::string_view name) {
  int by_region = -1;
  int regions = 0;
  for (size_t i = 0; i < state.sites.size(); ++i) {
    if (state.sites[i].site.name == name) return static_cast<int>(i);
    if (i > 0 && state.sites[i].site.region == name) {
      by_region = static_cast<int>(i);
      ++regions;
    }
  }
  if (regions == 1) return by_region;
  std::string known;
  for (const auto& s : state.sites) known += (known.empty() ? "" : ", ") + s.site.name;
  return NotFound("no site '" + std::string(name) + "' (" + known + ")");
}

Status EnterSite(const State& state, int site) {
  if (site < 0 || site >= static_cast<int>(state.sites.size())) {
    return InvalidArgument("site index out of range");
  }
  if (state.topology.loopback) return Status::OK();
  return internal::EnterNetns(state.sites[site].netns);
}

Result<std::vector<LinkStats>> ReadLinkStats(const State& state) {
  std::string path = state.state_dir + "/stats.json";
  json j = json::parse(ReadFile(path), nullptr, false);
  if (j.is_discarded() || !j.contains("links")) return NotFound("no router statistics in " + path);
  std::vector<LinkStats> out;
  for (const auto& l : j["links"]) {
    out.push_back(LinkStats{l.value("from", 0), l.value("to", 0), l.value("packets", uint64_t{0}),
                            l.value("bytes", uint64_t{0}), l.value("dropped_queue", uint64_t{0}),
                            l.value("dropped_loss", uint64_t{0})});
  }
  return out;
}

Result<double> ProcessCpuSeconds(int pid) {
  std::string line = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t p = line.rfind(')');
  if (line.empty() || p == std::string::npos) return NotFound("no process " + std::to_string(pid));
  std::istringstream in(line.substr(p + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  // Fields after the name start at 3 (state); utime and stime are 14 and 15.
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace xsilo::netem
