// The connector conformance suite for "endpoint": an endpoint in this
// process (in memory), and one persisting to a directory.
#include <filesystem>

#include "endpoint/endpoint_test_util.h"
#include "store/connector_conformance.h"

namespace xsilo::testing {
namespace {

ConnectorConfig ConfigOf(const endpoint::Endpoint& e) {
  return {"endpoint",
          {{"address", "127.0.0.1:" + std::to_string(e.port())}, {"timeout_ms", "60000"}}};
}

ConnectorConfig MemoryEndpointConfig() {
  static const std::unique_ptr<endpoint::Endpoint> e = StartEndpoint({});
  return ConfigOf(*e);
}

// Removes its directory (100 MB of objects) when the test binary exits.
struct DirEndpoint {
  std::string dir = TempDir("endpoint-conformance");
  std::unique_ptr<endpoint::Endpoint> e = [this] {
    endpoint::EndpointOptions o;
    o.dir = dir;
    return StartEndpoint(o);
  }();
  ~DirEndpoint() {
    e.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

ConnectorConfig DirEndpointConfig() {
  static const DirEndpoint d;
  return ConfigOf(*d.e);
}

}  // namespace
}  // namespace xsilo::testing

XSILO_CONNECTOR_CONFORMANCE(Endpoint, {.name = "endpoint", .config = MemoryEndpointConfig});
XSILO_CONNECTOR_CONFORMANCE(EndpointDir, {.name = "endpoint_dir",
                                          .config = DirEndpointConfig,
                                          .huge_payloads = false});
