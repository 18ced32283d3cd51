#include "transport/builtin.h"

namespace xsilo {

void RegisterBuiltinTransports(TransportRegistry& registry) {
  (void)registry.Register(InprocTransportFactory());
  (void)registry.Register(GrpcTransportFactory());
  (void)registry.Register(MpiGenericTransportFactory());
  (void)registry.Register(MpiBufferTransportFactory());
#ifdef XSILO_HAVE_TENSORPIPE
  (void)registry.Register(TensorPipeTransportFactory());
#endif
}

}  // namespace xsilo
