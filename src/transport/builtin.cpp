#include "transport/builtin.h"

namespace xsilo {

void RegisterBuiltinTransports(TransportRegistry& registry) {
  (void)registry.Register(InprocTransportFactory());
}

}  // namespace xsilo
