// One party of a `bench p2p` measurement: the sender (rank 0) runs (a)
// latency, (b) concurrency, (c) dispatch and broadcast memory and (d) codec
// time, and writes its result file; the receivers verify and acknowledge
// every model.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "bench/p2p_peer.h"
#include "bench/p2p_processes.h"
#include "net/http_client.h"
#include "xsilo/bench/model.h"
#include "xsilo/bench/p2p.h"
#include "xsilo/bench/process.h"
#include "xsilo/bench/report.h"
#include "xsilo/core/codec.h"
#include "xsilo/netem/netem.h"
#include "xsilo/netem/probe.h"
#include "xsilo/transport/registry.h"

extern char** environ;

namespace xsilo::bench {

using nlohmann::json;

std::string EndpointStatusFile(const std::string& result, int rank) {
  return std::filesystem::path(result).parent_path().string() + "/endpoint-status-" +
         std::to_string(rank) + ".json";
}

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
              {"payload", s.payload},
              {"warmup", s.warmup},
              {"repeats", s.repeats},
              {"min_seconds", s.min_seconds},
              {"concurrent", s.concurrent},
              {"dispatch_points", s.dispatch_points},
              {"broadcast", s.broadcast},
              {"serializes", s.serializes},
              {"timeout_s", s.timeout_s},
              {"result", s.result},
              {"endpoint", s.endpoint},
              {"relay", s.relay},
              {"relay_cert", s.relay_cert},
              {"relay_key", s.relay_key}};
}

PeerSpec PeerSpecFromJson(const json& j) {
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
  s.payload = j.value("payload", "pattern");
  s.warmup = j.at("warmup");
  s.repeats = j.at("repeats");
  s.min_seconds = j.at("min_seconds");
  s.concurrent = j.at("concurrent");
  s.dispatch_points = j.at("dispatch_points").get<std::vector<int>>();
  s.broadcast = j.at("broadcast");
  s.serializes = j.at("serializes");
  s.timeout_s = j.at("timeout_s");
  s.result = j.at("result");
  s.endpoint = j.value("endpoint", "");
  s.relay = j.value("relay", "");
  s.relay_cert = j.value("relay_cert", "");
  s.relay_key = j.value("relay_key", "");
  return s;
}

namespace {

using Clock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

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
// time (steady clock ns, the receiver's, same machine so same clock), taken
// once the receiver checked the model. With `delivered`, also seq -> the
// time Receive returned it, before that check. With `per_seq` > 1 (a
// broadcast), waits for that many acks per number and keeps the latest
// times.
Result<std::map<int64_t, int64_t>> WaitAcks(Transport& t, const std::set<int64_t>& seqs,
                                            double timeout_s, SendErrors* errors,
                                            size_t per_seq = 1,
                                            std::map<int64_t, int64_t>* delivered = nullptr) {
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
      auto at = m->GetInt("delivered_ns");
      if (delivered && at.ok()) (*delivered)[*seq] = std::max((*delivered)[*seq], *at);
      ++got;
    }
  }
  return out;
}

Status RunSender(const PeerSpec& spec, Transport& t, json* result) {
  // Receivers announce themselves once started.
  std::set<int64_t> ready;
  for (int r = 1; r < spec.world; ++r) ready.insert(-r);
  // Shared with the send callbacks: a transport may confirm a send after
  // the receiver's ack, so after this function returned.
  const auto errors = std::make_shared<SendErrors>();
  const auto started = Clock::now();
  json phases = json::object();
  auto phase = [&](const char* name) {
    phases[name] = std::chrono::duration<double>(Clock::now() - started).count();
    (*result)["phases_s"] = phases;
  };
  XSILO_RETURN_IF_ERROR(WaitAcks(t, ready, 120, errors.get()).status());
  phase("ready");

  XSILO_ASSIGN_OR_RETURN(const ModelPayload payload, ParseModelPayload(spec.payload));
  XSILO_ASSIGN_OR_RETURN(Message model, MakeModel(spec.parameters, 1, payload));
  const uint64_t model_bytes = model.payload_bytes();
  (*result)["model_bytes"] = model_bytes;
  int64_t seq = 0;
  auto send = [&](int32_t peer, const Message& m, int64_t s) {
    Message copy = m;  // shares the tensor Buffers
    copy.params["seq"] = s;
    t.SendAsync(peer, std::move(copy), [errors](const Status& st) { errors->Record(st); });
  };

  // (a) latency: warm-up sends, then `repeats` sends, each waited for, and
  // more until they add up to min_seconds. delivery_ms: the same, until the
  // receiver's Receive returned (before its check of the model).
  std::vector<double> latency_ms, delivery_ms;
  double timed_s = 0;
  auto more = [&](int r) {
    const int timed = r - spec.warmup;
    return timed < spec.repeats || (timed_s < spec.min_seconds && timed < kP2pMaxTimedSends);
  };
  for (int r = 0; more(r); ++r) {
    StampModel(&model, ++seq);
    const int64_t t0 = NowNs();
    send(1, model, seq);
    std::map<int64_t, int64_t> delivered;
    XSILO_ASSIGN_OR_RETURN(auto acks,
                           WaitAcks(t, {seq}, spec.timeout_s, errors.get(), 1, &delivered));
    if (r < spec.warmup) continue;
    latency_ms.push_back(static_cast<double>(acks[seq] - t0) / 1e6);
    timed_s += latency_ms.back() / 1e3;
    if (delivered.count(seq)) delivery_ms.push_back(static_cast<double>(delivered[seq] - t0) / 1e6);
  }
  (*result)["latency_ms"] = latency_ms;
  (*result)["delivery_ms"] = delivery_ms;
  if (LinkObserver* observer = t.link_observer()) {
    if (std::string route = observer->RouteReason(); !route.empty()) (*result)["route"] = route;
  }
  phase("latency");

  // (b) N distinct messages one after another, then all at once.
  if (spec.concurrent > 0) {
    std::vector<Message> batch;
    for (int i = 0; i < spec.concurrent; ++i) {
      XSILO_ASSIGN_OR_RETURN(Message m, MakeModel(spec.parameters, 100 + i, payload));
      batch.push_back(std::move(m));
    }
    auto t0 = Clock::now();
    for (auto& m : batch) {
      send(1, m, ++seq);
      XSILO_RETURN_IF_ERROR(WaitAcks(t, {seq}, spec.timeout_s, errors.get()).status());
    }
    const double seq_s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::set<int64_t> seqs;
    for (auto& m : batch) StampModel(&m, ++seq + 1000000);  // fresh content
    const uint64_t before = StatusBytes("self", "VmRSS");
    ResetPeakRss();
    t0 = Clock::now();
    for (auto& m : batch) {
      seqs.insert(++seq);
      send(1, m, seq);
    }
    XSILO_RETURN_IF_ERROR(
        WaitAcks(t, seqs, spec.timeout_s * spec.concurrent, errors.get()).status());
    const double conc_s = std::chrono::duration<double>(Clock::now() - t0).count();
    (*result)["concurrency"] = {
        {"n", spec.concurrent},       {"sequential_s", seq_s},
        {"concurrent_s", conc_s},     {"speedup", seq_s / conc_s},
        {"rss_before_bytes", before}, {"peak_bytes", StatusBytes("self", "VmHWM")}};
    phase("concurrency");
  }

  // (c) Figure 2: the same model dispatched n times at once.
  json dispatch = json::array();
  for (int n : spec.dispatch_points) {
    StampModel(&model, ++seq + 2000000);
    const uint64_t before = StatusBytes("self", "VmRSS");
    ResetPeakRss();
    ResetChildrenPeakRss();
    auto t0 = Clock::now();
    std::set<int64_t> seqs;
    for (int i = 0; i < n; ++i) {
      seqs.insert(++seq);
      send(1, model, seq);
    }
    XSILO_RETURN_IF_ERROR(WaitAcks(t, seqs, spec.timeout_s * n, errors.get()).status());
    dispatch.push_back({{"n", n},
                        {"seconds", std::chrono::duration<double>(Clock::now() - t0).count()},
                        {"rss_before_bytes", before},
                        {"peak_bytes", StatusBytes("self", "VmHWM")},
                        {"helpers_peak_bytes", ChildrenPeakRss()}});
  }
  (*result)["dispatch"] = dispatch;
  phase("dispatch");

  // (c) a concurrent broadcast to every receiver.
  if (spec.broadcast && spec.world > 2) {
    StampModel(&model, ++seq + 3000000);
    model.params["seq"] = seq;
    std::vector<int32_t> peers;
    for (int r = 1; r < spec.world; ++r) peers.push_back(r);
    const uint64_t before = StatusBytes("self", "VmRSS");
    ResetPeakRss();
    ResetChildrenPeakRss();
    auto t0 = Clock::now();
    t.BroadcastAsync(peers, model, [errors](const Status& st) { errors->Record(st); });
    XSILO_RETURN_IF_ERROR(
        WaitAcks(t, {seq}, spec.timeout_s * peers.size(), errors.get(), peers.size()).status());
    (*result)["broadcast"] = {
        {"peers", peers.size()},
        {"rss_before_bytes", before},
        {"peak_bytes", StatusBytes("self", "VmHWM")},
        {"helpers_peak_bytes", ChildrenPeakRss()},
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
    if (!ModelIntact(back)) return Internal("codec round trip damaged the model");
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

// Sends "done" to every receiver until it answers "bye", for about a
// minute: a message sent just before Stop may be cut off by its drain
// deadline, or confirmed once queued at the receiver and lost with it, and
// a receiver never released waits out its idle timeout (minutes). Every
// failed send or receive is logged; a receiver that never answered is
// reported, not failed here (if it is still running, the coordinator
// kills it and reports the run: WaitPeers).
void ReleaseReceivers(const PeerSpec& spec, Transport& t,
                      const std::function<void(const std::string&)>& log) {
  std::set<int32_t> left;
  for (int32_t r = 1; r < spec.world; ++r) left.insert(r);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!left.empty() && Clock::now() < deadline) {
    for (int32_t r : left) {
      Message done;
      done.type = "done";
      Status s = t.Send(r, std::move(done), std::chrono::seconds(5));
      if (!s.ok()) log("\"done\" to rank " + std::to_string(r) + ": " + s.ToString());
    }
    const auto again = std::min(deadline, Clock::now() + std::chrono::seconds(10));
    while (!left.empty() && Clock::now() < again) {
      auto m = t.Receive(std::chrono::milliseconds(500));
      if (m.ok()) {
        if (m->type == "bye") left.erase(m->sender);
      } else if (m.status().code() == StatusCode::kCancelled) {
        log("releasing the receivers: " + m.status().ToString());
        return;  // the transport stopped
      } else if (m.status().code() != StatusCode::kTimeout) {
        log("releasing the receivers: " + m.status().ToString());
      }
    }
  }
  std::string ranks;
  for (int32_t r : left) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (!left.empty()) log("receiver rank(s) " + ranks + " did not answer \"done\" within 60 s");
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
  // A lossy codec's copy passes within its bound (ModelIntact).
  const auto codec = spec.options.find("compression");
  const double tolerance = codec == spec.options.end() ? 0 : LossyTolerance(codec->second);
  for (;;) {
    XSILO_ASSIGN_OR_RETURN(Message m, t.Receive(idle));
    if (m.type == "done") {
      Message bye;
      bye.type = "bye";
      return t.Send(0, std::move(bye), std::chrono::seconds(30));
    }
    const int64_t delivered = NowNs();
    const bool ok = ModelIntact(m, tolerance);
    const int64_t at = NowNs();
    auto seq = m.GetInt("seq");
    Message ack;
    ack.type = "ack";
    ack.params["seq"] = seq.ok() ? *seq : int64_t{0};
    ack.params["ok"] = static_cast<int64_t>(ok ? 1 : 0);
    ack.params["recv_ns"] = at;
    ack.params["delivered_ns"] = delivered;
    m = Message();  // drop the model before acking
    XSILO_RETURN_IF_ERROR(t.Send(0, std::move(ack), std::chrono::seconds(120)));
  }
}

// The processes an endpoint row's peer runs next to itself, in its site
// (children of this binary, in this process group: the coordinator's kill
// of the group takes them too): the sender's relay and every peer's
// endpoint. Their VmHWM counts as the sender's helpers' memory, as the
// embedded S3 server's does.
class EndpointHelpers {
 public:
  ~EndpointHelpers() { Stop(); }

  // Starts the relay (the sender) and this peer's endpoint; sets *store_address
  // to the endpoint's local API.
  Status Start(const PeerSpec& spec, std::string* store_address) {
    const auto colon = spec.relay.rfind(':');
    if (colon == std::string::npos) return InvalidArgument("endpoint row without a relay address");
    const std::string server_host = spec.relay.substr(0, colon);
    const int relay_port = std::atoi(spec.relay.c_str() + colon + 1);
    if (spec.rank == 0) {
      XSILO_ASSIGN_OR_RETURN(pid_t relay,
                             Spawn({"relay", "--listen", spec.relay, "--tls-cert", spec.relay_cert,
                                    "--tls-key", spec.relay_key, "--open"}));
      const auto until = Clock::now() + std::chrono::seconds(30);
      while (!netem::Listening(relay, static_cast<uint16_t>(relay_port))) {
        if (Clock::now() > until || Exited(relay)) {
          return Unavailable("the relay did not listen on " + spec.relay);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    const std::string port_file = std::filesystem::path(spec.result).parent_path().string() +
                                  "/endpoint-" + std::to_string(spec.rank) + ".port";
    std::error_code ec;
    std::filesystem::remove(port_file, ec);
    std::vector<std::string> args = {"endpoint",    "start",    "--listen",   "127.0.0.1:0",
                                     "--relay",     spec.relay, "--relay-ca", spec.relay_cert,
                                     "--port-file", port_file};
    if (spec.rank == 0 && spec.endpoint == "direct") {
      args.insert(args.end(), {"--peer-listen", server_host + ":0"});
    }
    // The emulator's sites have public addresses: ICE would find a UDP pair
    // between them, and the relayed row would measure the punched path.
    if (spec.endpoint != "direct") args.push_back("--no-punch");
    XSILO_ASSIGN_OR_RETURN(pid_t endpoint, Spawn(args));
    // The port file is written once the endpoint registered with the relay.
    const auto until = Clock::now() + std::chrono::seconds(60);
    for (;;) {
      std::ifstream in(port_file);
      if (in >> port_ && port_ > 0) break;
      if (Clock::now() > until || Exited(endpoint)) {
        return Unavailable("the endpoint did not start (see the log)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    *store_address = "127.0.0.1:" + std::to_string(port_);
    return Status::OK();
  }

  // The endpoint's /status JSON ("objects", "served": {"local", "direct",
  // "relayed"}); null when it does not answer.
  json EndpointStatus() const {
    if (port_ <= 0) return nullptr;
    auto r =
        net::HttpCall({"127.0.0.1", port_}, "GET", "/status", nullptr, std::chrono::seconds(10));
    if (!r.ok() || r->status != 200) return nullptr;
    try {
      return json::parse(r->body.view());
    } catch (...) {
      return nullptr;
    }
  }

  // SIGTERM, newest first (the endpoint before the relay), then reaped.
  void Stop() {
    for (auto it = pids_.rbegin(); it != pids_.rend(); ++it) {
      ::kill(*it, SIGTERM);
      const auto until = Clock::now() + std::chrono::seconds(5);
      while (!Exited(*it) && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!Exited(*it)) ::kill(*it, SIGKILL);
      int st = 0;
      ::waitpid(*it, &st, 0);
    }
    pids_.clear();
  }

 private:
  // This binary with `args`; stdout and stderr shared with this peer (its log).
  Result<pid_t> Spawn(std::vector<std::string> args) {
    args.insert(args.begin(), "/proc/self/exe");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
    if (rc != 0) return Internal(std::string("posix_spawn: ") + std::strerror(rc));
    pids_.push_back(pid);
    return pid;
  }

  std::vector<pid_t> pids_;
  int port_ = 0;
};

}  // namespace

int RunP2pPeer(const std::string& spec_text) {
  const auto t_start = Clock::now();
  PeerSpec spec;
  try {
    spec = PeerSpecFromJson(json::parse(spec_text));
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
  auto log = [&](const std::string& what) {
    std::fprintf(stderr, "[%8.3f s] %s rank %d: %s\n",
                 std::chrono::duration<double>(Clock::now() - t_start).count(), spec.role.c_str(),
                 spec.rank, what.c_str());
  };
  // An endpoint row: this peer's endpoint (and the sender's relay) first,
  // in this site, before the transport that puts objects into it.
  EndpointHelpers helpers;
  Status helpers_up;
  if (!spec.endpoint.empty()) {
    std::string store_address;
    helpers_up = helpers.Start(spec, &store_address);
    if (helpers_up.ok()) o.backend["store.address"] = store_address;
    log("endpoint (" + spec.endpoint + ", relay " + spec.relay + ") at " + store_address + ": " +
        helpers_up.ToString());
  }
  Result<std::unique_ptr<Transport>> t = helpers_up.ok()
                                             ? TransportRegistry::Global().Create(spec.transport, o)
                                             : Result<std::unique_ptr<Transport>>(helpers_up);
  Status s = t.ok() ? (*t)->Start() : t.status();
  log("transport " + spec.transport + " started at " + spec.address + ": " + s.ToString());
  json result;
  if (s.ok()) {
    if (spec.role == "sender") {
      s = RunSender(spec, **t, &result);
      ReleaseReceivers(spec, **t, log);  // even after a failure
    } else {
      s = RunReceiver(spec, **t);
    }
  }
  log("measurements done: " + s.ToString());
  if (t.ok()) (*t)->Stop();
  log("transport stopped");
  if (!spec.endpoint.empty()) {
    // Which paths this peer's endpoint took, and what it still holds.
    json status = helpers.EndpointStatus();
    log("endpoint status " + status.dump());
    if (spec.role == "sender") {
      result["endpoint_status"] = status;
    } else {
      // For the coordinator (EndpointStatusFile): the receiver's endpoint
      // made the remote calls, so its counters say which path they took.
      std::ofstream out(EndpointStatusFile(spec.result, spec.rank));
      out << status.dump() << "\n";
    }
    helpers.Stop();
  }
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

}  // namespace xsilo::bench
