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
#include <linux/if_tun.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "router.h"
#include "sys.h"
#include "xsilo/netem/netem.h"

namespace xsilo::netem {

namespace {

using internal::RunCommand;
using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kRouterName = "xsilo-netem-rt";  // /proc/PID/comm
constexpr const char* kDevice = "xs0";
// Longer delays are surely a unit mistake (and would overflow nanoseconds).
constexpr double kMaxDelayMs = 3'600'000;

std::string StateDir(const Options& o) {
  return o.state_dir.empty() ? "/run/xsilo-netem/" + o.prefix : o.state_dir;
}
std::string StatePath(const Options& o) { return StateDir(o) + "/state.json"; }
std::string NetnsName(const Options& o, const Site& s) { return o.prefix + "." + s.name; }

Status ValidatePrefix(const std::string& p) {
  if (p.empty() || p.size() > 32) return InvalidArgument("prefix must have 1 to 32 characters");
  for (char c : p) {
    if (!isalnum(static_cast<unsigned char>(c)) && c != '-') {
      return InvalidArgument("prefix '" + p + "' may hold only letters, digits and '-'");
    }
  }
  return Status::OK();
}

Status ValidateTopology(const Topology& t) {
  const size_t n = t.sites.size();
  if (n < 2 || n > 200) return InvalidArgument("a topology needs 2 to 200 sites");
  if (t.links.size() != n) return InvalidArgument("links must be sites x sites");
  for (size_t from = 0; from < n; ++from) {
    if (t.links[from].size() != n) return InvalidArgument("links must be sites x sites");
    for (size_t to = 0; to < n; ++to) {
      const LinkShape& l = t.links[from][to];
      // Written so that NaN fails every test.
      if (!(l.delay_ms >= 0 && l.delay_ms <= kMaxDelayMs) ||
          !(l.jitter_ms >= 0 && l.jitter_ms <= kMaxDelayMs) ||
          !(l.rate_MBps >= 0 && std::isfinite(l.rate_MBps)) || !(l.loss >= 0 && l.loss < 1)) {
        std::ostringstream shape;
        shape << "delay_ms " << l.delay_ms << ", rate_MBps " << l.rate_MBps << ", jitter_ms "
              << l.jitter_ms << ", loss " << l.loss;
        return InvalidArgument("link " + t.sites[from].name + "->" + t.sites[to].name + " (" +
                               shape.str() +
                               "): delay and jitter must be in [0, 3600000] ms, the rate finite "
                               "and >= 0, loss in [0, 1)");
      }
    }
  }
  if (t.mtu < 1280 || t.mtu > 65000) return InvalidArgument("mtu must be in [1280, 65000]");
  for (const auto& s : t.sites) {
    if (s.mtu != 0 && (s.mtu < 1280 || s.mtu > 65000)) {
      return InvalidArgument("site mtu must be 0 or in [1280, 65000]");
    }
  }
  std::set<std::string> names;
  for (const auto& s : t.sites) {
    if (s.name.empty() || s.name.find('.') != std::string::npos ||
        s.name.find('/') != std::string::npos || !names.insert(s.name).second) {
      return InvalidArgument("site names must be unique, non-empty, without '.' or '/'");
    }
  }
  return Status::OK();
}

uint32_t SiteMtu(const Topology& t, size_t i) { return t.sites[i].mtu ? t.sites[i].mtu : t.mtu; }

json LinkToJson(const LinkShape& l) {
  return {{"delay_ms", l.delay_ms},
          {"rate_MBps", l.rate_MBps},
          {"jitter_ms", l.jitter_ms},
          {"loss", l.loss},
          {"queue_bytes", l.queue_bytes}};
}

json StateToJson(const Topology& t, const Options& o, int pid, uint64_t links_version) {
  json sites = json::array();
  for (size_t i = 0; i < t.sites.size(); ++i) {
    const Site& s = t.sites[i];
    sites.push_back({{"name", s.name},
                     {"region", s.region},
                     {"netns", t.loopback ? "" : NetnsName(o, s)},
                     {"address", t.loopback ? "127.0.0.1" : SiteAddress(static_cast<int>(i))},
                     {"tcp_rmem_max", s.tcp_rmem_max},
                     {"tcp_wmem_max", s.tcp_wmem_max},
                     {"mtu", SiteMtu(t, i)},
                     {"target",
                      {{"rtt_ms", s.target.rtt_ms},
                       {"single_MBps", s.target.single_MBps},
                       {"multi_MBps", s.target.multi_MBps}}}});
  }
  json links = json::array();
  for (const auto& row : t.links) {
    json r = json::array();
    for (const auto& l : row) r.push_back(LinkToJson(l));
    links.push_back(r);
  }
  // "links_version" also tells SetLinks that the router reloads on SIGUSR1.
  return {{"prefix", o.prefix},
          {"env", t.env},
          {"scale", t.scale},
          {"mtu", t.mtu},
          {"loopback", t.loopback},
          {"router_pid", pid},
          {"links_version", links_version},
          {"sites", sites},
          {"links", links}};
}

Status WriteState(const Topology& t, const Options& o, int pid, uint64_t links_version = 0) {
  std::string path = StatePath(o);
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << StateToJson(t, o, pid, links_version).dump(1) << "\n";
    if (!out) return Internal("cannot write " + tmp);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return Internal("rename " + tmp + ": " + strerror(errno));
  }
  return Status::OK();
}

Result<State> ParseState(const std::string& text, const Options& o) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Corrupt("state file is not JSON");
  try {
    State s;
    s.prefix = j.at("prefix").get<std::string>();
    s.state_dir = StateDir(o);
    s.router_pid = j.at("router_pid").get<int>();
    s.live_links = j.contains("links_version");
    s.links_version = j.value("links_version", uint64_t{0});
    Topology& t = s.topology;
    t.env = j.at("env").get<std::string>();
    t.scale = j.at("scale").get<double>();
    t.mtu = j.at("mtu").get<uint32_t>();
    t.loopback = j.at("loopback").get<bool>();
    for (const auto& js : j.at("sites")) {
      SiteState ss;
      ss.site.name = js.at("name").get<std::string>();
      ss.site.region = js.at("region").get<std::string>();
      ss.site.tcp_rmem_max = js.at("tcp_rmem_max").get<uint64_t>();
      ss.site.tcp_wmem_max = js.at("tcp_wmem_max").get<uint64_t>();
      ss.site.mtu = js.at("mtu").get<uint32_t>();
      const json& tg = js.at("target");
      ss.site.target = {tg.at("rtt_ms").get<double>(), tg.at("single_MBps").get<double>(),
                        tg.at("multi_MBps").get<double>()};
      ss.netns = js.at("netns").get<std::string>();
      ss.address = js.at("address").get<std::string>();
      t.sites.push_back(ss.site);
      s.sites.push_back(std::move(ss));
    }
    for (const auto& jr : j.at("links")) {
      std::vector<LinkShape> row;
      for (const auto& jl : jr) {
        row.push_back(LinkShape{jl.at("delay_ms").get<double>(), jl.at("rate_MBps").get<double>(),
                                jl.at("jitter_ms").get<double>(), jl.at("loss").get<double>(),
                                jl.at("queue_bytes").get<uint64_t>()});
      }
      t.links.push_back(std::move(row));
    }
    s.router_alive = s.router_pid > 0 && internal::ProcessAlive(s.router_pid) &&
                     internal::ProcessName(s.router_pid) == kRouterName;
    return s;
  } catch (const json::exception& e) {
    return Corrupt(std::string("state file: ") + e.what());
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- the router child -----------------------------------------------------

// SIGUSR1 reloads the links; the others stop the router.
sigset_t RouterSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) sigaddset(&mask, sig);
  return mask;
}

Status SetFlags(int sock, const char* dev, short flags) {
  ifreq ifr{};
  strncpy(ifr.ifr_name, dev, IFNAMSIZ - 1);
  if (ioctl(sock, SIOCGIFFLAGS, &ifr) != 0) {
    return Internal(std::string("SIOCGIFFLAGS ") + dev + ": " + strerror(errno));
  }
  ifr.ifr_flags |= flags;
  if (ioctl(sock, SIOCSIFFLAGS, &ifr) != 0) {
    return Internal(std::string("SIOCSIFFLAGS ") + dev + ": " + strerror(errno));
  }
  return Status::OK();
}

Status SetAddress(int sock, const char* dev, unsigned long req, const std::string& addr) {
  ifreq ifr{};
  strncpy(ifr.ifr_name, dev, IFNAMSIZ - 1);
  auto* sin = reinterpret_cast<sockaddr_in*>(&ifr.ifr_addr);
  sin->sin_family = AF_INET;
  inet_pton(AF_INET, addr.c_str(), &sin->sin_addr);
  if (ioctl(sock, req, &ifr) != 0) {
    return Internal(std::string("address ioctl on ") + dev + ": " + strerror(errno));
  }
  return Status::OK();
}

std::string BufferTriple(uint64_t min, uint64_t def, uint64_t max) {
  return std::to_string(std::min(min, max)) + " " + std::to_string(std::min(def, max)) + " " +
         std::to_string(max);
}

// Inside the site's namespace: a TUN device, configured, and the TCP limits.
Result<int> OpenSiteTun(const Topology& t, int index) {
  int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return FailedPrecondition(std::string("open /dev/net/tun: ") + strerror(errno));
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  strncpy(ifr.ifr_name, kDevice, IFNAMSIZ - 1);
  if (ioctl(fd, TUNSETIFF, &ifr) != 0) {
    Status s = Internal(std::string("TUNSETIFF: ") + strerror(errno));
    close(fd);
    return s;
  }
  int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  Status st = sock < 0 ? Internal(std::string("socket: ") + strerror(errno)) : Status::OK();
  if (st.ok()) {
    ifreq m{};
    strncpy(m.ifr_name, kDevice, IFNAMSIZ - 1);
    m.ifr_mtu = static_cast<int>(SiteMtu(t, index));
    if (ioctl(sock, SIOCSIFMTU, &m) != 0)
      st = Internal(std::string("SIOCSIFMTU: ") + strerror(errno));
  }
  // No IPv6 on the site links: the router forwards IPv4 only.
  (void)internal::WriteSysctl(std::string("/proc/sys/net/ipv6/conf/") + kDevice + "/disable_ipv6",
                              "1");
  if (st.ok()) st = SetAddress(sock, kDevice, SIOCSIFADDR, SiteAddress(index));
  if (st.ok()) st = SetAddress(sock, kDevice, SIOCSIFNETMASK, "255.254.0.0");
  if (st.ok()) st = SetFlags(sock, kDevice, IFF_UP);
  if (st.ok()) st = SetFlags(sock, "lo", IFF_UP);
  if (sock >= 0) close(sock);
  const Site& s = t.sites[index];
  // The receive buffer starts at its maximum. The site MTU is up to 64000
  // (few packets for the router), and a new connection's first receive
  // window is about 64 KB whatever the MTU: one segment here where a 1500
  // MTU link has 44. A one-segment window grows slowly and at random, and
  // BBR (this kernel's default) then sometimes leaves its startup early and
  // carries a connection's first messages at a fraction of the link for
  // seconds: the same inline sends on ca-hk took 476 ms on one connection
  // and 550-830 ms on the next. Starting at the maximum keeps the limit
  // that sets the one-stream rate and takes the lottery out.
  if (st.ok() && s.tcp_rmem_max) {
    st = internal::WriteSysctl("/proc/sys/net/ipv4/tcp_rmem",
                               BufferTriple(4096, s.tcp_rmem_max, s.tcp_rmem_max));
  }
  if (st.ok() && s.tcp_wmem_max) {
    st = internal::WriteSysctl("/proc/sys/net/ipv4/tcp_wmem",
                               BufferTriple(4096, 16384, s.tcp_wmem_max));
  }
  if (!st.ok()) {
    close(fd);
    return st;
  }
  return fd;
}

[[noreturn]] void RouterChild(const Topology& t, const Options& o, int ready_fd) {
  auto fail = [&ready_fd](const Status& s) {
    std::string msg = s.ToString();
    (void)!write(ready_fd, msg.data(), msg.size());
    _exit(1);
  };
  setsid();
  prctl(PR_SET_NAME, kRouterName);
  prctl(PR_SET_TIMERSLACK, 1000);  // 1 us: delays are timed to the microsecond
  // A link should not stall behind compile jobs: run ahead of ordinary work
  // (best effort; a nice value, not a real-time class that could starve it).
  (void)setpriority(PRIO_PROCESS, 0, -10);
  // Keep nothing of the caller's: a test runner waits for EOF on its pipes.
  if (ready_fd != 3) {
    dup3(ready_fd, 3, O_CLOEXEC);
    ready_fd = 3;
  }
  close_range(4, ~0u, 0);
  int null = open("/dev/null", O_RDWR);
  int log =
      open((StateDir(o) + "/router.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
  dup2(null, 0);
  dup2(log >= 0 ? log : null, 1);
  dup2(log >= 0 ? log : null, 2);
  if (null > 2) close(null);
  if (log > 2) close(log);

  // Up blocked these before the fork; one sent since waits in the signalfd.
  sigset_t mask = RouterSignals();
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  int signal_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd < 0) fail(Internal(std::string("signalfd: ") + strerror(errno)));

  int root_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (root_ns < 0) fail(Internal(std::string("open own namespace: ") + strerror(errno)));
  internal::RouterConfig config;
  config.mtu = 0;
  for (size_t i = 0; i < t.sites.size(); ++i) config.mtu = std::max(config.mtu, SiteMtu(t, i));
  config.links = t.links;
  config.signal_fd = signal_fd;
  config.reload = [o]() -> Result<internal::LinkReload> {
    XSILO_ASSIGN_OR_RETURN(State s, ParseState(ReadFile(StatePath(o)), o));
    return internal::LinkReload{s.links_version, std::move(s.topology.links)};
  };
  config.stats_path = StateDir(o) + "/stats.json";
  for (size_t i = 0; i < t.sites.size(); ++i) {
    Status s = internal::EnterNetns(NetnsName(o, t.sites[i]));
    if (!s.ok()) fail(s);
    auto fd = OpenSiteTun(t, static_cast<int>(i));
    if (!fd.ok()) fail(fd.status().WithContext("site " + t.sites[i].name));
    config.tun_fds.push_back(*fd);
    if (setns(root_ns, CLONE_NEWNET) != 0)
      fail(Internal(std::string("setns back: ") + strerror(errno)));
  }
  close(root_ns);
  (void)!write(ready_fd, "OK", 2);
  close(ready_fd);
  Status s = internal::RunRouter(config);
  if (!s.ok()) {
    fprintf(stderr, "router: %s\n", s.ToString().c_str());
    _exit(1);
  }
  _exit(0);
}

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

Result<State> LoadState(const Options& o) {
  XSILO_RETURN_IF_ERROR(ValidatePrefix(o.prefix));
  std::string path = StatePath(o);
  if (access(path.c_str(), F_OK) != 0) {
    return NotFound("no netem instance '" + o.prefix + "' is up (no " + path + ")");
  }
  return ParseState(ReadFile(path), o);
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
