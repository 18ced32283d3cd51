// Soak: a long FedAvg job over one transport, watching every process's
// memory and open descriptors round by round.
//
//   soak [--backend grpc+s3] [--tier small] [--clients 7] [--rounds 100]
//        [--local-steps 2] [--from-round 10] [--window 10] [--max-rss-growth 0.05]
//        [--option key=value]... [--json soak.json]
//
// This process is the server (rank 0); each client is this program re-run
// as a child process with the built-in MLP trainer on its synthetic shard.
// After every round the server samples VmRSS, the round's peak VmRSS
// (VmHWM, reset after each sample) and the number of open file
// descriptors (/proc/<pid>/fd) of itself, of every client, and of any
// other child process the transport started (the embedded S3 server of
// grpc+s3). --option sets a backend option for every party, e.g.
// threshold=always to send the Small model (4.8 MB, under grpc+s3's 10 MiB
// default threshold) through the object store. It prints the samples every 10 rounds and writes all
// of them as JSON. It fails (exit 1) if any process's RSS grows by more than
// --max-rss-growth between round --from-round and the last round (each the
// median over --window rounds: from round --from-round on, and up to the
// last round), if any
// process's descriptor count grows over the same span, or if a round
// misses its quorum.
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "xsilo/bench/process.h"
#include "xsilo/fl/fedavg.h"
#include "xsilo/fl/mlp.h"
#include "xsilo/fl/synthetic.h"
#include "xsilo/transport/registry.h"

namespace {

using namespace xsilo;
using namespace xsilo::fl;

struct Args {
  std::string backend = "grpc+s3";
  std::string tier = "small";
  int clients = 7;
  int rounds = 100;
  uint64_t local_steps = 2;
  int from_round = 10;
  int window = 10;  // rounds whose median RSS stands for each end
  double max_rss_growth = 0.05;
  std::string json = "soak.json";
  std::map<std::string, std::string> options;  // --option key=value, for every party
};

using bench::ChildPids;
using bench::FreeLoopbackPort;

uint64_t RssBytes(pid_t pid) { return bench::StatusBytes(std::to_string(pid), "VmRSS"); }

// The process's peak RSS since the last call (VmHWM, then reset to the
// current RSS through clear_refs), so each round has the OS's own peak.
uint64_t TakeRoundPeakBytes(pid_t pid) {
  const uint64_t peak = bench::StatusBytes(std::to_string(pid), "VmHWM");
  if (!bench::ResetPeakRss(std::to_string(pid))) {
    static bool warned = false;
    if (!warned) {
      std::fprintf(stderr,
                   "soak: cannot reset the peak RSS of pid %d (clear_refs): the round peaks are "
                   "peaks since the process started\n",
                   static_cast<int>(pid));
      warned = true;
    }
  }
  return peak;
}

int OpenFds(pid_t pid) { return bench::OpenFds(std::to_string(pid)); }

TransportOptions Options(const std::string& address, int rank, int world,
                         const std::map<std::string, std::string>& backend) {
  TransportOptions o;
  o.backend = backend;
  o.rank = rank;
  o.world_size = world;
  o.address = address;
  o.connect_timeout = std::chrono::seconds(120);
  return o;
}

int RunClient(const std::string& backend, const std::string& tier, const std::string& address,
              int rank, int world, const std::map<std::string, std::string>& options) {
  auto shape = MlpShapeForTier(tier);
  if (!shape.ok()) return 2;
  SyntheticOptions data;
  auto shard = GenerateSyntheticShard(data, static_cast<uint32_t>(rank - 1));
  if (!shard.ok()) return 2;
  MlpOptions m;
  m.shape = *shape;
  m.seed = 1 + static_cast<uint64_t>(rank);
  auto trainer = MakeMlpTrainer(m, std::move(shard).value());
  if (!trainer.ok()) return 2;
  auto t = TransportRegistry::Global().Create(backend, Options(address, rank, world, options));
  if (!t.ok() || !(*t)->Start().ok()) return 3;
  ClientOptions co;
  co.idle_timeout = std::chrono::minutes(10);
  FedAvgClient client(**t, **trainer, co);
  auto report = client.Run();
  (*t)->Stop();
  if (!report.ok()) {
    std::fprintf(stderr, "soak client %d: %s\n", rank, report.status().ToString().c_str());
    return 4;
  }
  return report->finished ? 0 : 5;
}

struct Sample {
  int round;
  uint64_t server_buffer_bytes = 0;          // xsilo Buffers alive in the server
  uint64_t server_malloc_bytes = 0;          // bytes malloc has handed out and not got back
  std::map<std::string, uint64_t> rss;       // VmRSS when the round ended
  std::map<std::string, uint64_t> rss_peak;  // the peak VmRSS during the round (VmHWM)
  std::map<std::string, int> fds;
};

int Usage(const char* why) {
  std::fprintf(stderr, "soak: %s\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* spec = std::getenv("XSILO_SOAK_CLIENT")) {
    // backend|tier|address|rank|world[|key=value...]
    std::vector<std::string> f;
    std::stringstream in(spec);
    for (std::string part; std::getline(in, part, '|');) f.push_back(part);
    if (f.size() < 5) return 2;
    std::map<std::string, std::string> options;
    for (size_t i = 5; i < f.size(); ++i) {
      auto eq = f[i].find('=');
      if (eq == std::string::npos) return 2;
      options[f[i].substr(0, eq)] = f[i].substr(eq + 1);
    }
    return RunClient(f[0], f[1], f[2], std::stoi(f[3]), std::stoi(f[4]), options);
  }

  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) return Usage(("missing value for " + k).c_str());
    std::string v = argv[++i];
    if (k == "--backend")
      a.backend = v;
    else if (k == "--tier")
      a.tier = v;
    else if (k == "--clients")
      a.clients = std::stoi(v);
    else if (k == "--rounds")
      a.rounds = std::stoi(v);
    else if (k == "--local-steps")
      a.local_steps = std::stoull(v);
    else if (k == "--from-round")
      a.from_round = std::stoi(v);
    else if (k == "--window")
      a.window = std::stoi(v);
    else if (k == "--max-rss-growth")
      a.max_rss_growth = std::stod(v);
    else if (k == "--json")
      a.json = v;
    else if (k == "--option" && v.find('=') != std::string::npos)
      a.options[v.substr(0, v.find('='))] = v.substr(v.find('=') + 1);
    else
      return Usage(("unknown option " + k).c_str());
  }
  if (a.clients < 1 || a.rounds < 2 || a.from_round < 1 || a.from_round >= a.rounds ||
      a.window < 1) {
    return Usage("need --clients >= 1, 1 <= --from-round < --rounds and --window >= 1");
  }

  const int world = a.clients + 1;
  const std::string address = "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  auto shape = MlpShapeForTier(a.tier);
  if (!shape.ok()) return Usage(shape.status().ToString().c_str());
  auto initial = MlpInitialParameters(*shape, 1);
  if (!initial.ok()) return Usage(initial.status().ToString().c_str());
  auto server =
      TransportRegistry::Global().Create(a.backend, Options(address, 0, world, a.options));
  if (!server.ok()) return Usage(server.status().ToString().c_str());
  if (Status s = (*server)->Start(); !s.ok()) return Usage(s.ToString().c_str());

  std::map<pid_t, std::string> names = {{getpid(), "server"}};
  std::set<pid_t> helpers_before;
  for (pid_t p : ChildPids()) helpers_before.insert(p);  // the transport's own (embedded S3)
  for (pid_t p : helpers_before) names[p] = "helper-" + std::to_string(p);
  std::vector<pid_t> clients;
  for (int r = 1; r <= a.clients; ++r) {
    std::string spec = a.backend + "|" + a.tier + "|" + address + "|" + std::to_string(r) + "|" +
                       std::to_string(world);
    for (const auto& [k, v] : a.options) spec += "|" + k + "=" + v;
    const pid_t pid = bench::SpawnSelfWithEnv("XSILO_SOAK_CLIENT=" + spec);
    if (pid < 0) return Usage("cannot start a client process");
    clients.push_back(pid);
    names[pid] = "client-" + std::to_string(r);
  }

  // Every sample exists before the job starts, each map holding every
  // process already, so that taking a sample leaves nothing allocated in
  // this process (the server), whose own heap is being measured (reading
  // /proc allocates a few short-lived strings and streams, freed at once).
  Sample blank;
  for (const auto& [pid, name] : names) {
    blank.rss[name] = 0;
    blank.rss_peak[name] = 0;
    blank.fds[name] = 0;
  }
  std::vector<Sample> samples(static_cast<size_t>(a.rounds), blank);
  size_t taken = 0;
  int below_quorum = 0;
  ServerOptions so;
  so.rounds = static_cast<uint64_t>(a.rounds);
  so.local_work = LocalWork{0, a.local_steps};
  so.round_deadline = std::chrono::seconds(300);
  so.on_round = [&](const RoundReport& r) {
    if (!r.completed) ++below_quorum;
    if (taken == samples.size()) return;
    Sample& s = samples[taken++];
    s.round = static_cast<int>(r.round) + 1;
    s.server_buffer_bytes = Buffer::LiveAllocatedBytes();
    const struct mallinfo2 mi = mallinfo2();
    s.server_malloc_bytes = mi.uordblks + mi.hblkhd;
    for (const auto& [pid, name] : names) {
      s.rss[name] = RssBytes(pid);
      s.rss_peak[name] = TakeRoundPeakBytes(pid);
      s.fds[name] = OpenFds(pid);
    }
    if (s.round % 10 == 0 || s.round == 1) {
      std::printf("round %3d (RSS now/round peak): server buffers %.1fMB malloc %.2fMB", s.round,
                  static_cast<double>(s.server_buffer_bytes) / 1e6,
                  static_cast<double>(s.server_malloc_bytes) / 1e6);
      for (const auto& [name, rss] : s.rss) {
        std::printf("  %s %.1f/%.1fMB/%dfd", name.c_str(), static_cast<double>(rss) / 1e6,
                    static_cast<double>(s.rss_peak[name]) / 1e6, s.fds[name]);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  FedAvgServer fed(**server, so);
  auto job = fed.Run(std::move(initial).value());
  samples.resize(taken);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int client_failures = 0;
  for (pid_t pid : clients) {
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++client_failures;
  }
  (*server)->Stop();
  if (!job.ok()) {
    std::fprintf(stderr, "soak: job failed: %s\n", job.status().ToString().c_str());
    return 1;
  }
  if (samples.empty()) return Usage("the job finished without a round");

  // Growth between round from_round and the last round. A process's RSS
  // when a round ends moves by a few MB with whether that round's buffers
  // were released yet, so each end is the median over a window of rounds
  // (--window, from round from_round on and up to the last round); the
  // single samples of those two rounds and each window's highest round
  // peak (VmHWM) are reported beside it.
  // The two windows never share a round.
  const int window = std::max(1, std::min(a.window, (a.rounds - a.from_round + 1) / 2));
  std::vector<const Sample*> head, tail;
  for (const Sample& s : samples) {
    if (s.round >= a.from_round && s.round < a.from_round + window) head.push_back(&s);
    if (s.round > samples.back().round - window) tail.push_back(&s);
  }
  auto median = [](std::vector<const Sample*> w, const std::string& name) -> uint64_t {
    if (w.empty()) return 0;
    std::vector<uint64_t> v;
    for (const Sample* s : w) v.push_back(s->rss.at(name));
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  auto highest_peak = [](const std::vector<const Sample*>& w, const std::string& name) {
    uint64_t m = 0;
    for (const Sample* s : w) m = std::max(m, s->rss_peak.at(name));
    return m;
  };
  auto growth_of = [](uint64_t from_bytes, uint64_t last_bytes) {
    return from_bytes ? (static_cast<double>(last_bytes) - static_cast<double>(from_bytes)) /
                            static_cast<double>(from_bytes)
                      : 0.0;
  };
  const Sample* from = head.empty() ? nullptr : head.front();
  const Sample& last = samples.back();
  bool failed = client_failures > 0 || below_quorum > 0 || from == nullptr;
  std::printf(
      "\nRSS in MB: rounds %d-%d against %d-%d (median; growth is what must stay "
      "under %.0f%%), the single samples of rounds %d and %d, each window's highest "
      "round peak\n",
      a.from_round, a.from_round + window - 1, last.round - window + 1, last.round,
      a.max_rss_growth * 100, a.from_round, last.round);
  std::printf("%-14s %8s %8s %8s | %8s %8s %8s | %8s %8s %8s | %4s %4s\n", "process", "median",
              "median", "growth", "single", "single", "growth", "peak", "peak", "growth", "fds",
              "fds");
  std::ofstream out(a.json);
  out << "{\"benchmark\": \"soak\", \"backend\": \"" << a.backend << "\", \"tier\": \"" << a.tier
      << "\", \"clients\": " << a.clients << ", \"rounds\": " << a.rounds
      << ", \"from_round\": " << a.from_round << ", \"window\": " << window
      << ", \"seconds\": " << seconds << ", \"client_failures\": " << client_failures
      << ", \"rounds_below_quorum\": " << below_quorum << ", \"growth\": {";
  bool first = true;
  for (const auto& [name, rss_last] : last.rss) {
    const uint64_t med_from = median(head, name), med_last = median(tail, name);
    const uint64_t rss_from = from ? from->rss.at(name) : 0;
    const uint64_t peak_from = highest_peak(head, name), peak_last = highest_peak(tail, name);
    const int fds_from = from ? from->fds.at(name) : 0;
    const int fds_last = last.fds.at(name);
    const double growth = growth_of(med_from, med_last);
    const bool bad = growth > a.max_rss_growth || fds_last > fds_from;
    failed = failed || bad;
    std::printf(
        "%-14s %8.1f %8.1f %7.2f%% | %8.1f %8.1f %7.2f%% | %8.1f %8.1f %7.2f%% | %4d %4d%s\n",
        name.c_str(), med_from / 1e6, med_last / 1e6, growth * 100, rss_from / 1e6, rss_last / 1e6,
        growth_of(rss_from, rss_last) * 100, peak_from / 1e6, peak_last / 1e6,
        growth_of(peak_from, peak_last) * 100, fds_from, fds_last, bad ? "  FAIL" : "");
    out << (first ? "" : ", ") << "\"" << name << "\": {\"rss_median_from\": " << med_from
        << ", \"rss_median_last\": " << med_last << ", \"rss_growth\": " << growth
        << ", \"rss_from\": " << rss_from << ", \"rss_last\": " << rss_last
        << ", \"rss_single_growth\": " << growth_of(rss_from, rss_last)
        << ", \"rss_peak_from\": " << peak_from << ", \"rss_peak_last\": " << peak_last
        << ", \"fds_from\": " << fds_from << ", \"fds_last\": " << fds_last << "}";
    first = false;
  }
  out << "}, \"samples\": [";
  for (size_t i = 0; i < samples.size(); ++i) {
    out << (i ? ", " : "") << "{\"round\": " << samples[i].round
        << ", \"server_buffer_bytes\": " << samples[i].server_buffer_bytes
        << ", \"server_malloc_bytes\": " << samples[i].server_malloc_bytes << ", \"rss\": {";
    bool f2 = true;
    for (const auto& [name, rss] : samples[i].rss) {
      out << (f2 ? "" : ", ") << "\"" << name << "\": " << rss;
      f2 = false;
    }
    out << "}, \"rss_peak\": {";
    f2 = true;
    for (const auto& [name, rss] : samples[i].rss_peak) {
      out << (f2 ? "" : ", ") << "\"" << name << "\": " << rss;
      f2 = false;
    }
    out << "}, \"fds\": {";
    f2 = true;
    for (const auto& [name, fds] : samples[i].fds) {
      out << (f2 ? "" : ", ") << "\"" << name << "\": " << fds;
      f2 = false;
    }
    out << "}}";
  }
  out << "], \"failed\": " << (failed ? "true" : "false") << "}\n";
  std::printf("%d rounds in %.1f s; %d rounds below quorum; %d client processes failed\n", a.rounds,
              seconds, below_quorum, client_failures);
  std::printf("wrote %s: %s\n", a.json.c_str(), failed ? "FAILED" : "ok");
  return failed ? 1 : 0;
}
