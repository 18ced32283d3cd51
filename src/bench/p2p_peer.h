// What the coordinator of `bench p2p` tells each peer process: its part in
// one measurement, passed as JSON on the command line.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace xsilo::bench {

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
  std::string payload = "pattern";  // ModelPayload
  int warmup = 1;
  int repeats = 3;
  double min_seconds = 0;  // P2pOptions::min_seconds
  int concurrent = 0;      // 0 = skip (b)
  std::vector<int> dispatch_points;
  bool broadcast = false;
  bool serializes = true;
  double timeout_s = 600;  // per wait for one batch of acks
  std::string result;
  // Endpoint rows (BackendSpec::endpoint): "direct" or "relayed", the
  // relay's HOST:PORT (in the server site; the sender starts it) and its
  // self-signed pair (the certificate is every endpoint's --relay-ca).
  std::string endpoint;
  std::string relay;
  std::string relay_cert, relay_key;
};

nlohmann::json ToJson(const PeerSpec& s);

// Where receiver `rank` of an endpoint row leaves its endpoint's final
// /status JSON: next to the sender's result file.
std::string EndpointStatusFile(const std::string& result, int rank);
PeerSpec PeerSpecFromJson(const nlohmann::json& j);

inline std::chrono::milliseconds Seconds(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

}  // namespace xsilo::bench
