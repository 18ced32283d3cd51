// Soak of one broadcast to many client processes: every round the server
// broadcasts a new model to every client, each client checks it, lets it go
// and acks, and the next round starts when all have acked. Every round's
// memory and descriptor figures come from the kernel.
//
//   broadcast_soak [--backend grpc] [--tier big] [--clients 64] [--rounds 20]
//                  [--max-server-rss-growth-mb 32] [--min-available-mb 1024]
//                  [--round-timeout-s 900] [--sample-ms 50]
//                  [--option key=value]... [--client-option key=value]...
//                  [--inject none|damage|skip|fd-leak|rss-leak] [--json FILE]
//
// This process is the server (rank 0) on 127.0.0.1; each client is this
// program re-run as a child process. A round: reset the peak RSS (VmHWM,
// /proc/<pid>/clear_refs) of the server and of every client, build the
// round's model (tier's float32 parameters, seeded by the round; its
// checksum travels with it), BroadcastAsync it to every live client, wait
// for every client's ack. A client checks the round number and the checksum
// (ModelIntact), drops the model, then acks "ok" or "damaged". When the
// round ends the server records its own VmRSS (after the model was
// dropped), VmHWM and open descriptors, every client's VmHWM and VmRSS and
// their largest descriptor count. A thread samples MemAvailable and the sum
// of the clients' VmRSS every --sample-ms; each round reports the lowest
// and the highest of them. Prints one table row per round and writes JSON
// (default broadcast_soak.json).
//
// --option sets a backend option for every party, --client-option for the
// clients only. With the grpc backend the clients get recycle_bytes=0
// unless --client-option names it: grpc's default keeps a received
// model's buffer for reuse (5 s idle), so each client would hold one model
// from round to round instead of letting it go once verified.
//
// Clients set their oom_score_adj to 1000, so that the kernel's OOM killer
// takes one of them before any other process. When MemAvailable falls
// under --min-available-mb the sampler kills every client (SIGKILL) and
// the run ends as "did not fit", with the figures it saw.
//
// Exit 0 only if every client acked every round with a verified model, no
// broadcast failed, every client exited 0, the server's descriptor count at
// the end of the last round is not above that of round 2, and its VmRSS at
// the end of the last round is at most --max-server-rss-growth-mb above
// that of round 2. Exit 1 otherwise (each reason printed as "FAIL <kind>"),
// 2 on bad arguments. --inject breaks one of those on purpose (client 1
// damages round 2's model, or exits before acking it; the server opens a
// descriptor, or keeps 64 MiB, every round from round 2 on), so that a test
// can check each failure is reported.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "xsilo/bench/model.h"
#include "xsilo/bench/process.h"
#include "xsilo/core/tiers.h"
#include "xsilo/transport/registry.h"

namespace {

using namespace xsilo;
using Clock = std::chrono::steady_clock;
using KeyValues = std::map<std::string, std::string>;

constexpr double kMB = 1e6;

struct Args {
  std::string backend = "grpc";
  std::string tier = "big";
  int clients = 64;
  int rounds = 20;
  double max_server_rss_growth_mb = 32;
  double min_available_mb = 1024;
  int round_timeout_s = 900;
  int sample_ms = 50;
  std::string inject = "none";
  std::string json = "broadcast_soak.json";
  KeyValues options;         // every party
  KeyValues client_options;  // clients only, over `options`
};

using bench::OpenFds;

// What this process's descriptors point at (readlink of /proc/self/fd/*).
std::vector<std::string> FdTargets() {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::error_code rec;
    auto target = std::filesystem::read_symlink(it->path(), rec);
    out.push_back(rec ? std::string("?") : target.string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t MemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

TransportOptions Options(const Args& a, const std::string& address, int rank,
                         const KeyValues& backend) {
  TransportOptions o;
  o.rank = rank;
  o.world_size = a.clients + 1;
  o.address = address;
  o.backend = backend;
  o.connect_timeout = std::chrono::seconds(180);
  o.receive_queue_capacity = static_cast<size_t>(a.clients) + 8;
  return o;
}

// Child: receive every round's model, check it, let it go, ack.
int RunClient(const Args& a, const std::string& address, int rank) {
  // The OOM killer takes a client before any process that is not ours.
  { std::ofstream("/proc/self/oom_score_adj") << "1000"; }
  auto t = TransportRegistry::Global().Create(a.backend, Options(a, address, rank, a.options));
  if (!t.ok()) {
    std::fprintf(stderr, "client %d: %s\n", rank, t.status().ToString().c_str());
    return 3;
  }
  if (Status s = (*t)->Start(); !s.ok()) {
    std::fprintf(stderr, "client %d: start: %s\n", rank, s.ToString().c_str());
    return 3;
  }
  const bool injected = rank == 1;
  for (int round = 0; round < a.rounds; ++round) {
    Message ack;
    {
      auto m = (*t)->Receive(std::chrono::seconds(a.round_timeout_s));
      if (!m.ok()) {
        std::fprintf(stderr, "client %d round %d: %s\n", rank, round + 1,
                     m.status().ToString().c_str());
        return 4;
      }
      if (injected && round == 1 && a.inject == "damage" && m->tensors.count("w")) {
        m->tensors.at("w").data.mutable_data()[0] ^= 0x40;
      }
      const bool intact = m->round == round && bench::ModelIntact(*m);
      ack.type = intact ? "ok" : "damaged";
      ack.round = m->round;
    }  // the model is gone before the ack goes out
    if (injected && round == 1 && a.inject == "skip") {
      (*t)->Stop();
      return 0;
    }
    if (Status s = (*t)->Send(0, std::move(ack), std::chrono::seconds(120)); !s.ok()) {
      std::fprintf(stderr, "client %d round %d: ack: %s\n", rank, round + 1, s.ToString().c_str());
      return 5;
    }
  }
  // Stay connected until the server has sampled the last round, so that
  // its descriptor count is not lowered by clients leaving.
  auto end = (*t)->Receive(std::chrono::seconds(a.round_timeout_s));
  (*t)->Stop();
  if (!end.ok() || end->type != "end") {
    std::fprintf(stderr, "client %d: no end message: %s\n", rank,
                 end.ok() ? end->type.c_str() : end.status().ToString().c_str());
    return 6;
  }
  return 0;
}

struct Client {
  pid_t pid = -1;
  bool exited = false;  // reaped
  int exit_code = -1;   // WEXITSTATUS, or 128 + signal
};

// Samples MemAvailable and the clients' summed VmRSS on a thread; kills
// every client when MemAvailable falls under the floor.
class Sampler {
 public:
  Sampler(std::vector<Client>* clients, uint64_t floor_bytes, std::chrono::milliseconds every)
      : clients_(clients), floor_(floor_bytes), every_(every) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Sampler() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  struct Window {
    uint64_t min_available = 0;
    uint64_t max_clients_rss_sum = 0;
    int samples = 0;
  };

  // Samples once more, returns the window since the last call and starts a
  // new one.
  Window Take() {
    std::lock_guard<std::mutex> lock(mu_);
    SampleLocked();
    Window w = window_;
    window_ = Window{};
    return w;
  }

  // Reaps the clients that exited (under the lock: the sampler never
  // signals a pid that was reaped).
  void Reap() {
    std::lock_guard<std::mutex> lock(mu_);
    for (Client& c : *clients_) {
      if (c.exited || c.pid <= 0) continue;
      int st = 0;
      if (waitpid(c.pid, &st, WNOHANG) != c.pid) continue;
      c.exited = true;
      c.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    }
  }

  // Kills every client still running (SIGKILL).
  void KillClients() {
    std::lock_guard<std::mutex> lock(mu_);
    KillLocked();
  }

  bool tripped() const { return tripped_.load(); }
  uint64_t tripped_available() const { return tripped_available_; }
  uint64_t tripped_clients_rss_sum() const { return tripped_sum_; }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      SampleLocked();
      cv_.wait_for(lock, every_, [this] { return stop_; });
    }
  }

  void SampleLocked() {
    const uint64_t avail = MemAvailableBytes();
    uint64_t sum = 0;
    for (const Client& c : *clients_) {
      if (!c.exited && c.pid > 0) sum += bench::StatusBytes(std::to_string(c.pid), "VmRSS");
    }
    window_.min_available = window_.samples == 0 ? avail : std::min(window_.min_available, avail);
    window_.max_clients_rss_sum = std::max(window_.max_clients_rss_sum, sum);
    ++window_.samples;
    if (avail < floor_ && !tripped_.load()) {
      tripped_available_ = avail;
      tripped_sum_ = sum;
      tripped_.store(true);
      KillLocked();
    }
  }

  void KillLocked() {
    for (const Client& c : *clients_) {
      if (!c.exited && c.pid > 0) kill(c.pid, SIGKILL);
    }
  }

  std::vector<Client>* clients_;
  const uint64_t floor_;
  const std::chrono::milliseconds every_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  Window window_;
  std::atomic<bool> tripped_{false};
  uint64_t tripped_available_ = 0, tripped_sum_ = 0;
  std::thread thread_;
};

struct Row {
  int round = 0;                          // 1-based
  int peers = 0;                          // live clients the model went to
  int acked = 0;                          // "ok" acks of this round
  int damaged = 0;                        // "damaged" acks
  int missed = 0;                         // clients (of all) without an ok ack
  std::string broadcast;                  // "ok" or the error
  double build_seconds = 0, seconds = 0;  // model build; broadcast to last ack
  uint64_t model_bytes = 0;
  uint64_t server_rss = 0, server_hwm = 0;
  int server_fds = 0;
  uint64_t clients_hwm_max = 0, clients_hwm_sum = 0, clients_rss_max = 0;
  int clients_fds_max = 0;
  uint64_t available_start = 0;
  Sampler::Window sampled;
};

int Usage(const std::string& why) {
  std::fprintf(stderr, "broadcast_soak: %s\n", why.c_str());
  return 2;
}

bool ParseKeyValue(const std::string& v, KeyValues* out) {
  const auto eq = v.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  (*out)[v.substr(0, eq)] = v.substr(eq + 1);
  return true;
}

// The client's spec, passed in its environment: the address, its rank, then
// the server's arguments, separated by 0x1f (the unit separator).
std::string ClientSpec(const std::string& address, int rank, int argc, char** argv) {
  std::string s = address + "\x1f" + std::to_string(rank);
  for (int i = 1; i < argc; ++i) s += std::string("\x1f") + argv[i];
  return s;
}

Result<Args> ParseArgs(const std::vector<std::string>& v) {
  Args a;
  for (size_t i = 0; i < v.size(); i += 2) {
    const std::string& k = v[i];
    if (i + 1 >= v.size()) return InvalidArgument("missing value for " + k);
    const std::string& x = v[i + 1];
    try {
      if (k == "--backend")
        a.backend = x;
      else if (k == "--tier")
        a.tier = x;
      else if (k == "--clients")
        a.clients = std::stoi(x);
      else if (k == "--rounds")
        a.rounds = std::stoi(x);
      else if (k == "--max-server-rss-growth-mb")
        a.max_server_rss_growth_mb = std::stod(x);
      else if (k == "--min-available-mb")
        a.min_available_mb = std::stod(x);
      else if (k == "--round-timeout-s")
        a.round_timeout_s = std::stoi(x);
      else if (k == "--sample-ms")
        a.sample_ms = std::stoi(x);
      else if (k == "--inject")
        a.inject = x;
      else if (k == "--json")
        a.json = x;
      else if (k == "--option") {
        if (!ParseKeyValue(x, &a.options)) return InvalidArgument("--option wants key=value");
      } else if (k == "--client-option") {
        if (!ParseKeyValue(x, &a.client_options))
          return InvalidArgument("--client-option wants key=value");
      } else {
        return InvalidArgument("unknown option " + k);
      }
    } catch (const std::exception&) {
      return InvalidArgument("bad value for " + k + ": " + x);
    }
  }
  if (a.clients < 1 || a.rounds < 2 || a.round_timeout_s < 1 || a.sample_ms < 1)
    return InvalidArgument("need --clients >= 1, --rounds >= 2, positive timeouts");
  if (a.inject != "none" && a.inject != "damage" && a.inject != "skip" && a.inject != "fd-leak" &&
      a.inject != "rss-leak")
    return InvalidArgument("--inject: none, damage, skip, fd-leak or rss-leak");
  if (a.backend == "grpc" && !a.client_options.count("recycle_bytes"))
    a.client_options["recycle_bytes"] = "0";
  return a;
}

KeyValues ClientBackendOptions(const Args& a) {
  KeyValues o = a.options;
  for (const auto& [k, v] : a.client_options) o[k] = v;
  return o;
}

std::string Mb(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", static_cast<double>(bytes) / kMB);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* spec = std::getenv("XSILO_BROADCAST_SOAK_CLIENT")) {
    std::vector<std::string> f;
    std::stringstream in(spec);
    for (std::string part; std::getline(in, part, '\x1f');) f.push_back(part);
    if (f.size() < 2) return 9;
    auto a = ParseArgs({f.begin() + 2, f.end()});
    if (!a.ok()) return 9;
    a->options = ClientBackendOptions(*a);
    return RunClient(*a, f[0], std::stoi(f[1]));
  }

  auto parsed = ParseArgs({argv + 1, argv + argc});
  if (!parsed.ok()) return Usage(parsed.status().ToString());
  const Args a = std::move(parsed).value();
  const auto tier = FindTier(a.tier);
  if (!tier) return Usage("unknown tier " + a.tier);

  const int fds_before_start = OpenFds("self");
  const std::vector<std::string> targets_before_start = FdTargets();
  const std::string address = "127.0.0.1:" + std::to_string(bench::FreeLoopbackPort());
  auto server = TransportRegistry::Global().Create(a.backend, Options(a, address, 0, a.options));
  if (!server.ok()) return Usage(server.status().ToString());
  if (Status s = (*server)->Start(); !s.ok()) return Usage("server start: " + s.ToString());

  std::vector<Client> clients(static_cast<size_t>(a.clients));
  for (int r = 1; r <= a.clients; ++r) {
    const pid_t pid = bench::SpawnSelfWithEnv("XSILO_BROADCAST_SOAK_CLIENT=" +
                                              ClientSpec(address, r, argc, argv));
    if (pid < 0) return Usage("cannot start client process " + std::to_string(r));
    clients[static_cast<size_t>(r - 1)].pid = pid;
  }

  const bool hwm_reset = bench::ResetPeakRss("self");
  if (!hwm_reset)
    std::fprintf(stderr,
                 "broadcast_soak: cannot reset VmHWM (clear_refs): peaks are since start\n");

  std::printf(
      "%s broadcast soak: tier %s (%llu float32 parameters, %.1f MB), %d clients, "
      "%d rounds, MemAvailable at start %.0f MB\n",
      a.backend.c_str(), std::string(tier->name).c_str(),
      static_cast<unsigned long long>(tier->parameters), tier->parameters * 4 / kMB, a.clients,
      a.rounds, MemAvailableBytes() / kMB);
  std::printf("%5s %5s %5s %5s %7s %7s %9s | %9s %9s %4s | %9s %9s %9s %4s | %9s %9s\n", "round",
              "peers", "acked", "miss", "build_s", "bcast_s", "agg_MB/s", "srv_rss", "srv_hwm",
              "fds", "cl_hwm_mx", "cl_rss_mx", "cl_sum_pk", "cfds", "avail_min", "avail_0");
  std::fflush(stdout);

  Sampler sampler(&clients, static_cast<uint64_t>(a.min_available_mb * kMB),
                  std::chrono::milliseconds(a.sample_ms));
  std::vector<Row> rows;
  std::vector<std::vector<bool>> acked(static_cast<size_t>(a.rounds),
                                       std::vector<bool>(static_cast<size_t>(a.clients), false));
  int stray_acks = 0;
  std::vector<int> leaked_fds;
  std::vector<std::unique_ptr<char[]>> leaked_memory;
  const auto started = Clock::now();

  for (int round = 0; round < a.rounds && !sampler.tripped(); ++round) {
    sampler.Reap();
    std::vector<int32_t> peers;
    for (int r = 1; r <= a.clients; ++r) {
      const Client& c = clients[static_cast<size_t>(r - 1)];
      if (!c.exited) peers.push_back(r);
    }
    Row row;
    row.round = round + 1;
    row.peers = static_cast<int>(peers.size());
    if (peers.empty()) {
      row.missed = a.clients;
      row.broadcast = "no live client";
      rows.push_back(row);
      break;
    }
    bench::ResetPeakRss("self");
    for (const Client& c : clients) {
      if (!c.exited) bench::ResetPeakRss(std::to_string(c.pid));
    }
    sampler.Take();  // a new window
    row.available_start = MemAvailableBytes();

    const auto build0 = Clock::now();
    auto model = bench::MakeModel(tier->parameters, static_cast<uint64_t>(round) + 1);
    if (!model.ok()) return Usage("model: " + model.status().ToString());
    model->round = round;
    row.model_bytes = model->payload_bytes();
    const auto t0 = Clock::now();
    row.build_seconds = std::chrono::duration<double>(t0 - build0).count();
    auto sent = std::make_shared<std::promise<Status>>();
    std::future<Status> sent_future = sent->get_future();
    (*server)->BroadcastAsync(peers, std::move(model).value(),
                              [sent](Status s) { sent->set_value(std::move(s)); });

    const auto deadline = t0 + std::chrono::seconds(a.round_timeout_s);
    auto& got = acked[static_cast<size_t>(round)];
    std::vector<bool> answered(static_cast<size_t>(a.clients), false);
    while (Clock::now() < deadline && !sampler.tripped()) {
      sampler.Reap();
      int left = 0;
      for (int32_t r : peers) {
        if (!answered[static_cast<size_t>(r - 1)] && !clients[static_cast<size_t>(r - 1)].exited)
          ++left;
      }
      if (left == 0) break;
      auto ack = (*server)->Receive(std::chrono::seconds(1));
      if (!ack.ok()) {
        if (ack.status().code() == StatusCode::kTimeout) continue;
        std::fprintf(stderr, "receive: %s\n", ack.status().ToString().c_str());
        break;
      }
      const int32_t r = ack->sender;
      if (r < 1 || r > a.clients || ack->round != round || answered[static_cast<size_t>(r - 1)]) {
        ++stray_acks;
        continue;
      }
      answered[static_cast<size_t>(r - 1)] = true;
      if (ack->type == "ok")
        got[static_cast<size_t>(r - 1)] = true;
      else
        ++row.damaged;
    }
    const auto left_time = std::max(Clock::duration::zero(), deadline - Clock::now());
    if (sent_future.wait_for(sampler.tripped() ? std::chrono::seconds(5) : left_time) ==
        std::future_status::ready) {
      Status s = sent_future.get();
      row.broadcast = s.ok() ? "ok" : s.ToString();
    } else {
      row.broadcast = "not finished by the round's deadline";
    }
    row.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    for (int r = 1; r <= a.clients; ++r) {
      if (got[static_cast<size_t>(r - 1)])
        ++row.acked;
      else
        ++row.missed;
    }

    if (row.round >= 2 && a.inject == "fd-leak") leaked_fds.push_back(open("/dev/null", O_RDONLY));
    if (row.round >= 2 && a.inject == "rss-leak") {
      constexpr size_t kLeak = 64u << 20;
      leaked_memory.emplace_back(new char[kLeak]);
      std::memset(leaked_memory.back().get(), 1, kLeak);
    }

    row.server_rss = bench::StatusBytes("self", "VmRSS");
    row.server_hwm = bench::StatusBytes("self", "VmHWM");
    row.server_fds = OpenFds("self");
    for (const Client& c : clients) {
      if (c.exited) continue;
      const std::string pid = std::to_string(c.pid);
      const uint64_t hwm = bench::StatusBytes(pid, "VmHWM");
      row.clients_hwm_max = std::max(row.clients_hwm_max, hwm);
      row.clients_hwm_sum += hwm;
      row.clients_rss_max = std::max(row.clients_rss_max, bench::StatusBytes(pid, "VmRSS"));
      row.clients_fds_max = std::max(row.clients_fds_max, OpenFds(pid));
    }
    row.sampled = sampler.Take();
    rows.push_back(row);
    const double agg =
        row.seconds > 0 ? static_cast<double>(row.model_bytes) * row.acked / row.seconds / kMB : 0;
    std::printf("%5d %5d %5d %5d %7.2f %7.2f %9.1f | %9s %9s %4d | %9s %9s %9s %4d | %9s %9s%s\n",
                row.round, row.peers, row.acked, row.missed, row.build_seconds, row.seconds, agg,
                Mb(row.server_rss).c_str(), Mb(row.server_hwm).c_str(), row.server_fds,
                Mb(row.clients_hwm_max).c_str(), Mb(row.clients_rss_max).c_str(),
                Mb(row.sampled.max_clients_rss_sum).c_str(), row.clients_fds_max,
                Mb(row.sampled.min_available).c_str(), Mb(row.available_start).c_str(),
                row.broadcast == "ok" ? "" : ("  broadcast: " + row.broadcast).c_str());
    std::fflush(stdout);
  }
  const double total_seconds = std::chrono::duration<double>(Clock::now() - started).count();
  std::string end_status = "ok";
  {
    sampler.Reap();
    std::vector<int32_t> live;
    for (int r = 1; r <= a.clients; ++r) {
      if (!clients[static_cast<size_t>(r - 1)].exited) live.push_back(r);
    }
    Message end;
    end.type = "end";
    if (!live.empty()) {
      if (Status s = (*server)->Broadcast(live, std::move(end), std::chrono::seconds(60)); !s.ok())
        end_status = s.ToString();
    }
  }

  // Clients exit after their last ack; give them the transport's drain.
  const auto exit_deadline = Clock::now() + std::chrono::seconds(120);
  for (;;) {
    sampler.Reap();
    const bool all =
        std::all_of(clients.begin(), clients.end(), [](const Client& c) { return c.exited; });
    if (all) break;
    if (Clock::now() >= exit_deadline) {
      sampler.KillClients();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  (*server)->Stop();
  for (int fd : leaked_fds) close(fd);
  leaked_memory.clear();
  const int fds_after_stop = OpenFds("self");
  std::vector<std::string> left_open;  // open after stop, not before start
  {
    const std::vector<std::string> after = FdTargets();
    std::set_difference(after.begin(), after.end(), targets_before_start.begin(),
                        targets_before_start.end(), std::back_inserter(left_open));
  }

  // Verdict.
  std::vector<std::string> failures;
  auto fail = [&](const std::string& kind, const std::string& what) {
    failures.push_back(kind + ": " + what);
    std::printf("FAIL %s: %s\n", kind.c_str(), what.c_str());
  };
  if (sampler.tripped()) {
    fail("memory", "MemAvailable fell to " + Mb(sampler.tripped_available()) + " MB (floor " +
                       Mb(static_cast<uint64_t>(a.min_available_mb * kMB)) +
                       " MB) with the clients holding " + Mb(sampler.tripped_clients_rss_sum()) +
                       " MB; every client was killed");
  }
  int missed = 0, damaged = 0;
  for (const Row& r : rows) damaged += r.damaged;
  for (int round = 0; round < a.rounds; ++round) {
    for (int c = 0; c < a.clients; ++c) {
      if (!acked[static_cast<size_t>(round)][static_cast<size_t>(c)]) ++missed;
    }
  }
  if (missed > 0)
    fail("missed", std::to_string(missed) + " of " + std::to_string(a.rounds * a.clients) +
                       " (client, round) without a verified model");
  if (damaged > 0) fail("damaged", std::to_string(damaged) + " models failed their checksum");
  if (stray_acks > 0) fail("stray", std::to_string(stray_acks) + " acks of no pending round");
  for (const Row& r : rows) {
    if (r.broadcast != "ok")
      fail("broadcast", "round " + std::to_string(r.round) + ": " + r.broadcast);
  }
  if (end_status != "ok") fail("end", "the end message: " + end_status);
  int bad_exits = 0;
  for (const Client& c : clients) bad_exits += c.exit_code != 0;
  if (bad_exits > 0) fail("exit", std::to_string(bad_exits) + " client processes exited non-zero");
  const Row* second = rows.size() >= 2 ? &rows[1] : nullptr;
  const Row* last = rows.empty() ? nullptr : &rows.back();
  double rss_growth_mb = 0;
  if (second == nullptr || static_cast<int>(rows.size()) < a.rounds) {
    fail("rounds", "ran " + std::to_string(rows.size()) + " of " + std::to_string(a.rounds));
  }
  if (second != nullptr) {
    if (last->server_fds > second->server_fds)
      fail("fds", "server descriptors " + std::to_string(second->server_fds) + " at round 2, " +
                      std::to_string(last->server_fds) + " at round " +
                      std::to_string(last->round));
    rss_growth_mb =
        (static_cast<double>(last->server_rss) - static_cast<double>(second->server_rss)) / kMB;
    if (rss_growth_mb > a.max_server_rss_growth_mb) {
      char what[160];
      std::snprintf(what, sizeof what,
                    "server VmRSS %.1f MB at round 2, %.1f MB at round %d: +%.1f MB > %.1f MB",
                    second->server_rss / kMB, last->server_rss / kMB, last->round, rss_growth_mb,
                    a.max_server_rss_growth_mb);
      fail("rss", what);
    }
  }

  nlohmann::json j;
  j["benchmark"] = "broadcast_soak";
  j["backend"] = a.backend;
  j["tier"] = std::string(tier->name);
  j["parameters"] = tier->parameters;
  j["clients"] = a.clients;
  j["rounds"] = a.rounds;
  j["inject"] = a.inject;
  j["options"] = a.options;
  j["client_options"] = a.client_options;
  j["max_server_rss_growth_mb"] = a.max_server_rss_growth_mb;
  j["min_available_mb"] = a.min_available_mb;
  j["sample_ms"] = a.sample_ms;
  j["hwm_reset"] = hwm_reset;
  j["seconds"] = total_seconds;
  j["server_fds_before_start"] = fds_before_start;
  j["server_fds_after_stop"] = fds_after_stop;
  j["server_fds_left_open_after_stop"] = left_open;
  j["end_message"] = end_status;
  j["server_rss_growth_mb"] = rss_growth_mb;
  j["memory_floor_tripped"] = sampler.tripped();
  j["missed"] = missed;
  j["damaged"] = damaged;
  j["client_exit_codes"] = nlohmann::json::array();
  for (const Client& c : clients) j["client_exit_codes"].push_back(c.exit_code);
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    j["rows"].push_back({{"round", r.round},
                         {"peers", r.peers},
                         {"acked", r.acked},
                         {"damaged", r.damaged},
                         {"missed", r.missed},
                         {"broadcast", r.broadcast},
                         {"build_seconds", r.build_seconds},
                         {"seconds", r.seconds},
                         {"model_bytes", r.model_bytes},
                         {"server_rss_bytes", r.server_rss},
                         {"server_hwm_bytes", r.server_hwm},
                         {"server_fds", r.server_fds},
                         {"clients_hwm_max_bytes", r.clients_hwm_max},
                         {"clients_hwm_sum_bytes", r.clients_hwm_sum},
                         {"clients_rss_end_max_bytes", r.clients_rss_max},
                         {"clients_fds_max", r.clients_fds_max},
                         {"clients_rss_sum_peak_sampled_bytes", r.sampled.max_clients_rss_sum},
                         {"mem_available_min_bytes", r.sampled.min_available},
                         {"mem_available_start_bytes", r.available_start},
                         {"samples", r.sampled.samples}});
  }
  j["failures"] = failures;
  j["ok"] = failures.empty();
  std::ofstream(a.json) << j.dump(1) << "\n";

  std::printf(
      "srv_rss: server VmRSS at the round's end (model dropped); srv_hwm: its peak in the round;\n"
      "cl_hwm_mx: largest client peak in the round; cl_rss_mx: largest client VmRSS at the "
      "round's end;\ncl_sum_pk: highest sampled sum of the clients' VmRSS; avail_min: lowest "
      "sampled MemAvailable (every %d ms), avail_0: at the round's start (MB)\n",
      a.sample_ms);
  std::string left;
  for (const std::string& t : left_open) left += " " + t;
  std::printf(
      "server fds: %d before start, %d after stop (new:%s); server RSS round 2 -> last: "
      "%+.1f MB (bound %.1f)\n",
      fds_before_start, fds_after_stop, left.empty() ? " none" : left.c_str(), rss_growth_mb,
      a.max_server_rss_growth_mb);
  std::printf("%d rounds in %.1f s; wrote %s: %s\n", static_cast<int>(rows.size()), total_seconds,
              a.json.c_str(), failures.empty() ? "ok" : "FAILED");
  return failures.empty() ? 0 : 1;
}
