// The tensorpipe transport's message descriptor: how an xsilo Message maps
// onto a tensorpipe::Message and back. Free of TensorPipe types, so it is
// tested (and fuzzable) on its own.
//
// tensorpipe::Message::metadata = "XTP1"
//                                 + a wire-format frame (xsilo/core/codec.h)
//                                   of the Message without its tensors
//                                 + the tensor table;
// tensorpipe::Message::tensors  = every tensor's bytes as pieces of at most
//                                 piece_bytes, in tensor-table order,
//                                 pointing straight into the Buffers.
//
// Tensor table (little-endian): u32 count, then per tensor: u32 name length,
// name, u8 dtype, u32 ndim, ndim x i64 dims, u64 nbytes, u64 xxh3 (0 when
// not verified), u32 pieces.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "xsilo/core/message.h"
#include "xsilo/core/status.h"

namespace xsilo::tplink {

struct Piece {
  uint8_t* data = nullptr;
  uint64_t length = 0;
};

struct OutgoingPlan {
  std::string metadata;
  std::vector<Piece> pieces;
};

// The sender's side: no payload byte is copied (checksums read them once).
OutgoingPlan PlanOutgoing(const Message& message, uint64_t piece_bytes, bool checksum);

struct IncomingPlan {
  Message message;            // header, and tensors with freshly allocated Buffers
  std::vector<Piece> pieces;  // where each announced piece lands
  std::vector<std::pair<std::string, uint64_t>> checksums;  // tensor name, xxh3
};

// The receiver's side: parses and validates `metadata` against the piece
// lengths TensorPipe announced, before allocating anything. Sizes above
// `max_message_bytes` are ResourceExhausted; every malformation is Corrupt.
Result<IncomingPlan> PlanIncoming(std::string_view metadata,
                                  const std::vector<uint64_t>& piece_lengths,
                                  uint64_t max_message_bytes);

// After the pieces arrived: Corrupt if a tensor's checksum differs.
Status VerifyIncoming(const IncomingPlan& plan);

}  // namespace xsilo::tplink
