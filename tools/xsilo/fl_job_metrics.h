// `xsilo fl run|server`'s metrics: the --metrics-* options and the job's
// registry, FL counters, state timers and Prometheus endpoint
// (docs/metrics.md). Included by cmd_fl.cpp only.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "xsilo/fl/fedavg.h"
#include "xsilo/metrics/endpoint.h"
#include "xsilo/metrics/metered_transport.h"

namespace xsilo::cli {

using namespace xsilo::fl;

// --metrics-*: the Prometheus endpoint of a job (docs/metrics.md).
struct MetricsArgs {
  std::string port;  // "" or "0": off; "auto": an ephemeral port; else the port
  std::string address = "127.0.0.1";
  std::string port_file;  // the bound port is written here
  double linger_s = 0;    // keep serving this long after the job (SIGINT/SIGTERM end it)
};

inline void AddMetricsOptions(CLI::App* cmd, MetricsArgs& m) {
  cmd->add_option("--metrics-port", m.port,
                  "serve Prometheus metrics at http://<address>:<port>/metrics (0 or absent: off; "
                  "'auto': an ephemeral port, printed and written to --metrics-port-file)");
  cmd->add_option("--metrics-address", m.address, "IPv4 address the metrics endpoint binds")
      ->capture_default_str();
  cmd->add_option("--metrics-port-file", m.port_file,
                  "write the metrics endpoint's bound port to this file");
  cmd->add_option("--metrics-linger", m.linger_s,
                  "seconds to keep serving metrics after the job ended, so a scraper sees the "
                  "final values (SIGINT/SIGTERM end it early)")
      ->capture_default_str();
}

inline std::atomic<bool> g_linger_interrupted{false};
extern "C" inline void OnLingerSignal(int) { g_linger_interrupted = true; }

// The job's metrics: the registry the metered transports count into, the
// FL round counters and the per-state timers, and the endpoint serving them.
class JobMetrics {
 public:
  // nullptr when --metrics-port is off.
  static Result<std::unique_ptr<JobMetrics>> Start(const MetricsArgs& a) {
    XSILO_ASSIGN_OR_RETURN(std::optional<int> port, metrics::ParseMetricsPort(a.port));
    if (!port) return std::unique_ptr<JobMetrics>();
    auto m = std::unique_ptr<JobMetrics>(new JobMetrics(a));
    XSILO_ASSIGN_OR_RETURN(m->endpoint_, metrics::MetricsEndpoint::Start(
                                             m->registry_, {.address = a.address, .port = *port}));
    std::printf("metrics: %s\n", m->endpoint_->url().c_str());
    std::fflush(stdout);
    if (!a.port_file.empty()) {
      const std::string tmp = a.port_file + ".tmp";
      std::ofstream out(tmp);
      out << m->endpoint_->port() << "\n";
      out.close();
      if (!out || std::rename(tmp.c_str(), a.port_file.c_str()) != 0) {
        return Internal("cannot write --metrics-port-file " + a.port_file);
      }
    }
    return m;
  }

  ~JobMetrics() {
    endpoint_->Stop();
    registry_.RemoveCollector(states_);
  }

  std::unique_ptr<Transport> Meter(std::unique_ptr<Transport> t, const std::string& party) {
    return metrics::MakeMeteredTransport(std::move(t), registry_, {.party = party});
  }

  void JobStarted(uint64_t rounds, uint64_t model_bytes) {
    registry_.GetGauge("xsilo_fl_rounds_planned", "Rounds the job runs.")
        .Set(static_cast<double>(rounds));
    registry_.GetGauge("xsilo_fl_model_bytes", "Payload bytes of the global model.")
        .Set(static_cast<double>(model_bytes));
    registry_.GetGauge("xsilo_fl_job_finished", "1 once the job ended (see xsilo_fl_job_ok).")
        .Set(0);
  }

  // While the server runs, its timers are read at every scrape.
  void Watch(const StateTimers* server) {
    std::lock_guard<std::mutex> lock(mu_);
    live_server_ = server;
  }

  void OnRound(const RoundReport& r) {
    registry_.GetCounter("xsilo_fl_rounds_total", "Rounds finished (at quorum or not).").Add();
    if (r.completed) {
      registry_.GetCounter("xsilo_fl_rounds_completed_total", "Rounds that reached quorum.").Add();
    }
    registry_.GetGauge("xsilo_fl_round", "The last finished round (0-based).")
        .Set(static_cast<double>(r.round));
    registry_
        .GetCounter("xsilo_fl_model_bytes_sent_total",
                    "Model payload bytes the rounds sent (model bytes x clients selected), as "
                    "the job report's bytes_sent.")
        .Add(r.bytes_sent);
    registry_
        .GetCounter("xsilo_fl_update_bytes_received_total",
                    "Update payload bytes the rounds received, as the job report's "
                    "bytes_received.")
        .Add(r.bytes_received);
    registry_.GetCounter("xsilo_fl_updates_received_total", "Updates aggregated.").Add(r.received);
    registry_
        .GetCounter("xsilo_fl_updates_discarded_total",
                    "Late, duplicate or malformed messages discarded.")
        .Add(r.discarded);
    registry_.GetGauge("xsilo_fl_last_round_seconds", "Duration of the last finished round.")
        .Set(r.seconds);
    registry_.GetFloatCounter("xsilo_fl_round_seconds_total", "Seconds spent in rounds.")
        .Add(r.seconds);
  }

  // The job ended: the timers are frozen at `times` (server and clients).
  void JobFinished(bool ok, const std::vector<PartyTimes>& times) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_server_ = nullptr;
      final_times_ = times;
    }
    registry_.GetGauge("xsilo_fl_job_ok", "1 if the job ended successfully.").Set(ok ? 1 : 0);
    registry_.GetGauge("xsilo_fl_job_finished", "1 once the job ended (see xsilo_fl_job_ok).")
        .Set(1);
  }

  void Linger() const {
    if (!(linger_s_ > 0)) return;
    std::printf("metrics: serving for %.0f s more (SIGINT/SIGTERM to stop)\n", linger_s_);
    std::fflush(stdout);
    struct sigaction sa {};
    sa.sa_handler = OnLingerSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(linger_s_ * 1000));
    while (!g_linger_interrupted && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

 private:
  explicit JobMetrics(const MetricsArgs& a) : linger_s_(a.linger_s) {
    states_ = registry_.AddCollector(
        "xsilo_fl_state_seconds_total",
        "Seconds per party and state (train, aggregate, communication, serialization, wait, "
        "migration), as the per-state table.",
        metrics::MetricType::kCounter, [this] {
          std::vector<metrics::Sample> out;
          std::lock_guard<std::mutex> lock(mu_);
          auto add = [&](const std::string& party, const std::array<double, kPartyStateCount>& s) {
            for (size_t i = 0; i < kPartyStateCount; ++i) {
              out.push_back({{{"party", party},
                              {"state", std::string(PartyStateName(static_cast<PartyState>(i)))}},
                             s[i]});
            }
          };
          if (live_server_) add("server", live_server_->Snapshot());
          for (const auto& p : final_times_) add(p.party, p.seconds);
          return out;
        });
  }

  double linger_s_;
  metrics::Registry registry_;
  std::unique_ptr<metrics::MetricsEndpoint> endpoint_;
  int states_ = 0;
  std::mutex mu_;
  const StateTimers* live_server_ = nullptr;
  std::vector<PartyTimes> final_times_;
};

}  // namespace xsilo::cli
