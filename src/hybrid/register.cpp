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
    } else if (k == "workers") {
      XSILO_ASSIGN_OR_RETURN(int64_t t, ParseInt(k, v, 1));
      hybrid.workers = static_cast<int>(std::min<int64_t>(t, 64));
    } else {
      inner_options.backend[k] = v;
    }
  }
  XSILO_ASSIGN_OR_RETURN(std::unique_ptr<Transport> inner,
                         TransportRegistry::Global().Create(base, inner_options));
  XSILO_ASSIGN_OR_RETURN(std::unique_ptr<Connector> connector, MakeConnector(store));
  return MakeHybridTransport(options, std::move(inner),
                             std::shared_ptr<Connector>(std::move(connector)), hybrid);
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
