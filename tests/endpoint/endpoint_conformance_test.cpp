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

// Two endpoints and a relay: the connector talks to A, and its keys are
// owned by B (option put_to), so every call crosses from A to B, directly
// (B has a peer listener) or through the relay's pipe (B has none).
struct RemoteOwner {
  std::string ca;
  std::unique_ptr<endpoint::Relay> relay;
  std::unique_ptr<endpoint::Endpoint> a, b;
  explicit RemoteOwner(bool direct) {
    relay = StartRelay({}, &ca);
    endpoint::EndpointOptions o;
    o.relay = "127.0.0.1:" + std::to_string(relay->port());
    o.relay_ca = ca;
    o.punch = false;  // on one machine a punched path always works; this is the relay's case
    a = StartEndpoint(o);
    if (direct) o.peer_listen = "127.0.0.1:0";
    b = StartEndpoint(o);
  }
  ConnectorConfig Config() const {
    ConnectorConfig c = ConfigOf(*a);
    c.options["put_to"] = b->uuid();
    return c;
  }
};

ConnectorConfig DirectOwnerConfig() {
  static const RemoteOwner r(true);
  return r.Config();
}

ConnectorConfig RelayedOwnerConfig() {
  static const RemoteOwner r(false);
  return r.Config();
}

}  // namespace
}  // namespace xsilo::testing

XSILO_CONNECTOR_CONFORMANCE(Endpoint, {.name = "endpoint", .config = MemoryEndpointConfig});
XSILO_CONNECTOR_CONFORMANCE(EndpointDir, {.name = "endpoint_dir",
                                          .config = DirEndpointConfig,
                                          .huge_payloads = false});
XSILO_CONNECTOR_CONFORMANCE(EndpointDirectOwner,
                            {.name = "endpoint_direct_owner", .config = DirectOwnerConfig});
XSILO_CONNECTOR_CONFORMANCE(EndpointRelayedOwner, {.name = "endpoint_relayed_owner",
                                                   .config = RelayedOwnerConfig,
                                                   .huge_payloads = false});
