// The coordinator of `bench p2p`: brings each environment up, measures its
// link, runs every tier and backend as fresh peer processes and collects
// their results into the report.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "bench/p2p_backends.h"
#include "bench/p2p_output.h"
#include "bench/p2p_peer.h"
#include "bench/p2p_processes.h"
#include "xsilo/bench/link.h"
#include "xsilo/bench/model.h"
#include "xsilo/bench/p2p.h"
#include "xsilo/bench/report.h"
#include "xsilo/core/tiers.h"
#include "xsilo/netem/netem.h"
#include "xsilo/netem/probe.h"
#include "xsilo/s3/server.h"
#include "xsilo/transport/registry.h"

namespace xsilo::bench {

namespace {

// "a:b:c" -> {"a", "b", "c"} (empty parts kept).
std::vector<std::string> SplitCell(const std::string& s) {
  std::vector<std::string> out;
  size_t from = 0;
  for (size_t colon; (colon = s.find(':', from)) != std::string::npos; from = colon + 1)
    out.push_back(s.substr(from, colon - from));
  out.push_back(s.substr(from));
  return out;
}

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// A run's figures from its samples (latency_ms, delivery_ms), codec times
// and floor: medians, p95, the codec's share and the ratios to the floor.
void SetLatencyFigures(json& run) {
  const auto lat = run["latency_ms"].get<std::vector<double>>();
  const auto dl = run.value("delivery_ms", std::vector<double>{});
  const double median = Median(lat);
  run["latency_median_ms"] = median;
  run["latency_p95_ms"] = Percentile(lat, 95);
  if (!dl.empty()) run["delivery_median_ms"] = Median(dl);
  const double codec_ms = run["encode_ms"].get<double>() + run["decode_ms"].get<double>();
  run["serialization_share"] = median > 0 ? std::min(1.0, codec_ms / median) : 0;
  if (run.contains("floor_ms")) {
    const double floor_ms = run["floor_ms"].get<double>();
    run["over_floor"] = median / floor_ms;
    if (!dl.empty()) run["delivery_over_floor"] = Median(dl) / floor_ms;
  }
}

namespace fs = std::filesystem;

// The development VM's hypervisor takes back memory the guest freed
// (virtio-balloon free page reporting), and the next process to touch it
// waits for the host to fault it in again: the first backend after an idle
// spell (the iperf3 reference) moved lan Big in 121-272 ms where the same
// backend right after took 105-130 ms, whatever the backend. Touching and
// freeing about what a run allocates, just before its peers start, hands
// them pages the host has not taken back yet (docs/benchmarks.md, Method).
void WarmMemory(uint64_t bytes) {
  constexpr uint64_t kPage = 4096;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;  // only a warm-up
  auto* bytes_p = static_cast<volatile uint8_t*>(p);
  for (uint64_t i = 0; i < bytes; i += kPage) bytes_p[i] = 1;
  ::munmap(p, bytes);
}

// The options that put a TLS row on TLS: a self-signed pair for every site
// address of the environment (made once per environment, in the run's
// temporary folder), used by the grpc server and clients (mutual TLS) and by the
// embedded object server, and trusted by every party as its CA.
Result<std::map<std::string, std::string>> TlsOptionsFor(const std::string& base,
                                                         const std::string& env,
                                                         const netem::State& state,
                                                         const std::string& transport) {
  const std::string dir = base + "/tls-" + env;
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem";
  if (!fs::exists(cert)) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    std::vector<std::string> hosts = {"localhost", "127.0.0.1"};
    for (const auto& site : state.sites) hosts.push_back(site.address);
    XSILO_RETURN_IF_ERROR(GenerateSelfSignedCertificate(cert, key, hosts));
  }
  std::map<std::string, std::string> o = {
      {"tls_cert", cert}, {"tls_key", key}, {"tls_ca", cert}, {"tls_server_name", "localhost"}};
  if (transport.find("+s3") != std::string::npos) {
    o["store.tls_cert"] = cert;
    o["store.tls_key"] = key;
    o["store.ca_file"] = cert;
  }
  return o;
}

// A port below the ephemeral range, picked at random: each peer world uses
// port and (unary) port + world.
int PickPort() {
  static uint32_t state =
      static_cast<uint32_t>(getpid()) * 2654435761u ^ static_cast<uint32_t>(std::time(nullptr));
  state = state * 1664525u + 1013904223u;
  return 20000 + static_cast<int>(state % 12000);
}

}  // namespace

int RunP2p(P2pOptions a) {
  auto given = [&](const std::string& f) {
    return std::find(a.explicit_flags.begin(), a.explicit_flags.end(), f) != a.explicit_flags.end();
  };
  if (a.quick) {
    if (!given("--envs")) a.envs = "lan,ca-hk";
    if (!given("--repeats")) a.repeats = 2;
    if (!given("--scale")) a.scale = 0.5;
    if (!given("--link-seconds")) a.link_seconds = 3;
    if (!given("--broadcast-peers")) a.broadcast_peers = 2;
    if (!given("--dispatch")) a.dispatch = "1,4,16";
    if (!given("--backends")) a.backends = "grpc,grpc+s3";
  }
  const auto envs = SplitList(a.envs);
  const auto backend_names = SplitList(a.backends);
  // The backend column of the progress lines fits the longest name.
  int name_w = 12;
  for (const auto& b : backend_names) name_w = std::max(name_w, static_cast<int>(b.size()) + 1);
  const auto dispatch_envs = SplitList(a.dispatch_envs);
  std::vector<int> dispatch_points;
  for (const auto& d : SplitList(a.dispatch)) dispatch_points.push_back(std::stoi(d));
  std::map<std::string, std::map<std::string, std::string>> extra_options;
  for (const auto& o : a.backend_options) {
    const auto colon = o.find(':'), eq = o.find('=');
    if (colon == std::string::npos || eq == std::string::npos || eq < colon ||
        !FindBackend(o.substr(0, colon))) {
      std::cerr << "xsilo bench p2p: --backend-option '" << o
                << "': expected NAME:KEY=VALUE with a known backend NAME\n";
      return 2;
    }
    extra_options[o.substr(0, colon)][o.substr(colon + 1, eq - colon - 1)] = o.substr(eq + 1);
  }
  // Checked here rather than by the command line: RunP2p is also called
  // from code, and a range check lets NaN through.
  if (auto p = ParseModelPayload(a.payload); !p.ok()) {
    std::cerr << "xsilo bench p2p: --" << p.status().message() << "\n";
    return 2;
  }
  if (a.repeats < 1 || !(a.min_seconds >= 0 && a.min_seconds <= 3600)) {
    std::cerr << "xsilo bench p2p: --repeats must be at least 1 and --min-seconds in [0, 3600]\n";
    return 2;
  }
  for (const auto& c : a.skip_cells) {
    const auto parts = SplitCell(c);
    const auto envs_known = netem::Environments();
    const bool env_known =
        parts.size() >= 2 && envs_known.ok() &&
        std::find(envs_known->begin(), envs_known->end(), parts[0]) != envs_known->end();
    if (parts.size() < 2 || parts.size() > 3 || !env_known || !FindTier(parts[1]) ||
        (parts.size() == 3 && !FindBackend(parts[2]))) {
      std::cerr << "xsilo bench p2p: --skip '" << c
                << "': expected ENV:TIER or ENV:TIER:BACKEND with a known environment, tier "
                   "and backend\n";
      return 2;
    }
  }
  auto skipped_cell = [&](const std::string& env, const std::string& tier,
                          const std::string& backend) -> std::string {
    for (const auto& c : a.skip_cells) {
      const auto parts = SplitCell(c);
      if (parts[0] == env && parts[1] == tier && (parts.size() == 2 || parts[2] == backend))
        return c;
    }
    return "";
  };
  for (const auto& b : backend_names) {
    if (!FindBackend(b)) {
      std::cerr << "xsilo bench p2p: unknown backend '" << b << "' (known: " << kP2pBackends
                << ")\n";
      return 2;
    }
  }
  auto known_envs = netem::Environments();
  for (const auto& e : envs) {
    if (!known_envs.ok() ||
        std::find(known_envs->begin(), known_envs->end(), e) == known_envs->end()) {
      std::cerr << "xsilo bench p2p: unknown environment '" << e << "'\n";
      return 2;
    }
  }
  if (a.out.empty()) a.out = "results/p2p-" + UtcStamp();
  std::error_code ec;
  fs::create_directories(a.out, ec);
  if (ec) {
    std::cerr << "xsilo bench p2p: cannot create " << a.out << ": " << ec.message() << "\n";
    return 1;
  }
  char tmpl[] = "/tmp/xsilo-p2p-XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::cerr << "xsilo bench p2p: mkdtemp failed\n";
    return 1;
  }
  const std::string tmpdir = tmpl;
  StartSignalWatcher(a.prefix, tmpdir);

  json report;
  report["config"] = {{"envs", envs},
                      {"tiers", SplitList(a.tiers)},
                      {"backends", backend_names},
                      {"repeats", a.repeats},
                      {"passes", a.passes},
                      {"min_seconds", a.min_seconds},
                      {"payload", a.payload},
                      {"scale", a.scale},
                      {"quick", a.quick},
                      {"link_seconds", a.link_seconds},
                      {"broadcast_peers", a.broadcast_peers},
                      {"dispatch_points", dispatch_points},
                      {"dispatch_tier", a.dispatch_tier},
                      {"dispatch_envs", dispatch_envs},
                      {"backend_options", a.backend_options},
                      {"skip_cells", a.skip_cells},
                      {"started_utc", UtcStamp()}};
  report["links"] = json::array();
  report["runs"] = json::array();
  report["not_run"] = json::array();
  int failures = 0;
  const auto started = Clock::now();
  auto elapsed = [&] {
    return Fixed(std::chrono::duration<double>(Clock::now() - started).count(), 0) + "s";
  };

  for (const auto& env : envs) {
    netem::Options nopt;
    nopt.prefix = a.prefix;
    auto topology = netem::LoadTopology(env, env == "lan" ? 1.0 : a.scale);
    if (!topology.ok()) {
      std::cerr << "xsilo bench p2p: " << topology.status().ToString() << "\n";
      return 1;
    }
    netem::State state;
    if (topology->loopback) {
      // lan needs no emulator (and no root): every site is 127.0.0.1.
      state.topology = *topology;
      state.prefix = a.prefix;
      for (const auto& site : topology->sites) state.sites.push_back({site, "", "127.0.0.1"});
    } else {
      std::cout << "[" << elapsed() << "] " << env << ": netem up at scale " << a.scale << "\n"
                << std::flush;
      (void)netem::Down(nopt);
      SetNetemUp(true);
      Status s = netem::Up(*topology, nopt);
      if (!s.ok()) {
        std::cerr << "xsilo bench p2p: " << env << ": netem up: " << s.ToString() << "\n";
        report["not_run"].push_back({{"env", env}, {"reason", "netem up: " + s.ToString()}});
        (void)netem::Down(nopt);
        SetNetemUp(false);
        ++failures;
        continue;
      }
      auto st = netem::LoadState(nopt);
      if (!st.ok()) {
        std::cerr << "xsilo bench p2p: " << st.status().ToString() << "\n";
        (void)netem::Down(nopt);
        SetNetemUp(false);
        return 1;
      }
      state = *st;
    }
    const std::string server_addr = state.sites[0].address;
    LinkReference link = LinkOf(state);

    // (e) the physical reference: iperf3 on the same link.
    if (a.link_seconds > 0) {
      LinkMeasureOptions lo;
      lo.seconds = a.link_seconds;
      lo.port = static_cast<uint16_t>(PickPort());
      std::cout << "[" << elapsed() << "] " << env << ": iperf3 single stream and filled link ("
                << a.link_seconds << " s each)\n"
                << std::flush;
      auto measured = MeasureLink(state, lo);
      if (measured.ok() && measured->measured) {
        link = *measured;
      } else {
        std::cerr << "  link check failed: "
                  << (measured.ok() ? "no rows" : measured.status().ToString()) << "\n";
      }
    }
    report["links"].push_back({{"env", env},
                               {"scale", topology->loopback ? 1.0 : a.scale},
                               {"measured", link.measured},
                               {"rtt_ms", link.rtt_ms},
                               {"single_MBps", link.single_MBps},
                               {"multi_MBps", link.multi_MBps},
                               {"streams", link.streams},
                               {"target_rtt_ms", link.target.rtt_ms},
                               {"target_single_MBps", link.target.single_MBps},
                               {"target_multi_MBps", link.target.multi_MBps}});
    if (link.measured)
      std::cout << "  link: RTT " << Fixed(link.rtt_ms, 2) << " ms, 1 stream "
                << Fixed(link.single_MBps, 1) << " MB/s, " << link.streams << " streams "
                << Fixed(link.multi_MBps, 1) << " MB/s\n";

    // Rate used to size timeouts: the slowest plausible one.
    double slow_MBps = link.measured ? link.single_MBps : link.target.single_MBps;
    if (topology->loopback || slow_MBps <= 0) slow_MBps = 50;

    for (const auto& tier_name : SplitList(a.tiers)) {
      if (a.quick && !given("--tiers") && tier_name != "small" && tier_name != "medium" &&
          !(tier_name == "big" && topology->loopback))
        continue;
      auto tier = FindTier(tier_name);
      if (!tier) {
        std::cerr << "xsilo bench p2p: unknown tier '" << tier_name << "'\n";
        return 2;
      }
      const uint64_t bytes = tier->parameters * 4;
      // Where each backend's run of this cell sits in report["runs"] (the
      // first pass's; later passes add their samples to it).
      std::map<std::string, size_t> cell_runs;
      // Backends whose first pass failed: their failure is the cell's row,
      // and they get no further passes.
      std::set<std::string> cell_failed;
      // Pass p starts at the p-th backend (mod their count), so that no
      // backend always runs last (or first) in its cell: a pass's state of
      // the machine (the page cache and free memory the earlier runs left,
      // a slow spell setting in) falls on every position alike.
      for (int pass = 0; pass < a.passes; ++pass)
        for (size_t i = 0; i < backend_names.size(); ++i) {
          const std::string& bname =
              backend_names[(i + static_cast<size_t>(pass)) % backend_names.size()];
          if (cell_failed.count(bname)) continue;
          const BackendSpec& b = *FindBackend(bname);
          auto skip = [&](const std::string& reason) {
            if (pass > 0) return;  // recorded once
            report["not_run"].push_back(
                {{"env", env}, {"tier", tier_name}, {"backend", bname}, {"reason", reason}});
            std::cout << "  " << std::left << std::setw(name_w) << bname << std::setw(8)
                      << tier_name << "not run: " << reason << "\n";
          };
          if (const std::string c = skipped_cell(env, tier_name, bname); !c.empty()) {
            skip("left out (--skip " + c + ")");
            continue;
          }
          if (b.needs_mpirun && !topology->loopback) {
            skip(
                "MPI ranks inside netem sites need mpirun with scripts/netns-rsh "
                "(docs/transport-mpi.md); not wired into bench p2p yet (lan only)");
            continue;
          }
          if (b.needs_mpirun && std::system("command -v mpirun >/dev/null 2>&1") != 0) {
            skip("mpirun (Open MPI) not on PATH");
            continue;
          }
          if (b.loopback_only && !topology->loopback) {
            skip(
                "grpc mode=unary dials every rank at the server's host (port + rank); ranks "
                "in separate sites are unreachable");
            continue;
          }
          // MPI's viability is the launcher's; checked above.
          Status viable =
              b.needs_mpirun ? Status::OK() : TransportRegistry::Global().Viable(b.transport);
          if (!viable.ok()) {
            skip(viable.ToString());
            continue;
          }
          std::cout << "[" << elapsed() << "] " << env << " " << tier_name << " " << bname
                    << (a.passes > 1 ? " (pass " + std::to_string(pass + 1) + ")" : "") << " ...\n"
                    << std::flush;
          const bool dispatch_here =
              pass == 0 && tier_name == a.dispatch_tier &&
              std::find(dispatch_envs.begin(), dispatch_envs.end(), env) != dispatch_envs.end();
          // --quick measures (b) on the small tier only.
          const bool conc_here =
              pass == 0 && !a.no_concurrency && !(a.quick && tier_name != "small");
          const int conc = conc_here ? (tier_name == "large" ? 5 : 10) : 0;
          PeerSpec spec;
          spec.world = 2 + std::max(0, a.broadcast_peers - 1);
          spec.address = server_addr + ":" + std::to_string(PickPort());
          spec.transport = b.transport;
          spec.options = b.options;
          if (b.tls) {
            auto tls = TlsOptionsFor(tmpdir, env, state, b.transport);
            if (!tls.ok()) {
              std::cerr << "xsilo bench p2p: " << bname << ": " << tls.status().ToString() << "\n";
              return 1;
            }
            for (const auto& [k, v] : *tls) spec.options[k] = v;
          }
          if (!b.endpoint.empty()) {
            // The relay listens in the server site, with the environment's
            // self-signed pair (made for every site address, as for TLS rows).
            auto pair = TlsOptionsFor(tmpdir, env, state, "grpc");
            if (!pair.ok()) {
              std::cerr << "xsilo bench p2p: " << bname << ": " << pair.status().ToString() << "\n";
              return 1;
            }
            std::string relay_port;
            do {
              relay_port = std::to_string(PickPort());
            } while (spec.address.ends_with(":" + relay_port));
            spec.endpoint = b.endpoint;
            spec.relay = server_addr + ":" + relay_port;
            spec.relay_cert = pair->at("tls_cert");
            spec.relay_key = pair->at("tls_key");
          }
          for (const auto& [k, v] : extra_options[bname]) spec.options[k] = v;
          spec.prefix = topology->loopback ? "" : a.prefix;
          spec.parameters = tier->parameters;
          spec.payload = a.payload;
          spec.repeats = a.repeats;
          spec.min_seconds = a.min_seconds;
          spec.concurrent = conc;
          if (dispatch_here) spec.dispatch_points = dispatch_points;
          spec.broadcast = pass == 0 && a.broadcast_peers > 1;
          spec.serializes = b.serializes;
          spec.timeout_s = 120 + 4.0 * static_cast<double>(bytes) / (slow_MBps * 1e6);
          spec.result = tmpdir + "/result.json";
          fs::remove(spec.result, ec);
          fs::remove(EndpointStatusFile(spec.result, 1), ec);
          // The peers' stderr, kept with the results.
          fs::create_directories(a.out + "/logs", ec);
          const std::string log = a.out + "/logs/" + env + "-" + tier_name + "-" + bname +
                                  (pass > 0 ? "-pass" + std::to_string(pass + 1) : "") + ".log";
          fs::remove(log, ec);
          // The sender's model, the receiver's copy, and as much again for
          // the kernel's and the transport's buffers; at most 4 GiB.
          WarmMemory(std::min<uint64_t>(3 * bytes + (256ull << 20), 4ull << 30));
          const auto run_started = Clock::now();
          std::vector<pid_t> pids;
          Status spawn_status;
          if (b.needs_mpirun) {
            PeerSpec p = spec;
            p.role = "sender";  // each rank takes its own from OMPI_COMM_WORLD_RANK
            auto pid = SpawnMpiPeers(p, log);
            if (pid.ok())
              pids.push_back(*pid);
            else
              spawn_status = pid.status();
          }
          for (int r = 0; r < spec.world && spawn_status.ok() && !b.needs_mpirun; ++r) {
            PeerSpec p = spec;
            p.rank = r;
            p.role = r == 0 ? "sender" : "receiver";
            p.site = topology->loopback ? "" : (r == 0 ? "server" : "client1");
            auto pid = SpawnPeer(p, log);
            if (!pid.ok()) {
              spawn_status = pid.status();
              break;
            }
            pids.push_back(*pid);
            if (r == 0) {
              // Receivers dial only once the sender listens: a refused first
              // connection would put gRPC's reconnect backoff (seconds to a
              // minute) into the measurement's setup.
              const int port = std::stoi(spec.address.substr(spec.address.rfind(':') + 1));
              const auto until = Clock::now() + std::chrono::seconds(60);
              while (!netem::Listening(*pid, static_cast<uint16_t>(port)) && Clock::now() < until &&
                     !Exited(*pid))
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
          }
          // Whole-run budget: every message the sender sends, at the slow rate, x4.
          double messages = 1 + a.repeats + 2.0 * conc + spec.world;
          for (int n : spec.dispatch_points) messages += n;
          const double budget_s = 300 +
                                  4.0 * messages * static_cast<double>(bytes) / (slow_MBps * 1e6) +
                                  4.0 * a.min_seconds;
          bool timed_out = false, orphaned = false;
          int failed = WaitPeers(pids, Clock::now() + Seconds(budget_s), &timed_out,
                                 std::chrono::seconds(90), &orphaned);
          ParkIfStopping();
          json run = {{"env", env},
                      {"tier", tier_name},
                      {"backend", bname},
                      {"transport", b.transport},
                      {"options", spec.options},
                      {"bytes", bytes},
                      {"parameters", tier->parameters}};
          json result;
          {
            std::ifstream in(spec.result);
            if (in) {
              try {
                in >> result;
              } catch (...) {
              }
            }
          }
          std::string error;
          if (!spawn_status.ok()) error = spawn_status.ToString();
          if (timed_out) error = "timed out after " + Fixed(budget_s, 0) + " s";
          if (orphaned && error.empty())
            error = "receiver(s) still running 90 s after the sender exited (killed)";
          if (error.empty() && result.is_object() && !result.value("ok", false))
            error = result.value("error", "sender failed");
          if (error.empty() && (failed > 0 || !result.is_object()))
            error = std::to_string(failed) + " peer process(es) failed";
          if (!error.empty()) {
            std::ifstream in(log);
            std::stringstream tail;
            tail << in.rdbuf();
            std::string t = tail.str();
            if (t.size() > 2000) t = t.substr(t.size() - 2000);
            run["error"] = error;
            run["peer_log_tail"] = t;
            std::cout << "  FAILED: " << error << "\n" << t << "\n";
            ++failures;
            if (auto it = cell_runs.find(bname); it != cell_runs.end()) {
              // A later pass failed: the run keeps the passes that worked
              // and says which one did not.
              report["runs"][it->second]["failed_passes"].push_back(
                  {{"pass", pass + 1}, {"error", error}, {"peer_log_tail", t}});
            } else {
              cell_failed.insert(bname);
              report["runs"].push_back(run);
            }
            continue;
          }
          std::vector<double> lat = result.value("latency_ms", std::vector<double>{});
          std::vector<double> dl = result.value("delivery_ms", std::vector<double>{});
          const double pass_median = Median(lat);
          if (auto it = cell_runs.find(bname); it != cell_runs.end()) {
            // A later pass: its samples join the first pass's run.
            json& first = report["runs"][it->second];
            for (double v : lat) first["latency_ms"].push_back(v);
            if (first.contains("delivery_ms"))
              for (double v : dl) first["delivery_ms"].push_back(v);
            first["pass_medians_ms"].push_back(pass_median);
            first["wall_s"] = first["wall_s"].get<double>() +
                              std::chrono::duration<double>(Clock::now() - run_started).count();
            if (result.contains("route")) first["route"] = result["route"];
            SetLatencyFigures(first);
            std::cout << "  " << std::left << std::setw(name_w) << bname << std::setw(8)
                      << tier_name << std::right << " pass " << pass + 1 << ": latency "
                      << Fixed(pass_median, 1) << " ms; all passes "
                      << Fixed(first["latency_median_ms"].get<double>(), 1) << " ms\n"
                      << std::flush;
            continue;
          }
          run["latency_ms"] = lat;
          run["pass_medians_ms"] = json::array({pass_median});
          if (!dl.empty()) run["delivery_ms"] = dl;
          if (result.contains("concurrency")) run["concurrency"] = result["concurrency"];
          if (result.contains("route")) run["route"] = result["route"];  // auto+s3's last choice
          if (!b.endpoint.empty()) {
            // Each side's endpoint at the end: the objects it still holds,
            // and (the receiver's) the path its remote calls took.
            run["endpoint"] = b.endpoint;
            json receiver;
            try {
              std::ifstream in(EndpointStatusFile(spec.result, 1));
              if (in) in >> receiver;
            } catch (...) {
            }
            run["endpoint_status"] = {{"sender", result.value("endpoint_status", json())},
                                      {"receiver1", receiver}};
          }
          run["dispatch"] = result.value("dispatch", json::array());
          if (result.contains("broadcast")) run["broadcast"] = result["broadcast"];
          run["phases_s"] = result.value("phases_s", json::object());
          run["wall_s"] = std::chrono::duration<double>(Clock::now() - run_started).count();
          run["encode_ms"] = result.value("encode_ms", 0.0);
          run["decode_ms"] = result.value("decode_ms", 0.0);
          run["serializes"] = b.serializes;
          if (link.measured && link.multi_MBps > 0) run["floor_ms"] = FloorMs(link, bytes);
          SetLatencyFigures(run);
          std::cout << "  " << std::left << std::setw(name_w) << bname << std::setw(8) << tier_name
                    << std::right << " latency " << Fixed(run["latency_median_ms"].get<double>(), 1)
                    << " ms (p95 " << Fixed(run["latency_p95_ms"].get<double>(), 1) << ")";
          if (!dl.empty())
            std::cout << ", delivered " << Fixed(run["delivery_median_ms"].get<double>(), 1)
                      << " ms";
          if (run.contains("floor_ms"))
            std::cout << ", floor " << Fixed(run["floor_ms"].get<double>(), 1) << " ms";
          if (run.contains("concurrency"))
            std::cout << ", speedup x" << Fixed(run["concurrency"]["speedup"].get<double>(), 2);
          if (run.contains("broadcast"))
            std::cout << ", bcast peak "
                      << Fixed(run["broadcast"]["peak_bytes"].get<double>() / 1e6, 0) << " MB";
          std::cout << ", codec " << Fixed(100 * run["serialization_share"].get<double>(), 0)
                    << "%\n"
                    << std::flush;
          cell_runs[bname] = report["runs"].size();
          report["runs"].push_back(run);
        }
    }
    if (!topology->loopback) {
      Status s = netem::Down(nopt);
      SetNetemUp(false);
      if (!s.ok()) std::cerr << "xsilo bench p2p: netem down: " << s.ToString() << "\n";
    }
  }
  fs::remove_all(tmpdir, ec);

  report["failures"] = failures;
  WriteP2pFiles(report, a.out);
  PrintP2pSummary(report);
  std::cout << "wrote " << a.out << "/{p2p.json,p2p.csv,dispatch.csv,links.csv}; " << failures
            << " failure(s); " << elapsed() << "\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace xsilo::bench
