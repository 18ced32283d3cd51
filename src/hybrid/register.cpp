#include <algorithm>
#include <charconv>

#include "hybrid/embedded_s3.h"
#include "xsilo/hybrid/hybrid.h"
#include "xsilo/transport/registry.h"

namespace xsilo {

namespace {

constexpr const char* kStorePrefix = "store.";
constexpr int64_t kNoMax = INT64_MAX;

// The keys of <transport>+<connector> the hybrid reads itself: its own, and
// the store.* keys of the embedded object server (the other store.* keys
// are the connector's). HybridOptions' defaults are these.
const OptionTable& Table() {
  using T = OptionType;
  static const OptionTable table(
      "hybrid",
      {
          {"threshold", T::kString, "10485760", 0, 0, "",
           "bytes, or always / never: tensors this big go through the store; refused by "
           "auto+<connector>"},
          {"ttl_ms", T::kMillis, "600000", 1, kNoMax, "",
           "an object not confirmed by all its receivers is evicted this long after its upload"},
          {"presign_s", T::kSeconds, "3600", 0, kNoMax, "",
           "validity of presigned URLs in stubs when the store presigns; 0 = off (the embedded "
           "server needs > 0)"},
          {"connections", T::kInt, "32", 1, kNoMax, "",
           "parallel connections of presigned transfers (ranged GETs, grant parts); above 256 "
           "means 256"},
          {"min_part_bytes", T::kBytes, "5242880", 1, kNoMax, "",
           "smallest multipart part of a grant upload (65536 with the embedded object server)"},
          {"grants", T::kFlag, "0", 0, 0, "",
           "attach presigned upload grants to sends; always on with the embedded object server"},
          {"recycle_bytes", T::kBytes, "2147483648", 0, kNoMax, "",
           "idle storage of URL downloads kept for reuse; 0 = off; also a grpc or auto base's"},
          {"workers", T::kInt, "2", 1, kNoMax, "",
           "threads that prepare and upload sends; above 64 means 64"},
          {"store.embedded", T::kFlag, "", 0, 0, "",
           "s3: 1 = rank 0 runs the embedded object server; default 1 exactly when "
           "store.endpoint is absent"},
          {"store.embedded_bind", T::kString, "", 0, 0, "",
           "s3, embedded: the address it binds; empty: the transport address's host (127.0.0.1 "
           "for a wildcard)"},
          {"store.embedded_port", T::kInt, "0", 0, 65535, "",
           "s3, embedded: its port; 0 = ephemeral"},
          {"store.embedded_advertise", T::kString, "", 0, 0, "",
           "s3, embedded: host:port the other parties reach it at; URLs are presigned for it"},
          {"store.tls_cert", T::kString, "", 0, 0, "",
           "s3, embedded: PEM certificate (with store.tls_key); it then serves https"},
          {"store.tls_key", T::kString, "", 0, 0, "",
           "s3, embedded: PEM private key file of store.tls_cert"},
          {"store.ca_file", T::kString, "", 0, 0, "",
           "PEM roots verifying an https object server, for the presigned transfers (and the "
           "s3 connector's own)"},
      });
  return table;
}

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
  const OptionTable& table = Table();
  TransportOptions inner_options = options;
  inner_options.backend.clear();
  ConnectorConfig store{connector_type, {}};
  OptionMap own;  // the hybrid's keys, whole; the embedded server's go to `store` too
  for (const auto& [k, v] : options.backend) {
    if (table.Find(k) != nullptr) own[k] = v;
    if (k == "recycle_bytes" && (base == "grpc" || base == "auto")) inner_options.backend[k] = v;
    if (k.rfind(kStorePrefix, 0) == 0) {
      store.options[k.substr(std::string(kStorePrefix).size())] = v;
    } else if (table.Find(k) == nullptr) {
      inner_options.backend[k] = v;
    }
  }
  if (connector_type != "s3") {
    for (const auto& [k, v] : own) {
      if (k.rfind(kStorePrefix, 0) == 0 && k != "store.ca_file") {
        return InvalidArgument(k + " is the s3 connector's embedded object server's, not the " +
                               connector_type + " connector's");
      }
    }
  }
  HybridOptions hybrid;
  if (const std::string t = table.String(own, "threshold"); t == "always") {
    hybrid.offload = Offload::kAlways;
  } else if (t == "never") {
    hybrid.offload = Offload::kNever;
  } else {
    XSILO_ASSIGN_OR_RETURN(int64_t bytes, ParseInt("threshold", t, 0));
    hybrid.threshold_bytes = static_cast<uint64_t>(bytes);
  }
  XSILO_ASSIGN_OR_RETURN(int64_t ttl_ms, table.Int(own, "ttl_ms"));
  hybrid.ttl = std::chrono::milliseconds(ttl_ms);
  XSILO_ASSIGN_OR_RETURN(int64_t presign_s, table.Int(own, "presign_s"));
  hybrid.presign_expiry = std::chrono::seconds(presign_s);
  XSILO_ASSIGN_OR_RETURN(int64_t connections, table.Int(own, "connections"));
  hybrid.url_connections = static_cast<int>(std::min<int64_t>(connections, 256));
  XSILO_ASSIGN_OR_RETURN(int64_t min_part, table.Int(own, "min_part_bytes"));
  hybrid.min_part_bytes = static_cast<uint64_t>(min_part);
  XSILO_ASSIGN_OR_RETURN(hybrid.grant_uploads, table.Flag(own, "grants"));
  XSILO_ASSIGN_OR_RETURN(int64_t recycle, table.Int(own, "recycle_bytes"));
  hybrid.recycle_bytes = static_cast<uint64_t>(recycle);
  XSILO_ASSIGN_OR_RETURN(int64_t workers, table.Int(own, "workers"));
  hybrid.workers = static_cast<int>(std::min<int64_t>(workers, 64));
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
      XSILO_RETURN_IF_ERROR(table.Flag(own, "store.embedded").status());
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
      XSILO_ASSIGN_OR_RETURN(port, table.Int(own, "store.embedded_port"));
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
  const bool adaptive = base == "auto";
  if (adaptive) hybrid.offload = Offload::kAdaptive;
  if (adaptive && options.backend.count("threshold")) {
    return InvalidArgument("auto+" + connector_type +
                           " chooses inline or the store per message; 'threshold' does not apply");
  }
  if (auto it = inner_options.backend.find("streams");
      adaptive && it != inner_options.backend.end()) {
    // grpc validates the value itself (1..64); a bad one fails its Create.
    auto k = ParseInt("streams", it->second, 1);
    if (k.ok()) hybrid.stripe_streams = static_cast<int>(std::min<int64_t>(*k, 64));
  }
  XSILO_ASSIGN_OR_RETURN(
      std::unique_ptr<Transport> inner,
      TransportRegistry::Global().Create(adaptive ? "grpc" : base, inner_options));
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

const OptionTable& HybridOptionTable() { return Table(); }

void RegisterHybridTransports() {
  TransportRegistry::Global().SetCompositeFactory(Compose, ConnectorTypes(), &Table());
}

}  // namespace xsilo
