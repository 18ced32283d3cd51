// Private: constructors of the connector types compiled into this build.
// Each takes the options map of a ConnectorConfig.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "xsilo/core/option_table.h"
#include "xsilo/store/connector.h"

namespace xsilo {

using ConnectorOptions = std::map<std::string, std::string>;

Result<std::unique_ptr<Connector>> MakeMemoryConnector(const ConnectorOptions& options);
Result<std::unique_ptr<Connector>> MakeFileConnector(const ConnectorOptions& options);
Result<std::unique_ptr<Connector>> MakeRedisConnector(const ConnectorOptions& options);
Result<std::unique_ptr<Connector>> MakeS3Connector(const ConnectorOptions& options);
// The secret an S3 connector made here from `options` (a config() without
// its secret) would sign with, found as MakeS3Connector finds it. For tools
// and tests of this process that talk to the same store with their own
// client; never to be serialized.
Result<std::string> S3ConnectorSecret(const ConnectorOptions& options);
// A client of a local object endpoint (docs/endpoint.md).
Result<std::unique_ptr<Connector>> MakeEndpointConnector(const ConnectorOptions& options);
Result<std::unique_ptr<Connector>> MakeZmqConnector(const ConnectorOptions& options);
#ifdef XSILO_HAVE_UCX
// Objects served by the putting process over UCP (src/store/ucx/).
Result<std::unique_ptr<Connector>> MakeUcxConnector(const ConnectorOptions& options);
#endif
Result<std::unique_ptr<Connector>> MakeMultiConnector(const ConnectorOptions& options);
// Wraps the connector given by its "inner" options and injects faults.
Result<std::unique_ptr<Connector>> MakeFaultyConnector(const ConnectorOptions& options);

// Each type's option keys (connector_options.cpp): its parser reads its
// options through its table, which refuses a key without a row, naming the
// nearest.
const OptionTable& MemoryConnectorOptionTable();
const OptionTable& FileConnectorOptionTable();
const OptionTable& RedisConnectorOptionTable();
const OptionTable& S3ConnectorOptionTable();
const OptionTable& EndpointConnectorOptionTable();
const OptionTable& ZmqConnectorOptionTable();
const OptionTable& UcxConnectorOptionTable();
const OptionTable& MultiConnectorOptionTable();
const OptionTable& FaultyConnectorOptionTable();

// `what: strerror(e)` as a Status whose code fits the errno (NotFound,
// PermissionDenied, ResourceExhausted, else Internal).
Status ErrnoStatus(const std::string& what, int e);

}  // namespace xsilo
