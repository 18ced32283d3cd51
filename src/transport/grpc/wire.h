// Frames of the link protocol (link.proto) to and from gRPC ByteBuffers
// without copying chunk bytes. A Chunk frame is written exactly as protobuf
// would serialize it, but its data field is a list of gRPC slices that
// reference the message's own Buffers; a received Chunk frame is parsed in
// place and its data handed on as pieces of gRPC's receive slices. Every
// other frame is small and goes through protobuf.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <span>
#include <vector>

#include "transport/grpc/link.h"
#include "transport/grpc/link.pb.h"

namespace xsilo::grpclink {

// Frame{chunk: {message_id, offset, total, data}} where data is bytes
// [offset, offset + length) of the chunk's frame, referenced, not copied.
grpc::ByteBuffer ChunkToByteBuffer(const ChunkOut& chunk);
// Any other frame (serialized by protobuf).
grpc::ByteBuffer FrameToByteBuffer(const Frame& frame);

// A frame read from a stream: a chunk whose data are `chunk.pieces` (views
// into `slices`), or any other frame in `frame`.
struct Incoming {
  bool is_chunk = false;
  ChunkIn chunk;
  Frame frame;
  std::vector<grpc::Slice> slices;  // keeps chunk.pieces alive
};
// False if `bytes` is not a Frame.
bool ParseIncoming(const grpc::ByteBuffer& bytes, Incoming* out);

}  // namespace xsilo::grpclink
