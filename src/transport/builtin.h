// Private: the factories of the backends compiled into this build.
#pragma once

#include "xsilo/transport/registry.h"

namespace xsilo {

void RegisterBuiltinTransports(TransportRegistry& registry);

TransportFactory InprocTransportFactory();
// Open MPI, one rank per process (src/transport/mpi/).
TransportFactory MpiGenericTransportFactory();
TransportFactory MpiBufferTransportFactory();

}  // namespace xsilo
