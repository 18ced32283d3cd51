// mode=unary of the grpc transport (see unary_transport.cpp).
#pragma once

#include <memory>

#include "transport/grpc/options.h"
#include "xsilo/transport/transport.h"

namespace xsilo::grpclink {

std::unique_ptr<Transport> MakeUnaryTransport(const TransportOptions& options,
                                              const GrpcOptions& g);

}  // namespace xsilo::grpclink
