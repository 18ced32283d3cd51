#include "bench/p2p_backends.h"

#include <algorithm>
#include <deque>
#include <string_view>

#include "xsilo/bench/report.h"

namespace xsilo::bench {

const std::vector<BackendSpec>& Backends() {
  static const std::vector<BackendSpec> kBackends = {
      {"grpc", "grpc", {{"streams", "1"}}, true, false, false},
      {"grpc-s4", "grpc", {{"streams", "4"}}, true, false, false},
      // Unary mode dials rank r at the server's host, port + r: all ranks
      // must share one address.
      {"grpc-unary", "grpc", {{"mode", "unary"}}, true, false, true},
      {"grpc+s3", "grpc+s3", {}, false, false, false},
      // Inline or the store per message, by the measured link (docs/auto.md).
      {"auto+s3", "auto+s3", {}, false, false, false},
      {"mpi-generic", "mpi-generic", {}, true, true, false},
      {"mpi-buffer", "mpi-buffer", {}, false, true, false},
      // uv transport (TCP) and the basic channel, as PyTorch RPC between hosts.
      {"tensorpipe", "tensorpipe", {}, false, false, false},
      {"grpc-tls", "grpc", {{"streams", "1"}}, true, false, false, true},
      {"grpc+s3-tls", "grpc+s3", {}, false, false, false, true},
      // Big tensors stay on the sender's own endpoint; receivers pull them
      // through theirs (docs/endpoint.md). A remote GET is answered once the
      // receiver's endpoint holds the whole object, so the connector's
      // timeout must cover one transfer on the slowest link.
      {"grpc+endpoint",
       "grpc+endpoint",
       {{"store.timeout_ms", "1800000"}},
       false,
       false,
       false,
       false,
       "direct"},
      {"grpc+endpoint-relayed",
       "grpc+endpoint",
       {{"store.timeout_ms", "1800000"}},
       false,
       false,
       false,
       false,
       "relayed"},
  };
  return kBackends;
}

const BackendSpec* FindBackend(const std::string& name) {
  for (const auto& b : Backends())
    if (b.name == name) return &b;
  static std::deque<BackendSpec> striped;  // the coordinator is single-threaded
  for (const auto& b : striped)
    if (b.name == name) return &b;
  if (name.find('~') != std::string::npos) {  // BASE~CODEC: BASE compressed
    std::string base;
    std::map<std::string, std::string> extra;
    if (!SplitCompressionSuffix(name, &base, &extra)) return nullptr;
    const BackendSpec* b = FindBackend(base);
    if (b == nullptr) return nullptr;
    BackendSpec v = *b;
    v.name = name;
    v.options.insert(extra.begin(), extra.end());
    striped.push_back(std::move(v));
    return &striped.back();
  }
  constexpr std::string_view kStriped = "grpc-s";
  if (name.size() <= kStriped.size() || name.compare(0, kStriped.size(), kStriped) != 0) {
    return nullptr;
  }
  const std::string k = name.substr(kStriped.size());
  if (k.size() > 2 || k[0] == '0' ||
      !std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(k) > 64) {
    return nullptr;
  }
  striped.push_back({name, "grpc", {{"streams", k}}, true, false, false});
  return &striped.back();
}

}  // namespace xsilo::bench
