// Endpoints and relays started inside a test.
#pragma once

#include <memory>
#include <string>

#include "endpoint/endpoint.h"
#include "endpoint/relay.h"
#include "xsilo/store/connector.h"

namespace xsilo::testing {

// A fresh temporary directory, removed when the test binary exits.
std::string TempDir(const std::string& tag);

// A relay on 127.0.0.1 with a self-signed certificate in a temporary
// directory; *ca_file gets the certificate endpoints verify it with.
std::unique_ptr<endpoint::Relay> StartRelay(endpoint::RelayOptions o, std::string* ca_file);

std::unique_ptr<endpoint::Endpoint> StartEndpoint(endpoint::EndpointOptions o);

// An endpoint connector on the endpoint's local API.
std::unique_ptr<Connector> ConnectorFor(const endpoint::Endpoint& e, int timeout_ms = 60000);

}  // namespace xsilo::testing
