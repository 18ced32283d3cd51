// inproc: peers are Transports in one process that share a named fabric
// (options.address). Messages are handed over by reference: the receiver
// sees the sender's Buffers, so nothing is copied, not even per receiver of
// a broadcast. Backend options:
//   serialize=0|1  (default 0) encode every message to a frame and decode a
//                  private copy on delivery, exercising the wire format.
#pragma once

#include <memory>

#include "xsilo/transport/transport.h"

namespace xsilo {

std::unique_ptr<Transport> MakeInprocTransport(const TransportOptions& options, bool serialize);

}  // namespace xsilo
