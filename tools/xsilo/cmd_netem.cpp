// `xsilo netem`: the userspace WAN emulator (docs/netem.md).
//   up --env ENV [--scale S]   namespaces + router for an environment
//   set --site SITE ...        change a site's link to the server while it runs
//   exec SITE -- CMD...        run a command inside a site
//   status                     sites, links, router statistics
//   down                       remove everything (idempotent, after crashes too)
//   check                      iperf3 against the profile's targets
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "xsilo/netem/netem.h"
#include "xsilo/netem/probe.h"

namespace xsilo::cli {

namespace {

struct NetemArgs {
  std::string prefix = "xsilo";
  // up
  std::string env;
  double scale = 1;
  std::string profiles;
  uint32_t mtu = 0;
  double jitter_ms = 0;          // up and set
  double loss = 0;               // up and set
  std::vector<std::string> nat;  // up: SITE=TYPE
  // set (each shape field only when its flag is given)
  std::vector<std::string> set_sites;
  std::string peer = "server";
  std::string profile;
  double delay_ms = 0;
  double rate_MBps = 0;
  uint64_t queue_bytes = 0;
  // exec
  std::string site;
  std::vector<std::string> command;
  // check
  netem::CheckOptions check;
  std::string json_path;
};

netem::Options MakeOptions(const NetemArgs& a) {
  netem::Options o;
  o.prefix = a.prefix;
  return o;
}

[[noreturn]] void Fail(const std::string& what, const Status& s, int code = 1) {
  std::cerr << "xsilo netem " << what << ": " << s.ToString() << "\n";
  std::exit(code);
}

std::string Fixed(double v, int digits) {
  std::ostringstream ss;
  ss << std::fixed << std::setprecision(digits) << v;
  return ss.str();
}

std::string Bytes(uint64_t b) {
  if (b >= (1ull << 20)) return Fixed(static_cast<double>(b) / (1 << 20), 1) + " MiB";
  return Fixed(static_cast<double>(b) / 1024, 0) + " KiB";
}

void Up(const NetemArgs& a) {
  auto topology = netem::LoadTopology(a.env, a.scale, a.profiles);
  if (!topology.ok()) Fail("up", topology.status(), 2);
  netem::Topology& t = *topology;
  if (a.mtu) {
    t.mtu = a.mtu;
    for (auto& site : t.sites) site.mtu = 0;
  }
  for (auto& row : t.links) {
    for (auto& l : row) {
      l.jitter_ms = a.jitter_ms;
      l.loss = a.loss;
    }
  }
  for (const auto& spec : a.nat) {
    const auto eq = spec.find('=');
    if (eq == std::string::npos) {
      Fail("up", InvalidArgument("--nat takes SITE=TYPE, got '" + spec + "'"), 2);
    }
    const std::string name = spec.substr(0, eq);
    auto type = netem::ParseNatType(spec.substr(eq + 1));
    if (!type.ok()) Fail("up", type.status(), 2);
    auto site = std::find_if(t.sites.begin(), t.sites.end(),
                             [&](const netem::Site& x) { return x.name == name; });
    if (site == t.sites.end()) Fail("up", NotFound("--nat: no site '" + name + "'"), 2);
    site->nat = *type;
  }
  Status s = netem::Up(t, MakeOptions(a));
  if (!s.ok()) Fail("up", s);
  if (t.loopback) {
    std::cout << "netem: " << t.env
              << " is plain loopback (no emulation); every site is 127.0.0.1 and "
                 "`xsilo netem exec SITE -- CMD` runs CMD directly\n";
    return;
  }
  std::cout << "netem: " << t.env << " up at scale " << t.scale << " (" << t.sites.size()
            << " sites, prefix " << a.prefix << "); server at " << netem::SiteAddress(0) << "\n";
}

// "80.00 ms one-way, 12.50 MB/s[, jitter 1.00 ms][, loss 0.100%][, queue 1.0 MiB]"
std::string ShapeText(const netem::LinkShape& l) {
  std::string text = Fixed(l.delay_ms, 2) + " ms one-way, " +
                     (l.rate_MBps > 0 ? Fixed(l.rate_MBps, 2) + " MB/s" : "unlimited");
  if (l.jitter_ms > 0) text += ", jitter " + Fixed(l.jitter_ms, 2) + " ms";
  if (l.loss > 0) text += ", loss " + Fixed(100 * l.loss, 3) + "%";
  if (l.queue_bytes > 0) text += ", queue " + Bytes(l.queue_bytes);
  return text;
}

// Which shape flags of `set` were given.
struct SetFlags {
  CLI::Option* delay = nullptr;
  CLI::Option* rate = nullptr;
  CLI::Option* jitter = nullptr;
  CLI::Option* loss = nullptr;
  CLI::Option* queue = nullptr;
};

void Set(const NetemArgs& a, const SetFlags& given) {
  const bool any_flag = given.delay->count() + given.rate->count() + given.jitter->count() +
                            given.loss->count() + given.queue->count() >
                        0;
  if (!any_flag && a.profile.empty()) {
    Fail("set",
         InvalidArgument("nothing to set: give --profile or at least one of --delay-ms, "
                         "--rate-MBps, --jitter-ms, --loss, --queue-bytes"),
         2);
  }
  auto state = netem::LoadState(MakeOptions(a));
  if (!state.ok()) Fail("set", state.status());
  auto peer = netem::FindSite(*state, a.peer);
  if (!peer.ok()) Fail("set", peer.status(), 2);
  netem::LinkShape profile;
  if (!a.profile.empty()) {
    auto p = netem::ProfileLink(a.profile, state->topology.scale, a.profiles);
    if (!p.ok()) Fail("set", p.status(), 2);
    profile = *p;
  }
  auto links = state->topology.links;
  std::vector<int> sites;
  for (const auto& name : a.set_sites) {
    auto site = netem::FindSite(*state, name);
    if (!site.ok()) Fail("set", site.status(), 2);
    if (*site == *peer) {
      Fail("set",
           InvalidArgument("--site and --peer both name '" + state->sites[*site].site.name +
                           "': a link joins two different sites"),
           2);
    }
    sites.push_back(*site);
    for (auto [from, to] : {std::pair{*site, *peer}, std::pair{*peer, *site}}) {
      netem::LinkShape& l = links[from][to];
      if (!a.profile.empty()) {
        l.delay_ms = profile.delay_ms;
        l.rate_MBps = profile.rate_MBps;
      }
      if (given.delay->count()) l.delay_ms = a.delay_ms;
      if (given.rate->count()) l.rate_MBps = a.rate_MBps;
      if (given.jitter->count()) l.jitter_ms = a.jitter_ms;
      if (given.loss->count()) l.loss = a.loss;
      if (given.queue->count()) l.queue_bytes = a.queue_bytes;
    }
  }
  Status s = netem::SetLinks(links, MakeOptions(a));
  if (!s.ok()) Fail("set", s, s.code() == StatusCode::kInvalidArgument ? 2 : 1);
  for (int site : sites) {
    std::cout << "netem: " << state->sites[site].site.name << " <-> "
              << state->sites[*peer].site.name << " now " << ShapeText(links[*peer][site]) << "\n";
  }
}

void Down(const NetemArgs& a) {
  Status s = netem::Down(MakeOptions(a));
  if (!s.ok()) Fail("down", s);
  std::cout << "netem: down\n";
}

void Exec(const NetemArgs& a) {
  auto state = netem::LoadState(MakeOptions(a));
  if (!state.ok()) Fail("exec", state.status());
  auto site = netem::FindSite(*state, a.site);
  if (!site.ok()) Fail("exec", site.status(), 2);
  if (a.command.empty()) Fail("exec", InvalidArgument("no command after --"), 2);
  Status s = netem::EnterSite(*state, *site);
  if (!s.ok()) Fail("exec", s);
  setenv("XSILO_NETEM_SITE", state->sites[*site].site.name.c_str(), 1);
  setenv("XSILO_NETEM_ADDRESS", state->sites[*site].address.c_str(), 1);
  setenv("XSILO_NETEM_PUBLIC_ADDRESS", state->sites[*site].public_address.c_str(), 1);
  setenv("XSILO_NETEM_SERVER", state->sites[0].public_address.c_str(), 1);
  std::vector<char*> argv;
  for (const auto& c : a.command) argv.push_back(const_cast<char*>(c.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::cerr << "xsilo netem exec: cannot run " << a.command[0] << ": " << strerror(errno) << "\n";
  std::exit(127);
}

void PrintStatus(const NetemArgs& a) {
  auto state = netem::LoadState(MakeOptions(a));
  if (!state.ok()) {
    std::cout << "netem: " << state.status().message() << "\n";
    return;
  }
  const auto& st = *state;
  std::cout << "netem '" << st.prefix << "': env " << st.topology.env << ", scale "
            << st.topology.scale;
  if (st.topology.loopback) {
    std::cout << ", loopback (no emulation)\n";
  } else {
    std::cout << ", router pid " << st.router_pid
              << (st.router_alive ? " (running" : " (NOT RUNNING: run `xsilo netem down`");
    auto cpu = netem::ProcessCpuSeconds(st.router_pid);
    if (st.router_alive && cpu.ok()) std::cout << ", " << Fixed(*cpu, 1) << " s CPU";
    std::cout << ")";
    if (st.links_version > 0) {
      std::cout << "; links changed " << st.links_version << " time"
                << (st.links_version == 1 ? "" : "s") << " by `xsilo netem set`";
    }
    std::cout << "\n";
  }
  std::cout << std::left << std::setw(9) << "site" << std::setw(18) << "region" << std::setw(16)
            << "address" << std::setw(22) << "netns" << std::setw(7) << "mtu" << std::setw(11)
            << "tcp buf"
            << "link to server\n";
  for (size_t i = 0; i < st.sites.size(); ++i) {
    const auto& s = st.sites[i];
    std::cout << std::setw(9) << s.site.name << std::setw(18)
              << (s.site.region.empty() ? "-" : s.site.region) << std::setw(16) << s.address
              << std::setw(22) << (s.netns.empty() ? "-" : s.netns) << std::setw(7)
              << (st.topology.loopback ? "-" : std::to_string(s.site.mtu)) << std::setw(11)
              << (s.site.tcp_rmem_max ? Bytes(s.site.tcp_rmem_max) : "-");
    if (i > 0 && !st.topology.loopback) {
      const auto& down = st.topology.links[0][i];
      const auto& up = st.topology.links[i][0];
      std::cout << ShapeText(down);
      if (ShapeText(up) != ShapeText(down)) std::cout << " (to server: " << ShapeText(up) << ")";
    }
    std::cout << "\n";
  }
  for (const auto& s : st.sites) {
    if (s.site.nat == netem::NatType::kNone) continue;
    std::cout << s.site.name << " is behind a " << netem::NatTypeName(s.site.nat)
              << " NAT: public address " << s.public_address << ", NAT box netns " << s.nat_netns
              << "\n";
  }
  auto stats = netem::ReadLinkStats(st);
  if (stats.ok()) {
    std::cout << "link                packets        bytes  queue drops  loss drops\n";
    for (const auto& l : *stats) {
      if (l.packets == 0 && l.dropped_queue == 0 && l.dropped_loss == 0) continue;
      std::string name = st.sites[l.from].site.name + "->" + st.sites[l.to].site.name;
      std::cout << std::setw(18) << name << std::right << std::setw(9) << l.packets << std::setw(13)
                << Bytes(l.bytes) << std::setw(13) << l.dropped_queue << std::setw(12)
                << l.dropped_loss << std::left << "\n";
    }
  }
}

bool Within(double value, double target, double tolerance) {
  return target > 0 && std::fabs(value - target) <= tolerance * target;
}

void Check(const NetemArgs& a) {
  auto state = netem::LoadState(MakeOptions(a));
  if (!state.ok()) Fail("check", state.status());
  const auto& st = *state;
  std::cout << "xsilo netem check: env " << st.topology.env << ", scale " << st.topology.scale
            << "; iperf3 server -> client, " << a.check.seconds << " s after "
            << a.check.omit_seconds << " s omitted\n"
            << "targets: RTT within 10%, throughput within 25% of the scaled profile\n";
  std::cout << std::left << std::setw(9) << "site" << std::setw(16) << "region" << std::right
            << std::setw(18) << "RTT ms (target)" << std::setw(24) << "1 stream MB/s (target)"
            << std::setw(5) << "N" << std::setw(24) << "N streams MB/s (target)" << std::setw(20)
            << "router CPU 1 / N" << std::setw(14) << "machine busy"
            << "\n";
  bool all_ok = true;
  std::ostringstream json;
  json << "{\"env\": \"" << st.topology.env << "\", \"scale\": " << st.topology.scale
       << ", \"seconds\": " << a.check.seconds << ", \"rows\": [";
  bool first = true;
  auto print = [&](const netem::CheckRow& r) {
    bool rtt_ok = Within(r.rtt_ms, r.target.rtt_ms, 0.10);
    bool single_ok = Within(r.single_MBps, r.target.single_MBps, 0.25);
    bool multi_ok = Within(r.multi_MBps, r.target.multi_MBps, 0.25);
    if (st.topology.loopback) rtt_ok = single_ok = multi_ok = true;  // no targets
    all_ok = all_ok && rtt_ok && single_ok && multi_ok;
    auto mark = [](bool ok) { return ok ? "  ok" : " MISS"; };
    std::cout << std::left << std::setw(9) << r.site << std::setw(16) << r.region << std::right
              << std::setw(8) << Fixed(r.rtt_ms, 1) << " (" << std::setw(5)
              << Fixed(r.target.rtt_ms, 1) << ")" << mark(rtt_ok) << std::setw(9)
              << Fixed(r.single_MBps, 2) << " (" << std::setw(7) << Fixed(r.target.single_MBps, 2)
              << ")" << mark(single_ok) << std::setw(5) << r.streams << std::setw(9)
              << Fixed(r.multi_MBps, 1) << " (" << std::setw(7) << Fixed(r.target.multi_MBps, 1)
              << ")" << mark(multi_ok) << std::setw(9) << Fixed(r.router_cpu_single, 0) << "% / "
              << std::setw(3) << Fixed(r.router_cpu_multi, 0) << "%" << std::setw(13)
              << Fixed(r.machine_busy_multi, 0) << "%\n";
    json << (first ? "" : ",") << "\n {\"site\": \"" << r.site << "\", \"region\": \"" << r.region
         << "\", \"rtt_ms\": " << r.rtt_ms << ", \"target_rtt_ms\": " << r.target.rtt_ms
         << ", \"single_MBps\": " << r.single_MBps
         << ", \"target_single_MBps\": " << r.target.single_MBps << ", \"streams\": " << r.streams
         << ", \"multi_MBps\": " << r.multi_MBps
         << ", \"target_multi_MBps\": " << r.target.multi_MBps
         << ", \"router_cpu_single_pct\": " << r.router_cpu_single
         << ", \"router_cpu_multi_pct\": " << r.router_cpu_multi
         << ", \"machine_busy_multi_pct\": " << r.machine_busy_multi << "}";
    first = false;
  };
  auto rows = netem::RunCheck(st, a.check, print);
  if (!rows.ok()) Fail("check", rows.status());
  json << "\n]}\n";
  if (!a.json_path.empty()) {
    std::ofstream out(a.json_path);
    out << json.str();
  }
  if (!all_ok) {
    std::cout << "some targets missed (router CPU near 100% or machine busy near 100% means the "
                 "scale is too high for this machine)\n";
    std::exit(1);
  }
}

}  // namespace

void AddNetemCommand(CLI::App& app) {
  auto args = std::make_shared<NetemArgs>();
  auto* netem = app.add_subcommand("netem", "Userspace WAN emulator (namespaces + TUN router)");
  netem->require_subcommand(1);
  netem->add_option("--prefix", args->prefix, "Instance name: namespaces are PREFIX.SITE")
      ->envname("XSILO_NETEM_PREFIX")
      ->capture_default_str();

  auto* up = netem->add_subcommand("up", "Create the sites of an environment and start the router");
  up->add_option("--env", args->env, "lan, geo-proximal, ca-va, ca-hk, geo-distributed")
      ->required();
  up->add_option("--scale", args->scale, "Multiply every bandwidth by S")->capture_default_str();
  up->add_option("--profiles", args->profiles, "Link-profile JSON (default: the built-in copy)");
  up->add_option("--mtu", args->mtu,
                 "MTU of every site link (default: sized per client from its TCP window)");
  up->add_option("--jitter-ms", args->jitter_ms, "Uniform +- jitter on every link, ms");
  up->add_option("--loss", args->loss, "Random loss probability on every link, [0, 1)");
  up->add_option("--nat", args->nat,
                 "Put SITE behind a NAT: SITE=full-cone|restricted|symmetric (repeatable)");
  up->callback([args] { Up(*args); });

  auto* set = netem->add_subcommand(
      "set", "Change the links between sites and a peer (default the server) while running");
  set->add_option("--site", args->set_sites,
                  "server, client1, ... or a client's region (repeat for several sites)")
      ->required();
  set->add_option("--peer", args->peer, "The other end of each link")->capture_default_str();
  set->add_option("--profile", args->profile,
                  "Delay and rate of a region (hong-kong) or one-client environment (ca-hk), "
                  "scaled like the instance");
  set->add_option("--profiles", args->profiles, "Link-profile JSON (default: the built-in copy)");
  SetFlags given;
  given.delay = set->add_option("--delay-ms", args->delay_ms, "One-way delay, ms");
  given.rate = set->add_option("--rate-MBps", args->rate_MBps,
                               "Rate in MB/s (10^6 bytes/s of IP packets); 0 = unlimited");
  given.jitter = set->add_option("--jitter-ms", args->jitter_ms, "Uniform +- jitter, ms");
  given.loss = set->add_option("--loss", args->loss, "Random loss probability, [0, 1)");
  given.queue = set->add_option("--queue-bytes", args->queue_bytes,
                                "Queue bound in bytes; 0 = one round trip at the rate");
  set->callback([args, given] { Set(*args, given); });

  auto* exec = netem->add_subcommand("exec", "Run a command inside a site: exec SITE -- CMD...");
  exec->add_option("site", args->site, "server, client1, ... or a client's region")->required();
  exec->add_option("command", args->command, "The command and its arguments (after --)")
      ->required();
  exec->callback([args] { Exec(*args); });

  netem->add_subcommand("status", "Show sites, links and router statistics")->callback([args] {
    PrintStatus(*args);
  });
  netem->add_subcommand("down", "Remove every namespace and process of the instance")
      ->callback([args] { Down(*args); });

  auto* check = netem->add_subcommand("check", "iperf3 from the server to each client vs targets");
  check->add_option("--seconds", args->check.seconds, "Seconds per iperf3 run")
      ->capture_default_str();
  check->add_option("--omit", args->check.omit_seconds, "Warm-up seconds not counted")
      ->capture_default_str();
  check->add_option("--port", args->check.port, "iperf3 port")->capture_default_str();
  check->add_option("--json", args->json_path, "Also write the results as JSON here");
  check->callback([args] { Check(*args); });
}

}  // namespace xsilo::cli
