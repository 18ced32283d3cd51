// Measurements across a netem instance: a TCP echo server inside a site and
// an echo round-trip probe from another site, and the iperf3-based check
// behind `xsilo netem check`.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "xsilo/core/status.h"
#include "xsilo/netem/netem.h"

namespace xsilo::netem {

// A TCP echo server on its own thread inside a site (TCP_NODELAY, one
// thread per connection). Stops and joins in the destructor.
class EchoServer {
 public:
  // Listens on the site's address and `port` (0 = any free port).
  static Result<std::unique_ptr<EchoServer>> Start(const State& state, int site, uint16_t port = 0);
  ~EchoServer();
  uint16_t port() const { return port_; }

 private:
  EchoServer() = default;
  void Serve();
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Connects from `from_site` to address:port, then times `samples` one-byte
// echoes (after one warm-up). Returns each round trip in milliseconds.
Result<std::vector<double>> MeasureEchoRtt(
    const State& state, int from_site, const std::string& address, uint16_t port, int samples,
    std::chrono::milliseconds timeout = std::chrono::seconds(10));

double Median(std::vector<double> v);

// True once a TCP socket (v4 or v6) in `pid`'s network namespace listens on
// `port`.
bool Listening(pid_t pid, uint16_t port);

struct CheckOptions {
  // Seconds of each iperf3 run, after `omit_seconds` of warm-up that are not
  // counted. Defaults 8 and 2.
  int seconds = 8;
  int omit_seconds = 2;
  // Echo round trips timed for the RTT. Default 20.
  int rtt_samples = 20;
  // TCP port of the iperf3 server in each client site. Default 5201.
  uint16_t port = 5201;
  // Cap on parallel streams. Default 128.
  int max_streams = 128;
};

struct CheckRow {
  std::string site;
  std::string region;
  LinkTarget target;       // scaled
  double rtt_ms = 0;       // median echo round trip
  double single_MBps = 0;  // iperf3, one stream, server -> client
  double multi_MBps = 0;   // iperf3, `streams` streams
  int streams = 0;
  double router_cpu_single = 0;  // router CPU, % of one core, during each run
  double router_cpu_multi = 0;
  double machine_busy_multi = 0;  // whole-machine CPU busy % during the multi run
};

// Runs iperf3 (which must be on PATH) from the server site to each client
// site. `progress` sees each row as soon as it is measured.
Result<std::vector<CheckRow>> RunCheck(const State& state, const CheckOptions& options,
                                       const std::function<void(const CheckRow&)>& progress = {});

}  // namespace xsilo::netem
