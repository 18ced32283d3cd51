#include "transport/conformance.h"

XSILO_TRANSPORT_CONFORMANCE(TensorPipe, {.backend = "tensorpipe", .network = true});
XSILO_TRANSPORT_CONFORMANCE(TensorPipeMpt, {.backend = "tensorpipe",
                                            .backend_options = {{"lanes", "4"}},
                                            .network = true,
                                            .label = "tensorpipe_mpt4"});
