// `xsilo netem check`: iperf3 from the server site to every client site.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "sys.h"
#include "xsilo/netem/probe.h"

namespace xsilo::netem {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// argv run inside a site (through `ip netns exec`, or as is for loopback),
// at nice -10 so that other work on a busy machine disturbs it less.
std::vector<std::string> InSite(const State& state, int site, std::vector<std::string> argv) {
  std::vector<std::string> full{"nice", "-n", "-10"};
  if (!state.topology.loopback) {
    full.insert(full.begin(), {"ip", "netns", "exec", state.sites[site].netns});
  }
  full.insert(full.end(), argv.begin(), argv.end());
  return full;
}

// Starts argv in the background with its output discarded.
Result<pid_t> Spawn(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return Internal(std::string("fork: ") + strerror(errno));
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
    execvp(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// Busy and total jiffies of the whole machine.
std::pair<double, double> MachineJiffies() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;
  double v, total = 0, idle = 0;
  for (int i = 0; i < 8 && in >> v; ++i) {
    total += v;
    if (i == 3 || i == 4) idle += v;  // idle, iowait
  }
  return {total - idle, total};
}

struct IperfRun {
  double MBps = 0;
  double router_cpu = 0;    // % of one core
  double machine_busy = 0;  // % of all cores
};

Result<IperfRun> RunIperf(const State& state, int client, const CheckOptions& o, int streams) {
  std::vector<std::string> argv{"iperf3",
                                "-c",
                                state.sites[client].address,
                                "-p",
                                std::to_string(o.port),
                                "-t",
                                std::to_string(o.seconds),
                                "-O",
                                std::to_string(o.omit_seconds),
                                "-J"};
  if (streams > 1) {
    argv.push_back("-P");
    argv.push_back(std::to_string(streams));
  }
  const int pid = state.router_pid;
  double cpu0 = pid > 0 ? ProcessCpuSeconds(pid).value_or(0) : 0;
  auto m0 = MachineJiffies();
  auto t0 = Clock::now();
  auto out = internal::RunCommand(InSite(state, 0, argv),
                                  std::chrono::seconds(o.seconds + o.omit_seconds + 30));
  double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  double cpu1 = pid > 0 ? ProcessCpuSeconds(pid).value_or(0) : 0;
  auto m1 = MachineJiffies();
  std::string text = out.ok() ? *out : out.status().message();
  size_t brace = text.find('{');
  json j = brace == std::string::npos ? json() : json::parse(text.substr(brace), nullptr, false);
  if (j.is_object() && j.contains("error")) {
    return Unavailable("iperf3: " + j["error"].get<std::string>());
  }
  if (!out.ok()) return out.status();
  if (j.is_discarded() || !j.contains("end") || !j["end"].contains("sum_received")) {
    return Corrupt("iperf3 printed no result: " + text.substr(0, 300));
  }
  IperfRun r;
  r.MBps = j["end"]["sum_received"].value("bits_per_second", 0.0) / 8e6;
  r.router_cpu = wall > 0 ? 100 * (cpu1 - cpu0) / wall : 0;
  double total = m1.second - m0.second;
  r.machine_busy = total > 0 ? 100 * (m1.first - m0.first) / total : 0;
  return r;
}

Result<CheckRow> CheckClient(const State& state, int c, const CheckOptions& o) {
  const SiteState& site = state.sites[c];
  CheckRow row;
  row.site = site.site.name;
  row.region = site.site.region;
  row.target = site.site.target;
  if (row.target.single_MBps > 0) {
    row.streams = std::min(
        o.max_streams, static_cast<int>(std::ceil(row.target.multi_MBps / row.target.single_MBps)));
  }
  row.streams = std::max(row.streams, 2);

  {  // RTT: one-byte echoes over an established connection.
    XSILO_ASSIGN_OR_RETURN(auto echo, EchoServer::Start(state, c));
    XSILO_ASSIGN_OR_RETURN(auto rtts,
                           MeasureEchoRtt(state, 0, site.address, echo->port(), o.rtt_samples));
    row.rtt_ms = Median(rtts);
  }

  XSILO_ASSIGN_OR_RETURN(
      pid_t server,
      Spawn(InSite(state, c, {"iperf3", "-s", "-B", site.address, "-p", std::to_string(o.port)})));
  struct Stopper {
    pid_t pid;
    ~Stopper() { (void)internal::StopProcess(pid, std::chrono::seconds(2)); }
  } stopper{server};
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!Listening(server, o.port)) {
    if (!internal::ProcessAlive(server)) {
      return Unavailable("iperf3 -s exited in site " + site.site.name + " (is iperf3 installed?)");
    }
    if (Clock::now() > deadline) return Timeout("iperf3 -s did not listen within 10 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  XSILO_ASSIGN_OR_RETURN(IperfRun single, RunIperf(state, c, o, 1));
  row.single_MBps = single.MBps;
  row.router_cpu_single = single.router_cpu;
  XSILO_ASSIGN_OR_RETURN(IperfRun multi, RunIperf(state, c, o, row.streams));
  row.multi_MBps = multi.MBps;
  row.router_cpu_multi = multi.router_cpu;
  row.machine_busy_multi = multi.machine_busy;
  return row;
}

}  // namespace

bool Listening(pid_t pid, uint16_t port) {
  char want[8];
  std::snprintf(want, sizeof(want), ":%04X", port);
  // gRPC listens on a dual-stack IPv6 socket even for an IPv4 address.
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string slot, local, remote, st;
      ls >> slot >> local >> remote >> st;
      if (st == "0A" && local.size() >= 5 && local.compare(local.size() - 5, 5, want) == 0) {
        return true;
      }
    }
  }
  return false;
}

Result<std::vector<CheckRow>> RunCheck(const State& state, const CheckOptions& o,
                                       const std::function<void(const CheckRow&)>& progress) {
  if (o.seconds < 1 || o.omit_seconds < 0 || o.rtt_samples < 1 || o.max_streams < 1) {
    return InvalidArgument("check needs seconds >= 1, omit >= 0, rtt samples >= 1, streams >= 1");
  }
  if (!state.topology.loopback && !state.router_alive) {
    return FailedPrecondition("the netem router is not running; run `xsilo netem down` and `up`");
  }
  for (const auto& s : state.sites) {
    if (s.site.nat != NatType::kNone) {
      // The check serves iperf3 and the echo inside each client and dials
      // in from the server, which a NAT refuses.
      return FailedPrecondition("check dials each client from the server, and site " + s.site.name +
                                " is behind a " + std::string(NatTypeName(s.site.nat)) +
                                " NAT; check an instance without NATs");
    }
  }
  std::vector<CheckRow> rows;
  for (int c = 1; c < static_cast<int>(state.sites.size()); ++c) {
    auto row = CheckClient(state, c, o);
    if (!row.ok()) return row.status().WithContext("site " + state.sites[c].site.name);
    if (progress) progress(*row);
    rows.push_back(*row);
  }
  return rows;
}

}  // namespace xsilo::netem
