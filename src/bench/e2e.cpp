#include "xsilo/bench/e2e.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "xsilo/bench/process.h"
#include "xsilo/bench/report.h"
#include "xsilo/core/cpus.h"
#include "xsilo/netem/netem.h"

namespace xsilo::bench {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
namespace fs = std::filesystem;

struct E2eBackend {
  std::string name, transport;
  std::map<std::string, std::string> options;
};

// Backends `fl server` / `fl client` can run as independent processes (the
// MPI transports need mpirun to launch their ranks: not part of this run).
const std::vector<E2eBackend>& E2eBackends() {
  static const std::vector<E2eBackend> kAll = {
      {"grpc", "grpc", {}},  // streams=1: the paper's baseline
      {"grpc-s4", "grpc", {{"streams", "4"}}},
      {"grpc-unary", "grpc", {{"mode", "unary"}}},
      {"grpc+s3", "grpc+s3", {}},  // embedded S3 server in the server's process tree
      {"auto+s3", "auto+s3", {}},  // the same, inline or the store per message by the link
      {"tensorpipe", "tensorpipe", {}},
  };
  return kAll;
}

std::string Quote(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return q + "\"";
}

// Starts `argv` as a child process, inside netem site `site` unless the
// state is loopback, with stdout and stderr appended to `log`.
pid_t Spawn(const std::vector<std::string>& argv, const netem::State* state, int site,
            const std::string& log) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: only async-signal-safe work until exec, plus the namespace switch.
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
  }
  int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null >= 0) dup2(null, 0);
  setpgid(0, 0);
  if (state != nullptr && !state->topology.loopback) {
    if (!netem::EnterSite(*state, site).ok()) _exit(126);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

// A party's log in a run's folder: rank 0 is the server.
fs::path PartyLog(const fs::path& dir, int rank) {
  return dir / (rank == 0 ? std::string("server.log") : "client" + std::to_string(rank) + ".log");
}

// What the operating system counted for one party's process (and the
// children it waited for), from wait4.
struct PartyUsage {
  double cpu_s = 0;           // user + system
  int64_t max_rss_bytes = 0;  // peak resident set
};

PartyUsage UsageOf(const rusage& ru) {
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return {sec(ru.ru_utime) + sec(ru.ru_stime), static_cast<int64_t>(ru.ru_maxrss) * 1024};
}

// Waits for every pid until `deadline`; kills what is left. True when all
// exited with status 0. `usage` gets each one's figures.
bool WaitAll(const std::vector<pid_t>& pids, Clock::time_point deadline, std::string* why,
             std::vector<PartyUsage>* usage) {
  usage->assign(pids.size(), PartyUsage{});
  bool ok = true;
  std::vector<bool> done(pids.size(), false);
  size_t left = pids.size();
  while (left > 0 && Clock::now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int st = 0;
      rusage ru{};
      pid_t r = wait4(pids[i], &st, WNOHANG, &ru);
      if (r == pids[i] || r < 0) {
        if (r == pids[i]) (*usage)[i] = UsageOf(ru);
        done[i] = true;
        --left;
        if (r < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
          ok = false;
          *why += (i == 0 ? "server" : "client " + std::to_string(i)) + " exited with status " +
                  std::to_string(st) + "; ";
        }
      }
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (done[i]) continue;
    kill(-pids[i], SIGKILL);
    kill(pids[i], SIGKILL);
    rusage ru{};
    if (wait4(pids[i], nullptr, 0, &ru) == pids[i]) (*usage)[i] = UsageOf(ru);
    ok = false;
    *why += (i == 0 ? "server" : "client " + std::to_string(i)) + " timed out; ";
  }
  return ok;
}

std::string DefaultOut(const std::string& env) { return "results/e2e-" + env + "-" + UtcStamp(); }

struct RunResult {
  bool ok = false;
  std::string error;
  double wall_s = 0;    // spawn of the server to its exit
  double rounds_s = 0;  // sum of the server's round times
  json report;          // the server's job report
  json cpu;             // CPU time and peak memory (CpuJson)
};

// The host's CPU time while a job runs: /proc/stat's first line sampled
// every kCpuSampleMs on a thread of its own, so that the share of the
// cores busy during the rounds (the server's round times say when they
// were) can be told from that during start-up and the final evaluation.
class HostCpuSampler {
 public:
  static constexpr int kCpuSampleMs = 250;
  HostCpuSampler() : thread_([this] { Loop(); }) {}
  ~HostCpuSampler() { Stop(); }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // The share of the host's CPU time busy between the samples nearest
  // inside [from, to] (seconds since the epoch); < 0 without two of them.
  double BusyBetween(double from, double to) {
    std::lock_guard<std::mutex> lock(mu_);
    return HostBusyBetween(samples_, from, to);
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      HostCpuSample s;
      lock.unlock();
      const bool ok = ReadHostCpu(&s);
      lock.lock();
      if (ok) samples_.push_back(s);
      cv_.wait_for(lock, std::chrono::milliseconds(kCpuSampleMs), [this] { return stop_; });
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<HostCpuSample> samples_;
  std::thread thread_;
};

// A share as a percentage, "-" when not measured (< 0).
std::string Share(double share) { return share < 0 ? "-" : Fixed(100 * share, 0) + "%"; }

// The CPU the run used against what the machine had: on one host every
// party shares the same cores, which separate hosts would not, so a row
// whose parties kept the cores busy is bounded by the CPU, not by its
// links.
json CpuJson(const std::vector<PartyUsage>& parties, double router_s, double wall_s) {
  double clients = 0, clients_max = 0;
  int64_t clients_rss = 0;
  for (size_t i = 1; i < parties.size(); ++i) {
    clients += parties[i].cpu_s;
    clients_max = std::max(clients_max, parties[i].cpu_s);
    clients_rss = std::max(clients_rss, parties[i].max_rss_bytes);
  }
  const double server = parties.empty() ? 0 : parties[0].cpu_s;
  const double total = server + clients + router_s;
  // The CPU time per second the bench (and the parties it forks) may get.
  const double cores = CpuCapacity();
  json j = {{"server_s", server},
            {"clients_s", clients},
            {"client_max_s", clients_max},
            {"router_s", router_s},
            {"total_s", total},
            {"cores", cores},
            {"server_max_rss_bytes", parties.empty() ? 0 : parties[0].max_rss_bytes},
            {"client_max_rss_bytes", clients_rss}};
  // The share of the cores' time over the run that the parties used.
  j["busy"] = wall_s > 0 ? total / (wall_s * cores) : 0.0;
  return j;
}

RunResult RunOne(const E2eOptions& a, const E2eBackend& b, const std::string& tier,
                 const netem::State& state, const fs::path& dir, int port) {
  RunResult res;
  fs::create_directories(dir);
  const std::string server_ip = state.topology.loopback ? "127.0.0.1" : state.sites[0].address;
  const fs::path job = dir / "job.toml";
  {
    std::ofstream t(job);
    t << "# written by xsilo bench e2e\n[transport]\n"
      << "name = " << Quote(b.transport) << "\n"
      << "address = " << Quote(server_ip + ":" + std::to_string(port)) << "\n"
      << "world_size = " << a.clients + 1 << "\n"
      << "connect_timeout_s = 300\n";
    if (!b.options.empty()) {
      t << "\n[backend]\n";
      for (const auto& [k, v] : b.options) t << k << " = " << Quote(v) << "\n";
    }
    t << "\n[fl]\ntier = " << Quote(tier) << "\nrounds = " << a.rounds << "\n";
    if (a.local_steps > 0)
      t << "local_steps = " << a.local_steps << "\n";
    else
      t << "local_epochs = " << a.local_epochs << "\n";
    t << "quorum = " << Quote(std::to_string(a.clients)) << "\n";
    // Every deadline is the job's timeout, the final evaluation's too: it
    // broadcasts the model once more, which for Big on a slow link takes
    // minutes, far past its 60 s default.
    for (const char* k :
         {"round_deadline_s", "finish_deadline_s", "send_timeout_s", "idle_timeout_s"}) {
      t << k << " = " << static_cast<int64_t>(a.timeout_s) << "\n";
    }
  }
  const std::string exe = SelfExe();
  const fs::path report = dir / "server.json";
  std::error_code ec;
  fs::remove(report, ec);
  const double router0 =
      state.router_pid > 0 ? netem::ProcessCpuSeconds(state.router_pid).value_or(0) : 0;
  HostCpuSampler host_cpu;
  const auto t0 = Clock::now();
  std::vector<pid_t> pids;
  pids.push_back(
      Spawn({exe, "fl", "server", "--config", job.string(), "--json", report.string(), "--quiet"},
            &state, 0, PartyLog(dir, 0).string()));
  for (int r = 1; r <= a.clients; ++r) {
    const int site =
        state.topology.loopback ? 0 : 1 + (r - 1) % static_cast<int>(state.sites.size() - 1);
    pids.push_back(Spawn(
        {exe, "fl", "client", "--config", job.string(), "--rank", std::to_string(r), "--quiet"},
        &state, site, PartyLog(dir, r).string()));
  }
  const auto deadline = t0 + std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000));
  std::vector<PartyUsage> usage;
  res.ok = WaitAll(pids, deadline, &res.error, &usage);
  res.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double router =
      state.router_pid > 0
          ? std::max(0.0, netem::ProcessCpuSeconds(state.router_pid).value_or(router0) - router0)
          : 0;
  res.cpu = CpuJson(usage, router, res.wall_s);
  host_cpu.Stop();
  std::ifstream in(report);
  if (in) {
    try {
      in >> res.report;
    } catch (const std::exception& e) {
      res.ok = false;
      res.error += std::string("unreadable report: ") + e.what();
    }
  } else {
    res.ok = false;
    res.error += "no report from the server (see " + PartyLog(dir, 0).string() + ")";
  }
  if (res.report.contains("rounds")) {
    double from = 0, to = 0;
    for (const auto& r : res.report["rounds"]) {
      const double s = r.value("seconds", 0.0), at = r.value("started_unix_s", 0.0);
      res.rounds_s += s;
      if (at > 0 && (from == 0 || at < from)) from = at;
      to = std::max(to, at + s);
    }
    // The host's CPUs during the rounds (every process on it: on this
    // machine the parties, the emulator and the bench).
    if (from > 0) res.cpu["rounds_host_busy"] = host_cpu.BusyBetween(from, to);
  }
  return res;
}

// Each round's timeline from the server's report (docs/fl.md): when the
// broadcast completed and when each aggregated update moved.
json RoundTimelines(const json& report) {
  json out = json::array();
  if (!report.contains("rounds")) return out;
  for (const auto& r : report["rounds"]) {
    if (!r.contains("timeline")) continue;
    out.push_back({{"round", r.value("round", 0)},
                   {"seconds", r.value("seconds", 0.0)},
                   {"broadcast_s", r.contains("broadcast_s") ? r["broadcast_s"] : json()},
                   {"timeline", r["timeline"]}});
  }
  return out;
}

// Seconds of a timeline field, or "-" where it is null (unstamped).
std::string Stamp(const json& u, const char* field) {
  return u.contains(field) && u[field].is_number() ? Fixed(u[field].get<double>(), 2) : "-";
}

// Per round, the update that arrived last: where the round's time went.
void PrintCriticalPaths(const json& timelines) {
  for (const auto& r : timelines) {
    const auto& t = r["timeline"];
    if (t.empty()) continue;
    const json& last = t.back();
    std::cout << "    round " << r["round"].get<int64_t>() << " ("
              << Fixed(r["seconds"].get<double>(), 2) << " s, broadcast done at "
              << Stamp(r, "broadcast_s") << " s): last update from rank " << last["rank"].get<int>()
              << ": model at " << Stamp(last, "model_at_s") << " s, trained "
              << Stamp(last, "train_s") << " s, sent at " << Stamp(last, "sent_at_s")
              << " s, arrived at " << Stamp(last, "arrived_s") << " s\n";
  }
}

// Per-state seconds of the server and the mean over clients, from a report.
void StateSummary(const json& report, json* server, json* clients_mean) {
  *server = json::object();
  *clients_mean = json::object();
  if (!report.contains("state_seconds")) return;
  const auto& ss = report["state_seconds"];
  int n = 0;
  for (const auto& p : ss["parties"]) {
    if (p.value("rank", -1) == 0) {
      *server = p["seconds"];
      (*server)["total"] = p.value("total", 0.0);
      continue;
    }
    ++n;
    for (const auto& [k, v] : p["seconds"].items())
      (*clients_mean)[k] = clients_mean->value(k, 0.0) + v.get<double>();
    (*clients_mean)["total"] = clients_mean->value("total", 0.0) + p.value("total", 0.0);
  }
  if (n > 0) {
    for (auto& [k, v] : clients_mean->items()) v = v.get<double>() / n;
  }
}

}  // namespace

int RunE2e(const E2eOptions& a) {
  std::vector<E2eBackend> backends;
  for (const auto& name : SplitList(a.backends)) {
    std::string base;
    std::map<std::string, std::string> extra;
    bool found = false;
    if (SplitCompressionSuffix(name, &base, &extra)) {
      for (const auto& b : E2eBackends()) {
        if (b.name == base) {
          backends.push_back(b);
          backends.back().name = name;
          backends.back().options.insert(extra.begin(), extra.end());
          found = true;
        }
      }
    }
    if (!found) {
      std::cerr << "xsilo bench e2e: unknown backend '" << name << "' (known:";
      for (const auto& b : E2eBackends()) std::cerr << " " << b.name;
      std::cerr << "; each with ~auto, ~lossless, ~bf16, ~fp16, ~int8, ~topk or ~CAST+topk: "
                   "compressed)\n";
      return 2;
    }
  }
  const auto tiers = SplitList(a.tiers);
  if (backends.empty() || tiers.empty() || a.clients < 1 || a.rounds < 1) {
    std::cerr << "xsilo bench e2e: need backends, tiers, clients >= 1 and rounds >= 1\n";
    return 2;
  }
  auto topology = netem::LoadTopology(a.env, a.env == "lan" ? 1.0 : a.scale);
  if (!topology.ok()) {
    std::cerr << "xsilo bench e2e: " << topology.status().ToString() << "\n";
    return 2;
  }
  const fs::path out = a.out.empty() ? DefaultOut(a.env) : a.out;
  fs::create_directories(out);

  netem::Options nopt;
  nopt.prefix = a.prefix;
  netem::State state;
  state.topology = *topology;
  bool up = false;
  if (!topology->loopback) {
    (void)netem::Down(nopt);  // leftovers of a crashed run
    Status s = netem::Up(*topology, nopt);
    if (!s.ok()) {
      std::cerr << "xsilo bench e2e: netem up " << a.env << ": " << s.ToString() << "\n";
      (void)netem::Down(nopt);
      return 1;
    }
    up = true;
    auto st = netem::LoadState(nopt);
    if (!st.ok()) {
      std::cerr << "xsilo bench e2e: " << st.status().ToString() << "\n";
      (void)netem::Down(nopt);
      return 1;
    }
    state = *st;
    std::cout << "netem: " << a.env << " up at scale " << a.scale << ", " << state.sites.size() - 1
              << " client sites\n";
  }

  json results;
  results["benchmark"] = "e2e";
  results["env"] = a.env;
  results["scale"] = topology->loopback ? 1.0 : a.scale;
  results["clients"] = a.clients;
  results["rounds"] = a.rounds;
  results["local_work"] =
      a.local_steps > 0 ? json{{"steps", a.local_steps}} : json{{"epochs", a.local_epochs}};
  results["runs"] = json::array();
  std::ofstream csv(out / "e2e.csv");
  csv << "env,backend,tier,ok,wall_s,rounds_s,party,train,aggregate,communication,"
         "serialization,wait,migration,total,final_loss,final_accuracy\n";
  // Below the kernel's ephemeral range (32768-60999 by default): a
  // connection of the run before, in TIME_WAIT on the server's address, can
  // hold any port in that range, and a listener cannot bind over it (the
  // run of auto+s3~topk after three others failed with EADDRINUSE on 41040).
  int failures = 0, port = 22000;
  // The parties append to their logs (Spawn), so that a backend listed
  // twice keeps the logs of all its rows one after the other; a log an
  // earlier command left in the same --out would be mixed in: removed.
  for (const auto& tier : tiers) {
    for (const auto& b : backends) {
      const fs::path dir = out / (b.name + "-" + tier);
      std::error_code ec;
      for (int r = 0; r <= a.clients; ++r) fs::remove(PartyLog(dir, r), ec);
    }
  }
  const auto started = Clock::now();
  for (const auto& tier : tiers) {
    for (const auto& b : backends) {
      std::cout << "[" << Fixed(std::chrono::duration<double>(Clock::now() - started).count(), 0)
                << " s] " << a.env << " " << b.name << " " << tier << ": 1 server + " << a.clients
                << " clients, " << a.rounds << " rounds ...\n"
                << std::flush;
      const fs::path dir = out / (b.name + "-" + tier);
      const int use_port = topology->loopback ? FreeLoopbackPort() : port;
      RunResult r = RunOne(a, b, tier, state, dir, use_port);
      port += 10;  // a fresh port per run: no TIME_WAIT surprises
      json server, clients;
      StateSummary(r.report, &server, &clients);
      json row = {{"backend", b.name},
                  {"transport", b.transport},
                  {"options", b.options},
                  {"tier", tier},
                  {"ok", r.ok},
                  {"wall_s", r.wall_s},
                  {"rounds_s", r.rounds_s},
                  {"server", server},
                  {"clients_mean", clients},
                  {"cpu", r.cpu}};
      if (r.report.contains("final")) row["final"] = r.report["final"];
      if (r.report.contains("model")) row["model"] = r.report["model"];
      // The server's side: the models it sent, the updates it decoded.
      if (r.report.contains("compression")) row["compression"] = r.report["compression"];
      const json timelines = RoundTimelines(r.report);
      if (!timelines.empty()) row["round_timelines"] = timelines;
      if (!r.ok) row["error"] = r.error;
      results["runs"].push_back(row);
      if (!r.ok) {
        ++failures;
        std::cout << "  FAILED: " << r.error << "\n";
      } else {
        std::cout << "  job " << Fixed(r.rounds_s, 2) << " s over " << a.rounds << " rounds (wall "
                  << Fixed(r.wall_s, 2) << " s); server comm "
                  << Fixed(server.value("communication", 0.0), 2) << " s, clients' mean train "
                  << Fixed(clients.value("train", 0.0), 2) << " s; CPU "
                  << Fixed(r.cpu["total_s"].get<double>(), 1) << " s of "
                  << Fixed(r.cpu["cores"].get<double>(), 1) << " CPUs' " << Fixed(r.wall_s, 1)
                  << " s (" << Share(r.cpu["busy"].get<double>()) << " busy; the host's "
                  << Share(r.cpu.value("rounds_host_busy", -1.0)) << " during the rounds)\n";
        PrintCriticalPaths(timelines);
      }
      auto final_loss = r.report.contains("final") && r.report["final"]["loss"].is_number()
                            ? Fixed(r.report["final"]["loss"].get<double>(), 4)
                            : "";
      auto final_acc = r.report.contains("final") && r.report["final"]["accuracy"].is_number()
                           ? Fixed(r.report["final"]["accuracy"].get<double>(), 4)
                           : "";
      for (const auto& [party, s] :
           {std::pair<std::string, json>{"server", server}, {"clients_mean", clients}}) {
        csv << a.env << "," << b.name << "," << tier << "," << (r.ok ? 1 : 0) << ","
            << Fixed(r.wall_s, 3) << "," << Fixed(r.rounds_s, 3) << "," << party;
        for (const char* k :
             {"train", "aggregate", "communication", "serialization", "wait", "migration", "total"})
          csv << "," << Fixed(s.value(k, 0.0), 3);
        csv << "," << final_loss << "," << final_acc << "\n";
      }
    }
  }
  if (up) (void)netem::Down(nopt);
  std::ofstream(out / "e2e.json") << results.dump(2) << "\n";

  // Table, and the ratios against grpc (streams=1) per tier.
  std::printf("\n%-10s %-8s %4s %9s %9s %9s %9s %9s %9s %9s %9s\n", "backend", "tier", "ok",
              "job_s", "srv_comm", "srv_wait", "cl_train", "cl_comm", "cl_wait", "cpu_busy",
              "rnd_busy");
  std::map<std::string, double> baseline;
  for (const auto& r : results["runs"]) {
    if (r["backend"] == "grpc" && r["ok"].get<bool>())
      baseline[r["tier"].get<std::string>()] = r["rounds_s"].get<double>();
  }
  for (const auto& r : results["runs"]) {
    const auto& s = r["server"];
    const auto& c = r["clients_mean"];
    std::printf("%-10s %-8s %4s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9s %9s",
                r["backend"].get<std::string>().c_str(), r["tier"].get<std::string>().c_str(),
                r["ok"].get<bool>() ? "yes" : "NO", r["rounds_s"].get<double>(),
                s.value("communication", 0.0), s.value("wait", 0.0), c.value("train", 0.0),
                c.value("communication", 0.0), c.value("wait", 0.0),
                Share(r["cpu"].value("busy", -1.0)).c_str(),
                Share(r["cpu"].value("rounds_host_busy", -1.0)).c_str());
    auto it = baseline.find(r["tier"].get<std::string>());
    if (it != baseline.end() && r["ok"].get<bool>() && r["rounds_s"].get<double>() > 0)
      std::printf("   %.2fx vs grpc", it->second / r["rounds_s"].get<double>());
    std::printf("\n");
  }
  std::printf(
      "job_s: sum of the server's round times; srv_/cl_: seconds in that state\n"
      "(server; mean over clients); cpu_busy: CPU time of every party and the link\n"
      "emulator over the CPUs' time during the run; rnd_busy: the host's CPUs busy\n"
      "during the rounds (-: not measured). Results: %s/e2e.{json,csv}; figure:\n"
      "xsilo bench plot --in %s\n",
      out.c_str(), out.c_str());
  return failures == 0 ? 0 : 1;
}

}  // namespace xsilo::bench
