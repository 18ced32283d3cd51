#include "transport/conformance.h"

XSILO_TRANSPORT_CONFORMANCE(Grpc, {.backend = "grpc", .network = true});
// Striping: every message's chunks spread over three channels.
XSILO_TRANSPORT_CONFORMANCE(GrpcStriped,
                            {.backend = "grpc",
                             .backend_options = {{"streams", "3"}, {"chunk_bytes", "1048576"}},
                             .network = true,
                             .label = "grpc_streams3"});
