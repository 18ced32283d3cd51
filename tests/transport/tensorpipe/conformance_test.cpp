#include "transport/conformance.h"

XSILO_TRANSPORT_CONFORMANCE(TensorPipe, {.backend = "tensorpipe", .network = true});
XSILO_TRANSPORT_CONFORMANCE(TensorPipeMpt, {.backend = "tensorpipe",
                                            .backend_options = {{"lanes", "4"}},
                                            .network = true,
                                            .label = "tensorpipe_mpt4"});
// Shared memory between peers on one host (uv makes first contact). The
// >2 GiB case is covered by the TCP configurations above.
XSILO_TRANSPORT_CONFORMANCE(TensorPipeShm, {.backend = "tensorpipe",
                                            .backend_options = {{"transports", "uv,shm"}},
                                            .network = true,
                                            .label = "tensorpipe_shm",
                                            .huge_payloads = false});
