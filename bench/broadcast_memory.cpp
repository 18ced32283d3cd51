// Broadcasts a model from one server to N client processes at once over a
// transport (grpc by default, or a hybrid such as grpc+s3) and reports the
// sender's peak memory and throughput.
//
//   broadcast_memory [--backend grpc] [--tier big] [--clients 7]
//                    [--streams 1,4] [--chunk_bytes N] [--rounds 3]
//                    [--option key=value]... [--json FILE]
//
// Each configuration runs `rounds` broadcasts in a fresh server; clients are
// this program re-run as child processes. The sender's VmHWM is reset right
// before each broadcast and read after every client confirmed (checksum
// verified) receipt. Child processes the transport itself started (the
// embedded S3 server of grpc+s3) are reported separately: their peak is
// VmHWM since they started. Prints a table and writes JSON (default
// broadcast_memory.json).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "xsilo/bench/model.h"
#include "xsilo/bench/process.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/tiers.h"
#include "xsilo/transport/registry.h"

namespace {

using namespace xsilo;
using Clock = std::chrono::steady_clock;

using bench::FreeLoopbackPort;
using bench::ModelIntact;
using bench::StatusBytes;

std::string g_backend = "grpc";
std::map<std::string, std::string> g_extra;  // --option key=value

std::map<std::string, std::string> BackendOptions(int streams, uint64_t chunk) {
  std::map<std::string, std::string> o = {{"streams", std::to_string(streams)},
                                          {"chunk_bytes", std::to_string(chunk)}};
  for (const auto& [k, v] : g_extra) o[k] = v;
  return o;
}

// Child: receive `rounds` models, verify, ack each.
int RunClient(int rank, int world, const std::string& address, int streams, uint64_t chunk,
              int rounds) {
  TransportOptions o;
  o.rank = rank;
  o.world_size = world;
  o.address = address;
  o.backend = BackendOptions(streams, chunk);
  auto t = TransportRegistry::Global().Create(g_backend, o);
  if (!t.ok() || !(*t)->Start().ok()) return 2;
  for (int r = 0; r < rounds; ++r) {
    auto m = (*t)->Receive(std::chrono::seconds(600));
    if (!m.ok()) return 4;
    Message ack;
    ack.type = ModelIntact(*m) ? "ok" : "damaged";
    ack.round = m->round;
    if (!(*t)->Send(0, std::move(ack), std::chrono::seconds(120)).ok()) return 5;
  }
  (*t)->Stop();
  return 0;
}

struct Row {
  int streams;
  int round;
  double seconds;
  uint64_t model_bytes, rss_before_model, peak, helpers_peak;
};

int RunServer(const ModelTier& tier, int clients, int streams, uint64_t chunk, int rounds,
              std::vector<Row>* rows) {
  const int world = clients + 1;
  const int port = FreeLoopbackPort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  TransportOptions o;
  o.rank = 0;
  o.world_size = world;
  o.address = address;
  o.backend = BackendOptions(streams, chunk);
  auto server = TransportRegistry::Global().Create(g_backend, o);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  Status s = (*server)->Start();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 1; r <= clients; ++r) {
    std::string spec = std::to_string(r) + "|" + std::to_string(world) + "|" + address + "|" +
                       std::to_string(streams) + "|" + std::to_string(chunk) + "|" +
                       std::to_string(rounds) + "|" + g_backend;
    for (const auto& [k, v] : g_extra) spec += "|" + k + "=" + v;
    const pid_t pid = bench::SpawnSelfWithEnv("XSILO_BENCH_CLIENT=" + spec);
    if (pid > 0) pids.push_back(pid);
  }
  std::vector<int32_t> peers;
  for (int r = 1; r <= clients; ++r) peers.push_back(r);
  int failures = 0;
  for (int round = 0; round < rounds; ++round) {
    const uint64_t before = StatusBytes("self", "VmRSS");
    Message m =
        std::move(bench::MakeModel(tier.parameters, static_cast<uint64_t>(round) + 1)).value();
    m.round = round;
    const uint64_t model_bytes = m.payload_bytes();
    bench::ResetPeakRss();
    auto t0 = Clock::now();
    s = (*server)->Broadcast(peers, m, std::chrono::seconds(900));
    if (!s.ok()) {
      std::fprintf(stderr, "broadcast: %s\n", s.ToString().c_str());
      ++failures;
      break;
    }
    for (int n = 0; n < clients; ++n) {
      auto ack = (*server)->Receive(std::chrono::seconds(600));
      if (!ack.ok() || ack->type != "ok") ++failures;
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    rows->push_back({streams, round, secs, model_bytes, before, StatusBytes("self", "VmHWM"),
                     bench::ChildrenPeakRss({pids.begin(), pids.end()})});
  }
  for (pid_t pid : pids) {
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failures;
  }
  (*server)->Stop();
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* spec = std::getenv("XSILO_BENCH_CLIENT")) {
    std::vector<std::string> f;
    std::stringstream in(spec);
    std::string item;
    while (std::getline(in, item, '|')) f.push_back(item);
    if (f.size() < 7) return 9;
    g_backend = f[6];
    for (size_t i = 7; i < f.size(); ++i) {
      auto eq = f[i].find('=');
      if (eq != std::string::npos) g_extra[f[i].substr(0, eq)] = f[i].substr(eq + 1);
    }
    return RunClient(std::stoi(f[0]), std::stoi(f[1]), f[2], std::stoi(f[3]), std::stoull(f[4]),
                     std::stoi(f[5]));
  }
  std::string tier_name = "big", json = "broadcast_memory.json", streams_list = "1,4";
  int clients = 7, rounds = 3;
  uint64_t chunk = 1ull << 20;  // the grpc default
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--tier")
      tier_name = v;
    else if (k == "--clients")
      clients = std::stoi(v);
    else if (k == "--streams")
      streams_list = v;
    else if (k == "--chunk_bytes")
      chunk = std::stoull(v);
    else if (k == "--rounds")
      rounds = std::stoi(v);
    else if (k == "--json")
      json = v;
    else if (k == "--backend")
      g_backend = v;
    else if (k == "--option" && v.find('=') != std::string::npos)
      g_extra[v.substr(0, v.find('='))] = v.substr(v.find('=') + 1);
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  auto tier = FindTier(tier_name);
  if (!tier) {
    std::fprintf(stderr, "unknown tier %s\n", tier_name.c_str());
    return 2;
  }
  std::vector<int> streams;
  {
    std::stringstream in(streams_list);
    std::string item;
    while (std::getline(in, item, ',')) streams.push_back(std::stoi(item));
  }
  std::vector<Row> rows;
  int failures = 0;
  for (int s : streams) failures += RunServer(*tier, clients, s, chunk, rounds, &rows);

  std::printf("%s broadcast: tier %s (%llu float32 params), %d clients, chunk %llu bytes\n",
              g_backend.c_str(), std::string(tier->name).c_str(),
              static_cast<unsigned long long>(tier->parameters), clients,
              static_cast<unsigned long long>(chunk));
  std::printf("%7s %5s %12s %14s %12s %12s %10s %10s %12s\n", "streams", "round", "model_MB",
              "rss_before_MB", "peak_MB", "peak/model", "growth", "agg_MB/s", "helpers_MB");
  std::ofstream out(json);
  out << "{\"benchmark\": \"broadcast_memory\", \"backend\": \"" << g_backend << "\", \"tier\": \""
      << tier->name << "\", \"parameters\": " << tier->parameters << ", \"clients\": " << clients
      << ", \"chunk_bytes\": " << chunk << ", \"failures\": " << failures << ", \"runs\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double mb = 1e6;
    const double ratio = static_cast<double>(r.peak) / static_cast<double>(r.model_bytes);
    const double growth = static_cast<double>(r.peak - std::min(r.peak, r.rss_before_model)) /
                          static_cast<double>(r.model_bytes);
    const double agg = static_cast<double>(r.model_bytes) * clients / r.seconds / mb;
    std::printf("%7d %5d %12.1f %14.1f %12.1f %12.3f %10.3f %10.1f %12.1f\n", r.streams, r.round,
                r.model_bytes / mb, r.rss_before_model / mb, r.peak / mb, ratio, growth, agg,
                r.helpers_peak / mb);
    out << (i ? ", " : "") << "{\"streams\": " << r.streams << ", \"round\": " << r.round
        << ", \"seconds\": " << r.seconds << ", \"model_bytes\": " << r.model_bytes
        << ", \"rss_before_model_bytes\": " << r.rss_before_model
        << ", \"peak_rss_bytes\": " << r.peak << ", \"peak_over_model\": " << ratio
        << ", \"growth_over_model\": " << growth << ", \"aggregate_mb_per_s\": " << agg
        << ", \"helper_processes_peak_rss_bytes\": " << r.helpers_peak << "}";
  }
  out << "]}\n";
  std::printf("peak/model: sender VmHWM during the broadcast / model bytes\n");
  std::printf("helpers: peak RSS of processes the transport started (embedded S3 server)\n");
  std::printf("growth: (VmHWM - RSS before the model was built) / model bytes\n");
  std::printf("wrote %s; %d failures\n", json.c_str(), failures);
  return failures == 0 ? 0 : 1;
}
