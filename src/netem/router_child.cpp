// The router child of a netem instance: detached, it opens one TUN device
// in each site's namespace and forwards between them (router.h) until a
// stop signal; SIGUSR1 reloads the links from the state file.
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
#include <cstring>

#include "instance_internal.h"
#include "router.h"
#include "sys.h"
#include "xsilo/core/log.h"

namespace xsilo::netem::internal {

// SIGUSR1 reloads the links; the others stop the router.
sigset_t RouterSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGUSR1}) sigaddset(&mask, sig);
  return mask;
}

namespace {

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

// Inside the namespace that holds the site's public side: a TUN device, configured.
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
  if (!st.ok()) {
    close(fd);
    return st;
  }
  return fd;
}

// Inside the namespace of the site's host (the TUN's, unless behind a NAT):
// the TCP buffer limits.
Status ApplyTcpLimits(const Site& s) {
  Status st;
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
  return st;
}

}  // namespace

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
    const Site& site = t.sites[i];
    const bool nat = site.nat != NatType::kNone;
    // Behind a NAT the TUN device (the public side) is the NAT box's.
    Status s = internal::EnterNetns(nat ? NatNetnsName(o, site) : NetnsName(o, site));
    if (!s.ok()) fail(s);
    auto fd = OpenSiteTun(t, static_cast<int>(i));
    if (!fd.ok()) fail(fd.status().WithContext("site " + site.name));
    config.tun_fds.push_back(*fd);
    if (nat) s = internal::EnterNetns(NetnsName(o, site));
    if (s.ok()) s = ApplyTcpLimits(site);
    if (!s.ok()) fail(s.WithContext("site " + site.name));
    if (setns(root_ns, CLONE_NEWNET) != 0)
      fail(Internal(std::string("setns back: ") + strerror(errno)));
  }
  close(root_ns);
  (void)!write(ready_fd, "OK", 2);
  close(ready_fd);
  Status s = internal::RunRouter(config);
  if (!s.ok()) {
    static constinit LogComponent log("netem");
    XSILO_LOG(log, kError, "router: " << s.ToString());
    _exit(1);
  }
  _exit(0);
}

}  // namespace xsilo::netem::internal
