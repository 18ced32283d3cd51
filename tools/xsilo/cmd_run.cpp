// `xsilo run`: one FedAvg-shaped exchange between a server and its clients,
// in one process over any registered transport. The server broadcasts the
// model, every client returns an update weighted by its sample count, and
// the server averages them and checks the result.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <iostream>
#include <thread>

#include "commands.h"
#include "xsilo/core/tiers.h"
#include "xsilo/transport/registry.h"

namespace xsilo::cli {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A port the kernel just handed out on 127.0.0.1 (0 on failure).
int FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

struct RunArgs {
  std::string transport = "inproc";
  std::string tier = "small";
  std::string address;
  int clients = 7;
  int rounds = 1;
};

Result<Tensor> FilledF32(uint64_t n, float value) {
  XSILO_ASSIGN_OR_RETURN(Buffer b, Buffer::Allocate(n * sizeof(float)));
  auto* p = reinterpret_cast<float*>(b.mutable_data());
  std::fill(p, p + n, value);
  return Tensor::Make(DType::kF32, {static_cast<int64_t>(n)}, std::move(b));
}

// Client: receive the model, return model + delta with a sample count.
Status RunClient(Transport& t, int rounds) {
  for (int r = 0; r < rounds; ++r) {
    XSILO_ASSIGN_OR_RETURN(Message model, t.Receive(300s));
    const Tensor& w = model.tensors.at("weights");
    uint64_t n = w.nbytes() / sizeof(float);
    XSILO_ASSIGN_OR_RETURN(Tensor update, FilledF32(n, 0.0f));
    const float* in = reinterpret_cast<const float*>(w.data.data());
    float* out = reinterpret_cast<float*>(update.data.mutable_data());
    const float delta = 0.001f * static_cast<float>(t.rank());
    for (uint64_t i = 0; i < n; ++i) out[i] = in[i] + delta;
    Message reply;
    reply.type = "update";
    reply.round = model.round;
    reply.params["samples"] = int64_t{100} * t.rank();
    reply.tensors.emplace("weights", std::move(update));
    XSILO_RETURN_IF_ERROR(t.Send(0, std::move(reply), 300s));
  }
  return Status::OK();
}

int Run(const RunArgs& a) {
  auto tier = FindTier(a.tier);
  if (!tier) {
    std::cerr << "xsilo run: unknown tier '" << a.tier << "' (small, medium, big, large)\n";
    return 2;
  }
  const int world = a.clients + 1;
  // In-process fabrics need a name; network backends a free loopback port.
  std::string address = a.address;
  if (address.empty()) {
    address = a.transport.rfind("inproc", 0) == 0
                  ? "xsilo-run"
                  : "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  }
  std::vector<std::unique_ptr<Transport>> parties;
  for (int r = 0; r < world; ++r) {
    TransportOptions o;
    o.rank = r;
    o.world_size = world;
    o.address =
        a.address.empty() ? (a.transport == "inproc" ? "xsilo-run" : "127.0.0.1:50551") : a.address;
    auto t = TransportRegistry::Global().Create(a.transport, o);
    if (!t.ok()) {
      std::cerr << "xsilo run: " << t.status().ToString() << "\n";
      return 1;
    }
    parties.push_back(std::move(t).value());
  }
  std::vector<std::future<Status>> starts;
  for (auto& p : parties)
    starts.push_back(std::async(std::launch::async, [&p] { return p->Start(); }));
  for (auto& f : starts) {
    Status s = f.get();
    if (!s.ok()) {
      std::cerr << "xsilo run: start failed: " << s.ToString() << "\n";
      return 1;
    }
  }
  std::vector<std::future<Status>> clients;
  for (int c = 1; c < world; ++c) {
    clients.push_back(
        std::async(std::launch::async, [&, c] { return RunClient(*parties[c], a.rounds); }));
  }

  Transport& server = *parties[0];
  const uint64_t n = tier->parameters;
  const double model_mb = n * 4.0 / 1e6;
  std::cout << "xsilo run: 1 server + " << a.clients << " clients over '" << a.transport << "', "
            << tier->name << " tier (" << n << " float32 parameters, " << model_mb << " MB), "
            << a.rounds << " round(s)\n";
  auto global = FilledF32(n, 1.0f);
  if (!global.ok()) {
    std::cerr << "xsilo run: " << global.status().ToString() << "\n";
    return 1;
  }
  Tensor weights = std::move(global).value();
  int rc = 0;
  for (int r = 0; r < a.rounds && rc == 0; ++r) {
    Message model;
    model.type = "model";
    model.round = r;
    model.tensors.emplace("weights", weights);
    std::vector<int32_t> peers;
    for (int c = 1; c < world; ++c) peers.push_back(c);
    auto t0 = Clock::now();
    Status s = server.Broadcast(peers, std::move(model), 300s);
    auto t1 = Clock::now();
    if (!s.ok()) {
      std::cerr << "xsilo run: broadcast failed: " << s.ToString() << "\n";
      rc = 1;
      break;
    }
    // Weighted average of the updates (FedAvg).
    std::vector<double> acc(n, 0.0);
    int64_t total_samples = 0;
    for (int c = 1; c < world; ++c) {
      auto u = server.Receive(300s);
      if (!u.ok()) {
        std::cerr << "xsilo run: collecting updates: " << u.status().ToString() << "\n";
        rc = 1;
        break;
      }
      int64_t samples = u->GetInt("samples").value_or(1);
      const float* p = reinterpret_cast<const float*>(u->tensors.at("weights").data.data());
      for (uint64_t i = 0; i < n; ++i) acc[i] += samples * static_cast<double>(p[i]);
      total_samples += samples;
    }
    if (rc != 0) break;
    auto t2 = Clock::now();
    auto next = FilledF32(n, 0.0f);
    float* w = reinterpret_cast<float*>(next->data.mutable_data());
    for (uint64_t i = 0; i < n; ++i) w[i] = static_cast<float>(acc[i] / total_samples);
    weights = std::move(next).value();
    auto t3 = Clock::now();
    // Expected: previous value + sum(rank * 100 * 0.001 * rank) / sum(rank * 100).
    double num = 0, den = 0;
    for (int c = 1; c < world; ++c) {
      num += 100.0 * c * 0.001 * c;
      den += 100.0 * c;
    }
    double expected = 1.0 + (r + 1) * num / den;
    bool correct = std::fabs(w[0] - expected) < 1e-4 && std::fabs(w[n - 1] - expected) < 1e-4;
    std::printf(
        "round %d: broadcast %.1f MB to %d clients in %.3f s; collected %d updates (%.1f MB) in "
        "%.3f s; aggregated in %.3f s; global[0]=%.6f (expected %.6f) %s\n",
        r, model_mb, a.clients, Seconds(t1 - t0), a.clients, model_mb * a.clients, Seconds(t2 - t1),
        Seconds(t3 - t2), w[0], expected, correct ? "ok" : "WRONG");
    if (!correct) rc = 1;
  }
  for (auto& f : clients) {
    Status s = f.get();
    if (!s.ok() && rc == 0) {
      std::cerr << "xsilo run: client failed: " << s.ToString() << "\n";
      rc = 1;
    }
  }
  for (auto& p : parties) p->Stop();
  return rc;
}

}  // namespace

void AddRunCommand(CLI::App& app) {
  static RunArgs args;
  auto* cmd = app.add_subcommand("run", "One FedAvg-shaped exchange in this process (demo)");
  cmd->add_option("--transport", args.transport, "registered transport name")
      ->capture_default_str();
  cmd->add_option("--tier", args.tier, "model tier: small, medium, big, large")
      ->capture_default_str();
  cmd->add_option("--clients", args.clients, "number of clients")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--rounds", args.rounds, "rounds")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--address", args.address, "server address (backend-specific)");
  cmd->callback([] {
    int rc = Run(args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace xsilo::cli
