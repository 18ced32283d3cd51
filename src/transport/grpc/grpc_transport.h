// grpc: clients dial out to rank 0 and open one bidirectional stream per
// channel (`streams` channels); messages travel both ways as chunked
// frames with credit-based flow control. See docs/transport-grpc.md for the
// backend options, the protocol and the threading model.
#pragma once

#include <memory>

#include "xsilo/transport/transport.h"

namespace xsilo {

Result<std::unique_ptr<Transport>> MakeGrpcTransport(const TransportOptions& options);

}  // namespace xsilo
