#include <algorithm>
#include <charconv>

#include "hybrid/embedded_s3.h"
#include "xsilo/hybrid/hybrid.h"
#include "xsilo/transport/registry.h"

namespace xsilo {

namespace {

constexpr const char* kStorePrefix = "store.";

Result<int64_t> ParseInt(const std::string& key, const std::string& value, int64_t min) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || p != value.data() + value.size() || v < min) {
    return InvalidArgument("hybrid option " + key + "='" + value +
                           "' must be an integer >= " + std::to_string(min));
  }
  return v;
}

// "host:port", "[v6]:port" or "host" -> host; "" when there is none.
std::string HostOf(const std::string& address) {
  if (!address.empty() && address[0] == '[') {
    auto close = address.find(']');
    return close == std::string::npos ? "" : address.substr(1, close - 1);
  }
  auto colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

Result<std::unique_ptr<Transport>> Compose(const std::string& base,
                                           const std::string& connector_type,
                                           const TransportOptions& options) {
  TransportOptions inner_options = options;
  inner_options.backend.clear();
  ConnectorConfig store{connector_type, {}};
  HybridOptions hybrid;
  for (const auto& [k, v] : options.backend) {
    if (k.rfind(kStorePrefix, 0) == 0) {
      store.options[k.substr(std::string(kStorePrefix).size())] = v;
    } else if (k == "threshold") {
      if (v == "always")
        hybrid.threshold_bytes = 0;
      else if (v == "never")
        hybrid.threshold_bytes = UINT64_MAX;
      else {
        XSILO_ASSIGN_OR_RETURN(int64_t t, ParseInt(k, v, 0));
        hybrid.threshold_bytes = static_cast<uint64_t>(t);
      }
    } else if (k == "ttl_ms") {
      XSILO_ASSIGN_OR_RETURN(int64_t t, ParseInt(k, v, 1));
      hybrid.ttl = std::chrono::milliseconds(t);
    } else if (k == "presign_s") {
      XSILO_ASSIGN_OR_RETURN(int64_t t, ParseInt(k, v, 0));
      hybrid.presign_expiry = std::chrono::seconds(t);
    } else if (k == "connections") {
      XSILO_ASSIGN_OR_RETURN(int64_t t, ParseInt(k, v, 1));
      hybrid.url_connections = static_cast<int>(std::min<int64_t>(t, 256));
    } else if (k == "min_part_bytes") {
      XSILO_ASSIGN_OR_RETURN(int64_t t, ParseInt(k, v, 1));
      hybrid.min_part_bytes = static_cast<uint64_t>(t);
    } else if (k == "grants") {
      if (v != "0" && v != "1") return InvalidArgument("hybrid option grants must be 0 or 1");
      hybrid.grant_uploads = v == "1";
    } else if (k == "recycle_bytes") {
      XSILO_ASSIGN_OR_RETURN(int64_t t, ParseInt(k, v, 0));
      hybrid.recycle_bytes = static_cast<uint64_t>(t);
      if (base == "grpc" || base == "auto") inner_options.backend[k] = v;
    } else if (k == "workers") {
      XSILO_ASSIGN_OR_RETURN(int64_t t, ParseInt(k, v, 1));
      hybrid.workers = static_cast<int>(std::min<int64_t>(t, 64));
    } else {
      inner_options.backend[k] = v;
    }
  }
  // An s3 store without an endpoint is the embedded object server: rank 0
  // runs it in a child process; the other parties hold no credentials and
  // use the presigned URLs rank 0 hands out.
  const bool embedded = connector_type == "s3" &&
                        (store.options.count("embedded") ? store.options["embedded"] == "1"
                                                         : store.options.count("endpoint") == 0);
  std::string bind, advertise, advertise_endpoint;
  int64_t port = 0;
  EmbeddedTls tls;
  if (auto it = store.options.find("ca_file"); it != store.options.end()) {
    hybrid.url_ca_file = it->second;  // and the connector keeps it
  }
  for (const char* k : {"tls_cert", "tls_key"}) {
    auto it = store.options.find(k);
    if (it == store.options.end()) continue;
    if (!embedded) {
      return InvalidArgument(std::string("store.") + k +
                             " is the embedded object server's certificate; an external store's "
                             "TLS is its own (give store.ca_file to verify it)");
    }
    (std::string(k) == "tls_cert" ? tls.cert_file : tls.key_file) = it->second;
    store.options.erase(it);
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return InvalidArgument("store.tls_cert and store.tls_key go together");
  }
  for (const char* k : {"embedded", "embedded_bind", "embedded_port", "embedded_advertise"}) {
    auto it = store.options.find(k);
    if (it == store.options.end()) continue;
    if (std::string(k) == "embedded") {
      if (it->second != "0" && it->second != "1")
        return InvalidArgument("store.embedded must be 0 or 1");
    } else if (std::string(k) == "embedded_bind") {
      bind = it->second;
    } else if (std::string(k) == "embedded_advertise") {
      // "host:port" the other parties reach the server at (a port forward,
      // NAT, a proxy); URLs are presigned for it.
      const std::string& a = it->second;
      const auto colon = a.rfind(':');
      Result<int64_t> p = colon == std::string::npos || colon == 0
                              ? Result<int64_t>(InvalidArgument("no port"))
                              : ParseInt(k, a.substr(colon + 1), 1);
      if (!p.ok() || *p > 65535) {
        return InvalidArgument("store.embedded_advertise='" + a + "' must be host:port");
      }
      advertise_endpoint = (tls.cert_file.empty() ? "http://" : "https://") + a;
    } else {
      XSILO_ASSIGN_OR_RETURN(port, ParseInt("store.embedded_port", it->second, 0));
      if (port > 65535) return InvalidArgument("store.embedded_port must be in [0, 65535]");
    }
    store.options.erase(it);
  }
  std::shared_ptr<Connector> connector;
  std::shared_ptr<void> keepalive;
  if (embedded) {
    if (hybrid.presign_expiry.count() <= 0) {
      return InvalidArgument("the embedded object server needs presigned URLs (presign_s > 0)");
    }
    hybrid.grant_uploads = true;
    if (!options.backend.count("min_part_bytes")) hybrid.min_part_bytes = EmbeddedS3::kMinPartBytes;
    if (options.rank == 0) {
      advertise = HostOf(options.address);
      if (advertise.empty() || advertise == "0.0.0.0" || advertise == "::" || advertise == "[::]") {
        advertise = "127.0.0.1";
      }
      if (bind.empty()) bind = advertise;
      // Forked before the inner transport exists, while this process has
      // as few threads as it will ever have.
      // A worker per connection: every client's ranged GETs of a broadcast
      // at once, and as many uploads. Workers start as connections come.
      const int workers = static_cast<int>(std::clamp<int64_t>(
          2 * int64_t{options.world_size - 1} * hybrid.url_connections + 16, 64, 4096));
      XSILO_ASSIGN_OR_RETURN(
          std::shared_ptr<EmbeddedS3> server,
          EmbeddedS3::Start(bind, static_cast<int>(port), advertise, tls, workers));
      store.options["endpoint"] =
          advertise_endpoint.empty() ? server->endpoint() : advertise_endpoint;
      store.options["access_key"] = server->access_key();
      store.options["secret_key"] = server->secret_key();
      store.options["bucket"] = EmbeddedS3::kBucket;
      store.options["addressing"] = "path";
      store.options["create_bucket"] = "0";
      store.options["local_dir"] = server->directory();  // rank 0's own puts skip HTTP
      store.options["local_etags"] = "xxh3";             // as the embedded server's own
      XSILO_ASSIGN_OR_RETURN(std::unique_ptr<Connector> c, MakeConnector(store));
      connector = std::move(c);
      keepalive = std::move(server);
    }
  } else {
    // Every party of "<base>+endpoint" talks to its own site's endpoint:
    // without one it has nowhere to put its objects nor to fetch others' from.
    if (connector_type == "endpoint" && store.options.count("address") == 0) {
      return InvalidArgument(base + "+endpoint needs store.address=HOST:PORT, the local API of " +
                             "this party's own endpoint (`xsilo endpoint start`, " +
                             "docs/endpoint.md)");
    }
    XSILO_ASSIGN_OR_RETURN(std::unique_ptr<Connector> c, MakeConnector(store));
    connector = std::move(c);
  }
  // "auto+<connector>": grpc underneath, the path chosen per message.
  hybrid.adaptive = base == "auto";
  if (hybrid.adaptive && options.backend.count("threshold")) {
    return InvalidArgument("auto+" + connector_type +
                           " chooses inline or the store per message; 'threshold' does not apply");
  }
  if (auto it = inner_options.backend.find("streams");
      hybrid.adaptive && it != inner_options.backend.end()) {
    // grpc validates the value itself (1..64); a bad one fails its Create.
    auto k = ParseInt("streams", it->second, 1);
    if (k.ok()) hybrid.stripe_streams = static_cast<int>(std::min<int64_t>(*k, 64));
  }
  XSILO_ASSIGN_OR_RETURN(
      std::unique_ptr<Transport> inner,
      TransportRegistry::Global().Create(hybrid.adaptive ? "grpc" : base, inner_options));
  return MakeHybridTransport(options, std::move(inner), std::move(connector), hybrid,
                             connector_type, std::move(keepalive));
}

// Installs the composite factory when the library is loaded (the hybrid
// library is linked whole, so this object is never dropped).
const bool kRegistered = [] {
  RegisterHybridTransports();
  return true;
}();

}  // namespace

void RegisterHybridTransports() {
  TransportRegistry::Global().SetCompositeFactory(Compose, ConnectorTypes());
}

}  // namespace xsilo
