#include "transport/builtin.h"

namespace xsilo {

void RegisterBuiltinTransports(TransportRegistry& registry) {
  (void)registry.Register(InprocTransportFactory());
  (void)registry.Register(MpiGenericTransportFactory());
  (void)registry.Register(MpiBufferTransportFactory());
}

}  // namespace xsilo
