// Soak: a long FedAvg job over one transport, watching every process's
// memory and open descriptors round by round.
//
//   soak [--backend grpc+s3] [--tier small] [--clients 7] [--rounds 100]
//        [--local-steps 2] [--from-round 10] [--max-rss-growth 0.05]
//        [--option key=value]... [--json soak.json]
//
// This process is the server (rank 0); each client is this program re-run
// as a child process with the built-in MLP trainer on its synthetic shard.
// After every round the server samples VmRSS and the number of open file
// descriptors (/proc/<pid>/fd) of itself, of every client, and of any
// other child process the transport started (the embedded S3 server of
// grpc+s3). --option sets a backend option for every party, e.g.
// threshold=always to send the Small model (4.8 MB, under grpc+s3's 10 MiB
// default threshold) through the object store. It prints the samples every 10 rounds and writes all
// of them as JSON. It fails (exit 1) if any process's RSS grows by more than
// --max-rss-growth between round --from-round and the last round, if any
// process's descriptor count grows over the same span, or if a round
// misses its quorum.
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
  double max_rss_growth = 0.05;
  std::string json = "soak.json";
  std::map<std::string, std::string> options;  // --option key=value, for every party
};

using bench::ChildPids;
using bench::FreeLoopbackPort;

uint64_t RssBytes(pid_t pid) { return bench::StatusBytes(std::to_string(pid), "VmRSS"); }

int OpenFds(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

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
  uint64_t server_buffer_bytes = 0;  // xsilo Buffers alive in the server
  std::map<std::string, uint64_t> rss;
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
    else if (k == "--max-rss-growth")
      a.max_rss_growth = std::stod(v);
    else if (k == "--json")
      a.json = v;
    else if (k == "--option" && v.find('=') != std::string::npos)
      a.options[v.substr(0, v.find('='))] = v.substr(v.find('=') + 1);
    else
      return Usage(("unknown option " + k).c_str());
  }
  if (a.clients < 1 || a.rounds < 2 || a.from_round < 1 || a.from_round >= a.rounds) {
    return Usage("need --clients >= 1 and 1 <= --from-round < --rounds");
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

  std::vector<Sample> samples;
  int below_quorum = 0;
  ServerOptions so;
  so.rounds = static_cast<uint64_t>(a.rounds);
  so.local_work = LocalWork{0, a.local_steps};
  so.round_deadline = std::chrono::seconds(300);
  so.on_round = [&](const RoundReport& r) {
    if (!r.completed) ++below_quorum;
    Sample s;
    s.round = static_cast<int>(r.round) + 1;
    s.server_buffer_bytes = Buffer::LiveAllocatedBytes();
    for (const auto& [pid, name] : names) {
      s.rss[name] = RssBytes(pid);
      s.fds[name] = OpenFds(pid);
    }
    samples.push_back(std::move(s));
    if (samples.back().round % 10 == 0 || samples.back().round == 1) {
      std::printf("round %3d: server buffers %.1fMB", samples.back().round,
                  static_cast<double>(samples.back().server_buffer_bytes) / 1e6);
      for (const auto& [name, rss] : samples.back().rss) {
        std::printf("  %s %.1fMB/%dfd", name.c_str(), static_cast<double>(rss) / 1e6,
                    samples.back().fds[name]);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  FedAvgServer fed(**server, so);
  auto job = fed.Run(std::move(initial).value());
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

  // Growth between round from_round and the last round.
  const Sample* from = nullptr;
  for (const Sample& s : samples) {
    if (s.round == a.from_round) from = &s;
  }
  const Sample& last = samples.back();
  bool failed = client_failures > 0 || below_quorum > 0 || from == nullptr;
  std::printf("\n%-16s %12s %12s %9s %8s %8s\n", "process", "rss_from_MB", "rss_last_MB", "growth",
              "fds_from", "fds_last");
  std::ofstream out(a.json);
  out << "{\"benchmark\": \"soak\", \"backend\": \"" << a.backend << "\", \"tier\": \"" << a.tier
      << "\", \"clients\": " << a.clients << ", \"rounds\": " << a.rounds
      << ", \"from_round\": " << a.from_round << ", \"seconds\": " << seconds
      << ", \"client_failures\": " << client_failures
      << ", \"rounds_below_quorum\": " << below_quorum << ", \"growth\": {";
  bool first = true;
  for (const auto& [name, rss_last] : last.rss) {
    const uint64_t rss_from = from ? from->rss.at(name) : 0;
    const int fds_from = from ? from->fds.at(name) : 0;
    const int fds_last = last.fds.at(name);
    const double growth =
        rss_from ? (static_cast<double>(rss_last) - static_cast<double>(rss_from)) / rss_from : 0;
    const bool bad = growth > a.max_rss_growth || fds_last > fds_from;
    failed = failed || bad;
    std::printf("%-16s %12.1f %12.1f %8.2f%% %8d %8d%s\n", name.c_str(), rss_from / 1e6,
                rss_last / 1e6, growth * 100, fds_from, fds_last, bad ? "  FAIL" : "");
    out << (first ? "" : ", ") << "\"" << name << "\": {\"rss_from\": " << rss_from
        << ", \"rss_last\": " << rss_last << ", \"rss_growth\": " << growth
        << ", \"fds_from\": " << fds_from << ", \"fds_last\": " << fds_last << "}";
    first = false;
  }
  out << "}, \"samples\": [";
  for (size_t i = 0; i < samples.size(); ++i) {
    out << (i ? ", " : "") << "{\"round\": " << samples[i].round
        << ", \"server_buffer_bytes\": " << samples[i].server_buffer_bytes << ", \"rss\": {";
    bool f2 = true;
    for (const auto& [name, rss] : samples[i].rss) {
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
