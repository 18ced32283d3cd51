// `xsilo bench`: the peer-to-peer benchmark suite (docs/benchmarks.md).
//   p2p        latency, concurrency speedup, sender memory, serialization share
//              and the link's iperf3 reference, per environment, backend and tier
//   plot       PNG figures (paper Figures 2 and 4) from a results directory
//   p2p-peer   (internal) one party of a p2p measurement, started by `p2p`
//
// Every measurement runs in two or more fresh processes: the sender (rank 0)
// in the emulator's `server` site, the receivers (ranks 1..) in `client1`.
// The coordinator (this process) only brings the environment up, starts the
// peers, collects their result file and tears everything down.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "commands.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/tiers.h"
#include "xsilo/netem/netem.h"
#include "xsilo/netem/probe.h"
#include "xsilo/transport/registry.h"

extern char** environ;

#ifndef XSILO_SOURCE_DIR
#define XSILO_SOURCE_DIR ""
#endif

namespace xsilo::cli {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Backends. One row per name accepted by --backends. `transport` is the
// TransportRegistry name, `options` its TransportOptions::backend.
//
// A new backend is one row here (and in kDefaultBackends); nothing else in
// the benchmark is backend-specific.
struct BackendSpec {
  std::string name;
  std::string transport;
  std::map<std::string, std::string> options;
  // The sender or receiver copies the whole message through the codec
  // (flattened frame, or chunk copies of the frame): the serialization share
  // counts EncodeMessage + Flatten + DecodeMessage; otherwise Encode (gather
  // list, no copy) + Decode.
  bool serializes = true;
  // Ranks must be launched by mpirun.
  bool needs_mpirun = false;
  // Only runs when sender and receiver share a host address (lan).
  bool loopback_only = false;
};

const std::vector<BackendSpec>& Backends() {
  static const std::vector<BackendSpec> kBackends = {
      {"grpc", "grpc", {{"streams", "1"}}, true, false, false},
      {"grpc-s4", "grpc", {{"streams", "4"}}, true, false, false},
      // Unary mode dials rank r at the server's host, port + r: all ranks
      // must share one address.
      {"grpc-unary", "grpc", {{"mode", "unary"}}, true, false, true},
      {"grpc+s3", "grpc+s3", {}, false, false, false},
      {"mpi-generic", "mpi-generic", {}, true, true, false},
      {"mpi-buffer", "mpi-buffer", {}, false, true, false},
      // uv transport (TCP) and the basic channel, as PyTorch RPC between hosts.
      {"tensorpipe", "tensorpipe", {}, false, false, false},
  };
  return kBackends;
}
const char* kDefaultBackends = "grpc,grpc-s4,grpc-unary,grpc+s3,mpi-generic,mpi-buffer,tensorpipe";

const BackendSpec* FindBackend(const std::string& name) {
  for (const auto& b : Backends())
    if (b.name == name) return &b;
  return nullptr;
}

// ---------------------------------------------------------------------------
// Small helpers.

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

uint64_t StatusField(const std::string& path, const char* key) {
  std::ifstream in(path);
  std::string line;
  const size_t klen = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, klen, key) == 0 && line.size() > klen && line[klen] == ':')
      return std::stoull(line.substr(klen + 1)) * 1024;
  }
  return 0;
}
uint64_t SelfField(const char* key) { return StatusField("/proc/self/status", key); }

void ResetPeak(const std::string& pid = "self") {
  std::ofstream out("/proc/" + pid + "/clear_refs");
  out << "5";
}

// Our child processes (the embedded S3 server of grpc+s3).
std::vector<pid_t> Children() {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task : fs::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(task.path() / "children");
    pid_t pid;
    while (in >> pid) out.push_back(pid);
  }
  return out;
}
void ResetChildrenPeak() {
  for (pid_t p : Children()) ResetPeak(std::to_string(p));
}
uint64_t ChildrenPeak() {
  uint64_t sum = 0;
  for (pid_t p : Children()) sum += StatusField("/proc/" + std::to_string(p) + "/status", "VmHWM");
  return sum;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
// Nearest-rank percentile.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

std::string Fixed(double v, int digits) {
  std::ostringstream ss;
  ss << std::fixed << std::setprecision(digits) << v;
  return ss.str();
}

// ---------------------------------------------------------------------------
// The model: one float32 tensor with the tier's exact parameter count, and
// its XXH3-64 in a param so the receiver verifies what it holds.

Result<Message> MakeModel(uint64_t params, uint64_t seed) {
  XSILO_ASSIGN_OR_RETURN(Buffer b, Buffer::Allocate(params * 4));
  auto* p = reinterpret_cast<float*>(b.mutable_data());
  for (uint64_t i = 0; i < params; ++i)
    p[i] = static_cast<float>((i * 2654435761u + seed) % 1000) * 1e-3f;
  Message m;
  m.type = "model";
  m.params["xxh3"] = static_cast<int64_t>(Checksum(b.span()));
  XSILO_ASSIGN_OR_RETURN(Tensor t, Tensor::Make(DType::kF32, {static_cast<int64_t>(params)}, b));
  m.tensors.emplace("w", std::move(t));
  return m;
}

// Makes the content unique (so hybrid backends cannot reuse an object of an
// earlier send) by writing `stamp` into the first parameter. Only call once
// every earlier send of the model completed.
void Stamp(Message* m, int64_t stamp) {
  Tensor& t = m->tensors.at("w");
  auto* p = reinterpret_cast<float*>(t.data.mutable_data());
  p[0] = static_cast<float>(stamp) + 0.5f;
  m->params["xxh3"] = static_cast<int64_t>(Checksum(t.data.span()));
  m->params["stamp"] = stamp;
}

bool Intact(const Message& m) {
  auto it = m.tensors.find("w");
  auto sum = m.GetInt("xxh3");
  return it != m.tensors.end() && sum.ok() &&
         static_cast<int64_t>(Checksum(it->second.data.span())) == *sum;
}

// ---------------------------------------------------------------------------
// Peer processes. The coordinator passes a JSON spec.

struct PeerSpec {
  std::string role;  // sender | receiver
  int rank = 0;
  int world = 2;
  std::string address;
  std::string transport;
  std::map<std::string, std::string> options;
  std::string prefix;  // netem instance, empty for lan
  std::string site;    // site to enter, empty for lan
  uint64_t parameters = 0;
  int warmup = 1;
  int repeats = 3;
  int concurrent = 0;  // 0 = skip (b)
  std::vector<int> dispatch_points;
  bool broadcast = false;
  bool serializes = true;
  double timeout_s = 600;  // per wait for one batch of acks
  std::string result;
};

json ToJson(const PeerSpec& s) {
  return json{{"role", s.role},
              {"rank", s.rank},
              {"world", s.world},
              {"address", s.address},
              {"transport", s.transport},
              {"options", s.options},
              {"prefix", s.prefix},
              {"site", s.site},
              {"parameters", s.parameters},
              {"warmup", s.warmup},
              {"repeats", s.repeats},
              {"concurrent", s.concurrent},
              {"dispatch_points", s.dispatch_points},
              {"broadcast", s.broadcast},
              {"serializes", s.serializes},
              {"timeout_s", s.timeout_s},
              {"result", s.result}};
}

PeerSpec FromJson(const json& j) {
  PeerSpec s;
  s.role = j.at("role");
  s.rank = j.at("rank");
  s.world = j.at("world");
  s.address = j.at("address");
  s.transport = j.at("transport");
  s.options = j.at("options").get<std::map<std::string, std::string>>();
  s.prefix = j.at("prefix");
  s.site = j.at("site");
  s.parameters = j.at("parameters");
  s.warmup = j.at("warmup");
  s.repeats = j.at("repeats");
  s.concurrent = j.at("concurrent");
  s.dispatch_points = j.at("dispatch_points").get<std::vector<int>>();
  s.broadcast = j.at("broadcast");
  s.serializes = j.at("serializes");
  s.timeout_s = j.at("timeout_s");
  s.result = j.at("result");
  return s;
}

Duration Seconds(double s) { return Duration(static_cast<int64_t>(s * 1000)); }

// The sender's view of outstanding sends: callbacks record the first error.
struct SendErrors {
  std::mutex mu;
  Status first;
  void Record(const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (!s.ok() && first.ok()) first = s;
  }
  Status Get() {
    std::lock_guard<std::mutex> lock(mu);
    return first;
  }
};

// Waits for one ack per sequence number in `seqs`; returns seq -> receive
// time (steady clock ns, the receiver's, same machine so same clock).
// With `per_seq` > 1 (a broadcast), waits for that many acks per number and
// keeps the latest time.
Result<std::map<int64_t, int64_t>> WaitAcks(Transport& t, const std::set<int64_t>& seqs,
                                            double timeout_s, SendErrors* errors,
                                            size_t per_seq = 1) {
  std::map<int64_t, int64_t> out;
  size_t got = 0;
  const auto deadline = Clock::now() + Seconds(timeout_s);
  while (got < seqs.size() * per_seq) {
    Status e = errors->Get();
    if (!e.ok()) return e;
    auto left = std::chrono::duration_cast<Duration>(deadline - Clock::now());
    if (left.count() <= 0) return Timeout("waiting for the receivers' acknowledgements");
    auto m = t.Receive(std::min(left, Duration(1000)));
    if (!m.ok()) {
      if (m.status().code() == StatusCode::kTimeout) continue;
      return m.status();
    }
    if (m->type != "ack") continue;
    auto seq = m->GetInt("seq");
    auto ok = m->GetInt("ok");
    auto ns = m->GetInt("recv_ns");
    if (!seq.ok() || !ok.ok() || !ns.ok()) return Corrupt("malformed ack");
    if (*ok != 1)
      return Corrupt("receiver " + std::to_string(m->sender) + " got a damaged model (seq " +
                     std::to_string(*seq) + ")");
    if (seqs.count(*seq)) {
      out[*seq] = std::max(out[*seq], *ns);
      ++got;
    }
  }
  return out;
}

Status RunSender(const PeerSpec& spec, Transport& t, json* result) {
  // Receivers announce themselves once started.
  std::set<int64_t> ready;
  for (int r = 1; r < spec.world; ++r) ready.insert(-r);
  SendErrors errors;
  const auto started = Clock::now();
  json phases = json::object();
  auto phase = [&](const char* name) {
    phases[name] = std::chrono::duration<double>(Clock::now() - started).count();
    (*result)["phases_s"] = phases;
  };
  XSILO_RETURN_IF_ERROR(WaitAcks(t, ready, 120, &errors).status());
  phase("ready");

  XSILO_ASSIGN_OR_RETURN(Message model, MakeModel(spec.parameters, 1));
  const uint64_t model_bytes = model.payload_bytes();
  (*result)["model_bytes"] = model_bytes;
  int64_t seq = 0;
  auto send = [&](int32_t peer, const Message& m, int64_t s) {
    Message copy = m;  // shares the tensor Buffers
    copy.params["seq"] = s;
    t.SendAsync(peer, std::move(copy), [&errors](const Status& st) { errors.Record(st); });
  };

  // (a) latency: warm-up sends, then `repeats` sends, each waited for.
  std::vector<double> latency_ms;
  for (int r = 0; r < spec.warmup + spec.repeats; ++r) {
    Stamp(&model, ++seq);
    const int64_t t0 = NowNs();
    send(1, model, seq);
    XSILO_ASSIGN_OR_RETURN(auto acks, WaitAcks(t, {seq}, spec.timeout_s, &errors));
    if (r >= spec.warmup) latency_ms.push_back(static_cast<double>(acks[seq] - t0) / 1e6);
  }
  (*result)["latency_ms"] = latency_ms;
  phase("latency");

  // (b) N distinct messages one after another, then all at once.
  if (spec.concurrent > 0) {
    std::vector<Message> batch;
    for (int i = 0; i < spec.concurrent; ++i) {
      XSILO_ASSIGN_OR_RETURN(Message m, MakeModel(spec.parameters, 100 + i));
      batch.push_back(std::move(m));
    }
    auto t0 = Clock::now();
    for (auto& m : batch) {
      send(1, m, ++seq);
      XSILO_RETURN_IF_ERROR(WaitAcks(t, {seq}, spec.timeout_s, &errors).status());
    }
    const double seq_s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::set<int64_t> seqs;
    for (auto& m : batch) Stamp(&m, ++seq + 1000000);  // fresh content
    const uint64_t before = SelfField("VmRSS");
    ResetPeak();
    t0 = Clock::now();
    for (auto& m : batch) {
      seqs.insert(++seq);
      send(1, m, seq);
    }
    XSILO_RETURN_IF_ERROR(WaitAcks(t, seqs, spec.timeout_s * spec.concurrent, &errors).status());
    const double conc_s = std::chrono::duration<double>(Clock::now() - t0).count();
    (*result)["concurrency"] = {{"n", spec.concurrent},       {"sequential_s", seq_s},
                                {"concurrent_s", conc_s},     {"speedup", seq_s / conc_s},
                                {"rss_before_bytes", before}, {"peak_bytes", SelfField("VmHWM")}};
    phase("concurrency");
  }

  // (c) Figure 2: the same model dispatched n times at once.
  json dispatch = json::array();
  for (int n : spec.dispatch_points) {
    Stamp(&model, ++seq + 2000000);
    const uint64_t before = SelfField("VmRSS");
    ResetPeak();
    ResetChildrenPeak();
    auto t0 = Clock::now();
    std::set<int64_t> seqs;
    for (int i = 0; i < n; ++i) {
      seqs.insert(++seq);
      send(1, model, seq);
    }
    XSILO_RETURN_IF_ERROR(WaitAcks(t, seqs, spec.timeout_s * n, &errors).status());
    dispatch.push_back({{"n", n},
                        {"seconds", std::chrono::duration<double>(Clock::now() - t0).count()},
                        {"rss_before_bytes", before},
                        {"peak_bytes", SelfField("VmHWM")},
                        {"helpers_peak_bytes", ChildrenPeak()}});
  }
  (*result)["dispatch"] = dispatch;
  phase("dispatch");

  // (c) a concurrent broadcast to every receiver.
  if (spec.broadcast && spec.world > 2) {
    Stamp(&model, ++seq + 3000000);
    model.params["seq"] = seq;
    std::vector<int32_t> peers;
    for (int r = 1; r < spec.world; ++r) peers.push_back(r);
    const uint64_t before = SelfField("VmRSS");
    ResetPeak();
    ResetChildrenPeak();
    auto t0 = Clock::now();
    t.BroadcastAsync(peers, model, [&errors](const Status& st) { errors.Record(st); });
    XSILO_RETURN_IF_ERROR(
        WaitAcks(t, {seq}, spec.timeout_s * peers.size(), &errors, peers.size()).status());
    (*result)["broadcast"] = {
        {"peers", peers.size()},
        {"rss_before_bytes", before},
        {"peak_bytes", SelfField("VmHWM")},
        {"helpers_peak_bytes", ChildrenPeak()},
        {"seconds", std::chrono::duration<double>(Clock::now() - t0).count()}};
    phase("broadcast");
  }

  // (d) codec time for the same message, in this process.
  std::vector<double> enc, dec;
  for (int i = 0; i < 3; ++i) {
    auto t0 = Clock::now();
    EncodedFrame f = EncodeMessage(model);
    auto t_gather = Clock::now();
    XSILO_ASSIGN_OR_RETURN(Buffer flat, f.bytes.Flatten());
    auto t1 = Clock::now();
    XSILO_ASSIGN_OR_RETURN(Message back, DecodeMessage(flat));
    auto t2 = Clock::now();
    if (!Intact(back)) return Internal("codec round trip damaged the model");
    // Backends that send from the tensors' own Buffers skip the copy.
    enc.push_back(
        std::chrono::duration<double, std::milli>((spec.serializes ? t1 : t_gather) - t0).count());
    dec.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  (*result)["encode_ms"] = Median(enc);
  (*result)["decode_ms"] = Median(dec);
  phase("codec");
  return Status::OK();
}

Status RunReceiver(const PeerSpec& spec, Transport& t) {
  Message hello;
  hello.type = "ack";
  hello.params["seq"] = static_cast<int64_t>(-spec.rank);
  hello.params["ok"] = static_cast<int64_t>(1);
  hello.params["recv_ns"] = NowNs();
  XSILO_RETURN_IF_ERROR(t.Send(0, std::move(hello), std::chrono::seconds(120)));
  // Generous: the sender builds models between sends.
  const Duration idle = Seconds(std::max(600.0, spec.timeout_s * 60));
  for (;;) {
    XSILO_ASSIGN_OR_RETURN(Message m, t.Receive(idle));
    if (m.type == "done") return Status::OK();
    const bool ok = Intact(m);
    const int64_t at = NowNs();
    auto seq = m.GetInt("seq");
    Message ack;
    ack.type = "ack";
    ack.params["seq"] = seq.ok() ? *seq : int64_t{0};
    ack.params["ok"] = static_cast<int64_t>(ok ? 1 : 0);
    ack.params["recv_ns"] = at;
    m = Message();  // drop the model before acking
    XSILO_RETURN_IF_ERROR(t.Send(0, std::move(ack), std::chrono::seconds(120)));
  }
}

int RunPeer(const std::string& spec_text) {
  const auto t_start = Clock::now();
  PeerSpec spec;
  try {
    spec = FromJson(json::parse(spec_text));
  } catch (const std::exception& e) {
    std::cerr << "p2p-peer: bad spec: " << e.what() << "\n";
    return 2;
  }
  if (const char* r = std::getenv("OMPI_COMM_WORLD_RANK")) {  // launched by mpirun
    spec.rank = std::atoi(r);
    spec.role = spec.rank == 0 ? "sender" : "receiver";
  }
  // Enter the site before any thread or socket exists, so that everything
  // this process (and the children it forks) opens belongs to the site.
  if (!spec.site.empty()) {
    netem::Options o;
    o.prefix = spec.prefix;
    auto state = netem::LoadState(o);
    if (!state.ok()) {
      std::cerr << "p2p-peer: " << state.status().ToString() << "\n";
      return 3;
    }
    auto site = netem::FindSite(*state, spec.site);
    Status s = site.ok() ? netem::EnterSite(*state, *site) : site.status();
    if (!s.ok()) {
      std::cerr << "p2p-peer: " << s.ToString() << "\n";
      return 3;
    }
  }
  TransportOptions o;
  o.rank = spec.rank;
  o.world_size = spec.world;
  o.address = spec.address;
  o.backend = spec.options;
  o.connect_timeout = std::chrono::seconds(120);
  auto t = TransportRegistry::Global().Create(spec.transport, o);
  Status s = t.ok() ? (*t)->Start() : t.status();
  auto log = [&](const std::string& what) {
    std::fprintf(stderr, "[%8.3f s] %s rank %d: %s\n",
                 std::chrono::duration<double>(Clock::now() - t_start).count(), spec.role.c_str(),
                 spec.rank, what.c_str());
  };
  log("transport " + spec.transport + " started at " + spec.address + ": " + s.ToString());
  json result;
  if (s.ok()) {
    if (spec.role == "sender") {
      s = RunSender(spec, **t, &result);
      for (int r = 1; r < spec.world; ++r) {  // release the receivers, even after a failure
        Message done;
        done.type = "done";
        (void)(*t)->Send(r, std::move(done), std::chrono::seconds(30));
      }
    } else {
      s = RunReceiver(spec, **t);
    }
  }
  log("measurements done: " + s.ToString());
  if (t.ok()) (*t)->Stop();
  log("transport stopped");
  if (spec.role == "sender") {
    result["ok"] = s.ok();
    result["error"] = s.ok() ? "" : s.ToString();
    std::ofstream out(spec.result);
    out << result.dump() << "\n";
  }
  if (!s.ok()) {
    std::cerr << "p2p-peer " << spec.role << " rank " << spec.rank << ": " << s.ToString() << "\n";
    return 1;
  }
  return 0;
}

// ---------------------------------------------------------------------------
// Coordinator.

// Child process groups to kill on a signal or failure.
std::mutex g_children_mu;
std::set<pid_t> g_children;
bool g_stopping = false;  // under g_children_mu: no new peers
std::atomic<bool> g_netem_up{false};
std::string g_netem_prefix;
std::string g_tmpdir;

void KillChildren() {
  std::lock_guard<std::mutex> lock(g_children_mu);
  g_stopping = true;
  for (pid_t p : g_children) kill(-p, SIGKILL);
}

// SIGINT/SIGTERM/SIGHUP are blocked in every thread; this one waits for them
// and cleans up: peers, the emulator, the temporary directory.
void StartSignalWatcher() {
  static std::once_flag once;
  std::call_once(once, [] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread([set] {
      int sig = 0;
      sigwait(&set, &sig);
      std::cerr << "\nxsilo bench p2p: signal " << sig << ", cleaning up\n";
      KillChildren();
      if (g_netem_up) {
        netem::Options o;
        o.prefix = g_netem_prefix;
        (void)netem::Down(o);
      }
      std::error_code ec;
      if (!g_tmpdir.empty()) fs::remove_all(g_tmpdir, ec);
      _exit(128 + sig);
    }).detach();
  });
}

// Starts argv[0] (a path) in its own process group, stdout and stderr
// appended to `log`. Signals stay unblocked in the child.
Result<pid_t> SpawnArgv(std::vector<std::string> args, const std::string& log) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
  pid_t pid = -1;
  std::lock_guard<std::mutex> lock(g_children_mu);
  if (g_stopping) {
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    return Cancelled("stopping");
  }
  int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Internal(std::string("posix_spawn: ") + strerror(rc));
  g_children.insert(pid);
  return pid;
}

std::string SelfExe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : p.string();
}

// This binary as `xsilo bench p2p-peer --spec JSON`.
Result<pid_t> SpawnPeer(const PeerSpec& spec, const std::string& log) {
  return SpawnArgv({SelfExe(), "bench", "p2p-peer", "--spec", ToJson(spec).dump()}, log);
}

// Every rank of an MPI backend under one mpirun (lan: one host, TCP forced).
// Each rank takes its rank from OMPI_COMM_WORLD_RANK.
Result<pid_t> SpawnMpiPeers(const PeerSpec& spec, const std::string& log) {
  return SpawnArgv(
      {"mpirun", "-np", std::to_string(spec.world), "--oversubscribe", "--allow-run-as-root",
       "--mca", "btl", "tcp,self", SelfExe(), "bench", "p2p-peer", "--spec", ToJson(spec).dump()},
      log);
}

// True once `pid` (our child) exited; does not reap it.
bool Exited(pid_t pid) {
  siginfo_t si{};
  return waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOHANG | WNOWAIT) != 0 ||
         si.si_pid != 0;
}

// Waits for every pid until `deadline`; kills the groups of those left.
// Returns the number that failed (non-zero exit, signal, or killed).
int WaitPeers(const std::vector<pid_t>& pids, Clock::time_point deadline, bool* timed_out) {
  std::set<pid_t> left(pids.begin(), pids.end());
  int failed = 0;
  while (!left.empty()) {
    for (auto it = left.begin(); it != left.end();) {
      int st = 0;
      pid_t r = waitpid(*it, &st, WNOHANG);
      if (r == *it) {
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failed;
        kill(-*it, SIGKILL);  // anything it left in its group (the S3 server)
        std::lock_guard<std::mutex> lock(g_children_mu);
        g_children.erase(*it);
        it = left.erase(it);
      } else {
        ++it;
      }
    }
    if (left.empty()) break;
    if (Clock::now() > deadline) {
      *timed_out = true;
      for (pid_t p : left) kill(-p, SIGTERM);  // mpirun stops its ranks on TERM
      std::this_thread::sleep_for(std::chrono::seconds(2));
      for (pid_t p : left) kill(-p, SIGKILL);
      for (pid_t p : left) {
        waitpid(p, nullptr, 0);
        std::lock_guard<std::mutex> lock(g_children_mu);
        g_children.erase(p);
        ++failed;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return failed;
}

// True once a TCP socket in `pid`'s network namespace listens on `port`
// (/proc/PID/net/tcp shows the namespace of that process).
bool Listening(pid_t pid, int port) {
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
      if (st == "0A" && local.size() >= 5 && local.compare(local.size() - 5, 5, want) == 0)
        return true;
    }
  }
  return false;
}

struct P2pArgs {
  std::string envs = "lan,geo-proximal,ca-va,ca-hk";
  std::string tiers = "small,medium,big,large";
  std::string backends = kDefaultBackends;
  int repeats = 5;
  double scale = 0.1;
  bool quick = false;
  std::string out;
  std::string prefix = "xsilo-p2p";
  int link_seconds = 8;
  int broadcast_peers = 4;
  std::string dispatch = "1,2,5,10,20,30,40,50";
  std::string dispatch_tier = "medium";
  std::string dispatch_envs = "lan";
  bool no_concurrency = false;
  // NAME:KEY=VALUE, added to backend NAME's options.
  std::vector<std::string> backend_options;
};

struct LinkRef {
  bool measured = false;
  double rtt_ms = 0, single_MBps = 0, multi_MBps = 0;
  int streams = 0;
  netem::LinkTarget target;
};

std::string Today() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::gmtime(&now));
  return buf;
}

int FreePort() {
  // Ports below the ephemeral range, picked at random: each peer world uses
  // port and (unary) port + world.
  static uint32_t state =
      static_cast<uint32_t>(getpid()) * 2654435761u ^ static_cast<uint32_t>(std::time(nullptr));
  state = state * 1664525u + 1013904223u;
  return 20000 + static_cast<int>(state % 12000);
}

int RunP2p(P2pArgs a, const std::vector<std::string>& explicit_flags) {
  auto given = [&](const std::string& f) {
    return std::find(explicit_flags.begin(), explicit_flags.end(), f) != explicit_flags.end();
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
  for (const auto& b : backend_names) {
    if (!FindBackend(b)) {
      std::cerr << "xsilo bench p2p: unknown backend '" << b << "' (known: " << kDefaultBackends
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
  if (a.out.empty()) a.out = "results/p2p-" + Today();
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
  g_tmpdir = tmpl;
  g_netem_prefix = a.prefix;
  StartSignalWatcher();

  json report;
  report["config"] = {{"envs", envs},
                      {"tiers", SplitList(a.tiers)},
                      {"backends", backend_names},
                      {"repeats", a.repeats},
                      {"scale", a.scale},
                      {"quick", a.quick},
                      {"link_seconds", a.link_seconds},
                      {"broadcast_peers", a.broadcast_peers},
                      {"dispatch_points", dispatch_points},
                      {"dispatch_tier", a.dispatch_tier},
                      {"dispatch_envs", dispatch_envs},
                      {"backend_options", a.backend_options},
                      {"started_utc", Today()}};
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
      g_netem_up = true;
      Status s = netem::Up(*topology, nopt);
      if (!s.ok()) {
        std::cerr << "xsilo bench p2p: " << env << ": netem up: " << s.ToString() << "\n";
        report["not_run"].push_back({{"env", env}, {"reason", "netem up: " + s.ToString()}});
        (void)netem::Down(nopt);
        g_netem_up = false;
        ++failures;
        continue;
      }
      auto st = netem::LoadState(nopt);
      if (!st.ok()) {
        std::cerr << "xsilo bench p2p: " << st.status().ToString() << "\n";
        (void)netem::Down(nopt);
        g_netem_up = false;
        return 1;
      }
      state = *st;
    }
    const std::string server_addr = state.sites[0].address;
    LinkRef link;
    if (state.sites.size() > 1) link.target = state.sites[1].site.target;

    // (e) the physical reference: iperf3 on the same link.
    if (a.link_seconds > 0) {
      netem::CheckOptions co;
      co.seconds = a.link_seconds;
      co.omit_seconds = a.link_seconds >= 4 ? 2 : 1;
      co.port = static_cast<uint16_t>(FreePort());
      if (topology->loopback) co.max_streams = 4;
      std::cout << "[" << elapsed() << "] " << env << ": iperf3 single stream and filled link ("
                << a.link_seconds << " s each)\n"
                << std::flush;
      auto rows = netem::RunCheck(state, co);
      if (rows.ok() && !rows->empty()) {
        const auto& r = rows->front();
        link.measured = true;
        link.rtt_ms = r.rtt_ms;
        link.single_MBps = r.single_MBps;
        link.multi_MBps = r.multi_MBps;
        link.streams = r.streams;
      } else {
        std::cerr << "  link check failed: " << (rows.ok() ? "no rows" : rows.status().ToString())
                  << "\n";
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
      for (const auto& bname : backend_names) {
        const BackendSpec& b = *FindBackend(bname);
        auto skip = [&](const std::string& reason) {
          report["not_run"].push_back(
              {{"env", env}, {"tier", tier_name}, {"backend", bname}, {"reason", reason}});
          std::cout << "  " << std::left << std::setw(12) << bname << std::setw(8) << tier_name
                    << "not run: " << reason << "\n";
        };
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
        std::cout << "[" << elapsed() << "] " << env << " " << tier_name << " " << bname << " ...\n"
                  << std::flush;
        const bool dispatch_here =
            tier_name == a.dispatch_tier &&
            std::find(dispatch_envs.begin(), dispatch_envs.end(), env) != dispatch_envs.end();
        // --quick measures (b) on the small tier only.
        const bool conc_here = !a.no_concurrency && !(a.quick && tier_name != "small");
        const int conc = conc_here ? (tier_name == "large" ? 5 : 10) : 0;
        PeerSpec spec;
        spec.world = 2 + std::max(0, a.broadcast_peers - 1);
        spec.address = server_addr + ":" + std::to_string(FreePort());
        spec.transport = b.transport;
        spec.options = b.options;
        for (const auto& [k, v] : extra_options[bname]) spec.options[k] = v;
        spec.prefix = topology->loopback ? "" : a.prefix;
        spec.parameters = tier->parameters;
        spec.repeats = a.repeats;
        spec.concurrent = conc;
        if (dispatch_here) spec.dispatch_points = dispatch_points;
        spec.broadcast = a.broadcast_peers > 1;
        spec.serializes = b.serializes;
        spec.timeout_s = 120 + 4.0 * static_cast<double>(bytes) / (slow_MBps * 1e6);
        spec.result = g_tmpdir + "/result.json";
        fs::remove(spec.result, ec);
        // The peers' stderr, kept with the results.
        fs::create_directories(a.out + "/logs", ec);
        const std::string log = a.out + "/logs/" + env + "-" + tier_name + "-" + bname + ".log";
        fs::remove(log, ec);
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
            while (!Listening(*pid, port) && Clock::now() < until && !Exited(*pid))
              std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
        }
        // Whole-run budget: every message the sender sends, at the slow rate, x4.
        double messages = 1 + a.repeats + 2.0 * conc + spec.world;
        for (int n : spec.dispatch_points) messages += n;
        const double budget_s =
            300 + 4.0 * messages * static_cast<double>(bytes) / (slow_MBps * 1e6);
        bool timed_out = false;
        int failed = WaitPeers(pids, Clock::now() + Seconds(budget_s), &timed_out);
        {
          std::unique_lock<std::mutex> lock(g_children_mu);
          // A signal arrived: the watcher thread cleans up and exits.
          if (g_stopping) {
            lock.unlock();
            for (;;) pause();
          }
        }
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
          report["runs"].push_back(run);
          continue;
        }
        std::vector<double> lat = result.value("latency_ms", std::vector<double>{});
        run["latency_ms"] = lat;
        run["latency_median_ms"] = Median(lat);
        run["latency_p95_ms"] = Percentile(lat, 95);
        if (result.contains("concurrency")) run["concurrency"] = result["concurrency"];
        run["dispatch"] = result.value("dispatch", json::array());
        if (result.contains("broadcast")) run["broadcast"] = result["broadcast"];
        run["phases_s"] = result.value("phases_s", json::object());
        run["wall_s"] = std::chrono::duration<double>(Clock::now() - run_started).count();
        const double codec_ms = result.value("encode_ms", 0.0) + result.value("decode_ms", 0.0);
        run["encode_ms"] = result.value("encode_ms", 0.0);
        run["decode_ms"] = result.value("decode_ms", 0.0);
        run["serializes"] = b.serializes;
        run["serialization_share"] = Median(lat) > 0 ? std::min(1.0, codec_ms / Median(lat)) : 0;
        if (link.measured && link.multi_MBps > 0) {
          const double floor_ms =
              static_cast<double>(bytes) / (link.multi_MBps * 1e6) * 1e3 + link.rtt_ms;
          run["floor_ms"] = floor_ms;
          run["over_floor"] = Median(lat) / floor_ms;
        }
        std::cout << "  " << std::left << std::setw(12) << bname << std::setw(8) << tier_name
                  << std::right << " latency " << Fixed(Median(lat), 1) << " ms (p95 "
                  << Fixed(Percentile(lat, 95), 1) << ")";
        if (run.contains("floor_ms"))
          std::cout << ", floor " << Fixed(run["floor_ms"].get<double>(), 1) << " ms";
        if (run.contains("concurrency"))
          std::cout << ", speedup x" << Fixed(run["concurrency"]["speedup"].get<double>(), 2);
        if (run.contains("broadcast"))
          std::cout << ", bcast peak "
                    << Fixed(run["broadcast"]["peak_bytes"].get<double>() / 1e6, 0) << " MB";
        std::cout << ", codec " << Fixed(100 * run["serialization_share"].get<double>(), 0) << "%\n"
                  << std::flush;
        report["runs"].push_back(run);
      }
    }
    if (!topology->loopback) {
      Status s = netem::Down(nopt);
      g_netem_up = false;
      if (!s.ok()) std::cerr << "xsilo bench p2p: netem down: " << s.ToString() << "\n";
    }
  }
  fs::remove_all(g_tmpdir, ec);

  // Files.
  report["failures"] = failures;
  {
    std::ofstream out(a.out + "/p2p.json");
    out << report.dump(1) << "\n";
  }
  {
    std::ofstream csv(a.out + "/p2p.csv");
    csv << "env,tier,backend,bytes,latency_median_ms,latency_p95_ms,floor_ms,over_floor,"
           "speedup,sequential_s,concurrent_s,broadcast_peers,broadcast_peak_bytes,"
           "broadcast_rss_before_bytes,encode_ms,decode_ms,serialization_share,error\n";
    for (const auto& r : report["runs"]) {
      auto num = [&](const json& j, const char* k) {
        return j.contains(k) ? j[k].dump() : std::string();
      };
      json c = r.value("concurrency", json::object());
      json bc = r.value("broadcast", json::object());
      csv << r["env"].get<std::string>() << "," << r["tier"].get<std::string>() << ","
          << r["backend"].get<std::string>() << "," << r["bytes"] << ","
          << num(r, "latency_median_ms") << "," << num(r, "latency_p95_ms") << ","
          << num(r, "floor_ms") << "," << num(r, "over_floor") << "," << num(c, "speedup") << ","
          << num(c, "sequential_s") << "," << num(c, "concurrent_s") << "," << num(bc, "peers")
          << "," << num(bc, "peak_bytes") << "," << num(bc, "rss_before_bytes") << ","
          << num(r, "encode_ms") << "," << num(r, "decode_ms") << ","
          << num(r, "serialization_share") << "," << (r.contains("error") ? "failed" : "") << "\n";
    }
  }
  {
    std::ofstream csv(a.out + "/dispatch.csv");
    csv << "env,tier,backend,n,seconds,rss_before_bytes,peak_bytes,helpers_peak_bytes\n";
    for (const auto& r : report["runs"]) {
      for (const auto& d : r.value("dispatch", json::array())) {
        csv << r["env"].get<std::string>() << "," << r["tier"].get<std::string>() << ","
            << r["backend"].get<std::string>() << "," << d["n"] << "," << d["seconds"] << ","
            << d["rss_before_bytes"] << "," << d["peak_bytes"] << "," << d["helpers_peak_bytes"]
            << "\n";
      }
    }
  }
  {
    std::ofstream csv(a.out + "/links.csv");
    csv << "env,scale,rtt_ms,single_MBps,multi_MBps,streams,target_rtt_ms,target_single_MBps,"
           "target_multi_MBps\n";
    for (const auto& l : report["links"]) {
      csv << l["env"].get<std::string>() << "," << l["scale"] << "," << l["rtt_ms"] << ","
          << l["single_MBps"] << "," << l["multi_MBps"] << "," << l["streams"] << ","
          << l["target_rtt_ms"] << "," << l["target_single_MBps"] << "," << l["target_multi_MBps"]
          << "\n";
    }
  }

  // Summary table.
  std::cout << "\n"
            << std::left << std::setw(13) << "env" << std::setw(8) << "tier" << std::setw(12)
            << "backend" << std::right << std::setw(12) << "median ms" << std::setw(10) << "p95 ms"
            << std::setw(11) << "floor ms" << std::setw(8) << "/floor" << std::setw(9) << "speedup"
            << std::setw(12) << "bcast MB" << std::setw(8) << "codec"
            << "\n";
  for (const auto& r : report["runs"]) {
    std::cout << std::left << std::setw(13) << r["env"].get<std::string>() << std::setw(8)
              << r["tier"].get<std::string>() << std::setw(12) << r["backend"].get<std::string>()
              << std::right;
    if (r.contains("error")) {
      std::cout << "  FAILED: " << r["error"].get<std::string>() << "\n";
      continue;
    }
    auto cell = [&](bool has, double v, int w, int d) {
      std::cout << std::setw(w) << (has ? Fixed(v, d) : std::string("-"));
    };
    cell(true, r["latency_median_ms"], 12, 1);
    cell(true, r["latency_p95_ms"], 10, 1);
    cell(r.contains("floor_ms"), r.value("floor_ms", 0.0), 11, 1);
    cell(r.contains("over_floor"), r.value("over_floor", 0.0), 8, 2);
    cell(r.contains("concurrency"),
         r.contains("concurrency") ? r["concurrency"]["speedup"].get<double>() : 0, 9, 2);
    cell(r.contains("broadcast"),
         r.contains("broadcast") ? r["broadcast"]["peak_bytes"].get<double>() / 1e6 : 0, 12, 0);
    std::cout << std::setw(7) << Fixed(100 * r["serialization_share"].get<double>(), 0) << "%\n";
  }
  for (const auto& n : report["not_run"]) {
    std::cout << "not run: " << n.value("env", "") << " " << n.value("tier", "") << " "
              << n.value("backend", "") << ": " << n["reason"].get<std::string>() << "\n";
  }
  for (const auto& r : report["runs"]) {
    for (const auto& d : r.value("dispatch", json::array())) {
      std::cout << "dispatch " << r["env"].get<std::string>() << " " << r["tier"].get<std::string>()
                << " " << r["backend"].get<std::string>() << " n=" << d["n"] << ": sender peak "
                << Fixed(d["peak_bytes"].get<double>() / 1e6, 0) << " MB (before "
                << Fixed(d["rss_before_bytes"].get<double>() / 1e6, 0) << " MB)\n";
    }
  }
  std::cout << "wrote " << a.out << "/{p2p.json,p2p.csv,dispatch.csv,links.csv}; " << failures
            << " failure(s); " << elapsed() << "\n";
  return failures == 0 ? 0 : 1;
}

// `xsilo bench plot --in DIR`: runs scripts/plot_p2p.py with a python3 that
// has matplotlib (Debian's /usr/bin/python3 first).
int RunPlot(const std::string& dir) {
  std::string script;
  if (const char* s = std::getenv("XSILO_PLOT_SCRIPT")) script = s;
  std::error_code ec;
  // e2e results (e2e.json) get Figure 5; p2p results Figures 2 and 4.
  const std::string name =
      fs::exists(fs::path(dir) / "e2e.json", ec) ? "plot_e2e.py" : "plot_p2p.py";
  const std::vector<std::string> candidates = {
      script, std::string(XSILO_SOURCE_DIR) + "/scripts/" + name,
      (fs::read_symlink("/proc/self/exe", ec).parent_path() / name).string()};
  script.clear();
  for (const auto& c : candidates) {
    if (!c.empty() && fs::exists(c, ec)) {
      script = c;
      break;
    }
  }
  if (script.empty()) {
    std::cerr << "xsilo bench plot: scripts/plot_p2p.py not found (set XSILO_PLOT_SCRIPT)\n";
    return 1;
  }
  const std::string python = fs::exists("/usr/bin/python3", ec) ? "/usr/bin/python3" : "python3";
  std::vector<std::string> args = {python, script, "--in", dir};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    std::cerr << "xsilo bench plot: cannot run " << python << "\n";
    return 1;
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

}  // namespace

void AddBenchCommand(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks (docs/benchmarks.md)");
  bench->require_subcommand(1);

  auto args = std::make_shared<P2pArgs>();
  auto* p2p = bench->add_subcommand(
      "p2p", "Peer-to-peer study: latency, concurrency, memory, serialization, link floor");
  p2p->add_option("--envs", args->envs, "lan, geo-proximal, ca-va, ca-hk")->capture_default_str();
  p2p->add_option("--tiers", args->tiers, "small, medium, big, large")->capture_default_str();
  p2p->add_option("--backends", args->backends, "Backends to run")->capture_default_str();
  p2p->add_option("--repeats", args->repeats, "Timed sends per latency point")
      ->capture_default_str();
  p2p->add_option("--scale", args->scale, "netem bandwidth scale (not lan)")->capture_default_str();
  p2p->add_flag("--quick", args->quick,
                "Preset: lan,ca-hk; small+medium (+big on lan); (b) on small only; grpc,grpc+s3; 2 "
                "repeats; scale 0.5; 3 s iperf3; dispatch 1,4,16; 2 broadcast peers");
  p2p->add_option("--out", args->out, "Results directory (default results/p2p-<date>)");
  p2p->add_option("--prefix", args->prefix, "netem instance prefix")->capture_default_str();
  p2p->add_option("--link-seconds", args->link_seconds,
                  "Seconds per iperf3 run (0 = no link reference)")
      ->capture_default_str();
  p2p->add_option("--broadcast-peers", args->broadcast_peers,
                  "Receivers of the concurrent broadcast (< 2 = no broadcast)")
      ->capture_default_str();
  p2p->add_option("--dispatch", args->dispatch, "Concurrent dispatches for Figure 2")
      ->capture_default_str();
  p2p->add_option("--dispatch-tier", args->dispatch_tier, "Tier of Figure 2")
      ->capture_default_str();
  p2p->add_option("--dispatch-envs", args->dispatch_envs, "Environments of Figure 2")
      ->capture_default_str();
  p2p->add_flag("--no-concurrency", args->no_concurrency, "Skip the 10-send speedup (b)");
  p2p->add_option("--backend-option", args->backend_options,
                  "NAME:KEY=VALUE added to a backend's options, e.g. grpc+s3:connections=32 "
                  "(repeatable)");
  p2p->callback([args, p2p] {
    std::vector<std::string> given;
    for (const auto* opt : p2p->get_options())
      if (opt->count() > 0) given.push_back(opt->get_name());
    std::exit(RunP2p(*args, given));
  });

  auto spec = std::make_shared<std::string>();
  auto* peer = bench->add_subcommand("p2p-peer", "(internal) one party of `bench p2p`");
  peer->add_option("--spec", *spec, "JSON spec")->required();
  peer->group("");  // hidden
  peer->callback([spec] { std::exit(RunPeer(*spec)); });

  auto dir = std::make_shared<std::string>();
  AddBenchE2eCommand(bench);
  auto* plot = bench->add_subcommand("plot", "Render Figures 2 and 4 (PNG) from a results dir");
  plot->add_option("--in", *dir, "Results directory of `xsilo bench p2p`")->required();
  plot->callback([dir] { std::exit(RunPlot(*dir)); });
}

}  // namespace xsilo::cli
