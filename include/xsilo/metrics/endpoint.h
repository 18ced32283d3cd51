// MetricsEndpoint: serves a Registry as GET /metrics over plain HTTP/1.1
// (keep-alive), for Prometheus and curl, on the network layer's HTTP server
// (src/net/http_server.h) with two workers: a scrape is small and rare. Any
// other path is 404, any other method 405. A client that sends nothing for
// io_timeout is dropped.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "xsilo/core/status.h"
#include "xsilo/metrics/metrics.h"

namespace xsilo::metrics {

struct EndpointOptions {
  // IPv4 address to bind. Default "127.0.0.1" (loopback only).
  std::string address = "127.0.0.1";
  // TCP port; 0 picks an ephemeral one (see MetricsEndpoint::port()).
  // Default 0.
  int port = 0;
  // Longest wait for a request, or for a slow reader. Default 5 s.
  std::chrono::milliseconds io_timeout{5000};
};

// A --metrics-port argument: "" or "0" = off (nullopt), "auto" = an
// ephemeral port (0), else the port 1..65535. InvalidArgument otherwise.
Result<std::optional<int>> ParseMetricsPort(const std::string& text);

class MetricsEndpoint {
 public:
  // Binds and starts serving `registry`, which must outlive the endpoint.
  static Result<std::unique_ptr<MetricsEndpoint>> Start(const Registry& registry,
                                                        EndpointOptions options = {});
  ~MetricsEndpoint();  // stops
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const;
  // "http://<address>:<port>/metrics".
  std::string url() const;
  // Stops the server: closes the listener and every connection and joins
  // its threads; idempotent.
  void Stop();

  struct Impl;

 private:
  explicit MetricsEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace xsilo::metrics
