// Private: the factories of the backends compiled into this build.
#pragma once

#include "xsilo/transport/registry.h"

namespace xsilo {

void RegisterBuiltinTransports(TransportRegistry& registry);

TransportFactory InprocTransportFactory();
TransportFactory GrpcTransportFactory();
// Open MPI, one rank per process (src/transport/mpi/).
TransportFactory MpiGenericTransportFactory();
TransportFactory MpiBufferTransportFactory();
// TensorPipe (src/transport/tensorpipe/); only in builds with XSILO_HAVE_TENSORPIPE.
TransportFactory TensorPipeTransportFactory();

}  // namespace xsilo
