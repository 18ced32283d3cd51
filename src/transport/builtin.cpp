#include "transport/builtin.h"

#include "xsilo/transport/compression.h"

namespace xsilo {

void RegisterBuiltinTransports(TransportRegistry& registry) {
  (void)registry.Register(InprocTransportFactory());
  (void)registry.Register(GrpcTransportFactory());
  // "auto" alone is grpc; "auto+<connector>" (src/hybrid) chooses per
  // message between grpc and the connector by the measured link.
  TransportFactory automatic = GrpcTransportFactory();
  automatic.name = "auto";
  automatic.description =
      "grpc; as auto+<connector> (auto+s3) each message goes inline or through the connector, "
      "as the measured link to its receivers says (docs/auto.md)";
  (void)registry.Register(std::move(automatic));
#ifdef XSILO_HAVE_MPI
  (void)registry.Register(MpiGenericTransportFactory());
  (void)registry.Register(MpiBufferTransportFactory());
#endif
#ifdef XSILO_HAVE_TENSORPIPE
  (void)registry.Register(TensorPipeTransportFactory());
#endif
}

std::vector<const OptionTable*> BackendOptionTables() {
  return {&GrpcOptionTable(), &TensorPipeOptionTable(),  &InprocOptionTable(),
          &MpiOptionTable(),  &CompressionOptionTable(), &FaultOptionTable()};
}

}  // namespace xsilo
