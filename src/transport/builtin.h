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

// faulty(<transport>) (src/transport/faulty/): wraps `inner`; `options` are
// the decorator's (fault.* keys in options.backend, everything else was the
// inner transport's).
Result<std::unique_ptr<Transport>> MakeFaultyTransport(std::unique_ptr<Transport> inner,
                                                       const TransportOptions& options);
// The keys each reads (its parser reads them through the table).
const OptionTable& FaultOptionTable();       // fault.*
const OptionTable& GrpcOptionTable();        // grpc and auto
const OptionTable& TensorPipeOptionTable();  // in every build, TensorPipe or not
const OptionTable& InprocOptionTable();
const OptionTable& MpiOptionTable();  // mpi-generic and mpi-buffer

}  // namespace xsilo
