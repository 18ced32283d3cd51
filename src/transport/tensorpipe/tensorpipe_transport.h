// tensorpipe: the transport under PyTorch RPC. Rank 0 listens on
// options.address, clients connect to it, one TensorPipe pipe per client.
// Tensors travel as TensorPipe tensors straight from and into Buffers; the
// message header travels as the descriptor (transport/tensorpipe/descriptor.h).
// Backend options, threading model and the mapping to PyTorch's
// TensorPipeRpcBackendOptions: docs/transport-tensorpipe.md.
#pragma once

#include <memory>

#include "xsilo/transport/transport.h"

namespace xsilo {

Result<std::unique_ptr<Transport>> MakeTensorPipeTransport(const TransportOptions& options);

}  // namespace xsilo
