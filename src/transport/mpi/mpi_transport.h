// mpi-generic and mpi-buffer: the two MPI transports (Open MPI), one rank
// per process, launched by mpirun. Documented in docs/transport-mpi.md.
//
// mpi-generic  encodes each Message (xsilo/core/codec.h) and flattens the
//              frame into one contiguous buffer that it sends: one payload
//              copy per message (per broadcast, not per receiver), like
//              mpi4py's lowercase comm.send.
// mpi-buffer   sends a small envelope holding the frame header (message
//              header, safetensors header), then every tensor straight from
//              its own Buffer: no serialization copy, and a broadcast
//              Isends the same Buffers to every peer. Like uppercase Send.
// Both receive into one frame Buffer allocated from the envelope's sizes;
// decoded tensors are views into it.
//
// options.rank and options.world_size must equal the process's rank and
// size in MPI_COMM_WORLD. options.address is ignored. Backend options:
//   chunk_bytes=N      largest single MPI message, 1..1073741824 (default
//                      1 GiB): larger tensors go as several messages, so
//                      MPI's int counts never overflow.
//   inline_bytes=N     mpi-generic: frames up to N bytes travel inside the
//                      envelope as one MPI message (default 16384).
//   verify_checksum=0|1  the receiver verifies the payload checksum
//                      (default 1).
//   poll_max_us=N      longest sleep between receive probes while idle, in
//                      microseconds (default 1000); bounds idle latency.
#pragma once

#include <memory>

#include "xsilo/transport/transport.h"

namespace xsilo {

enum class MpiSendMode { kFlatten, kGather };

Result<std::unique_ptr<Transport>> MakeMpiTransport(const TransportOptions& options,
                                                    MpiSendMode mode);

}  // namespace xsilo
