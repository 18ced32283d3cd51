#include "transport/conformance.h"

XSILO_TRANSPORT_CONFORMANCE(Inproc, {.backend = "inproc"});
XSILO_TRANSPORT_CONFORMANCE(InprocSerialized, {.backend = "inproc",
                                               .backend_options = {{"serialize", "1"}},
                                               .label = "inproc_serialized",
                                               .measure_broadcast_memory = false});
