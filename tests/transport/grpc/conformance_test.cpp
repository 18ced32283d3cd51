#include "transport/conformance.h"

XSILO_TRANSPORT_CONFORMANCE(Grpc, {.backend = "grpc", .network = true});
