// Receive side of the gRPC link protocol, free of gRPC types: puts chunks
// of messages (possibly interleaved over several ordered streams) back
// together in one preallocated Buffer per message, validates every chunk,
// and releases finished messages in message-id order.
//
// Not thread-safe; the owning link serializes calls.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "xsilo/core/buffer.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/status.h"

namespace xsilo::grpclink {

struct ReassemblyLimits {
  // Largest frame a sender may announce. Larger totals fail before allocation.
  uint64_t max_message_bytes = 1ull << 40;
  // Messages being assembled at once; more fail with ResourceExhausted.
  uint64_t max_open_messages = 64;
  // A chunk's message id may lead the next id to deliver by at most this.
  uint64_t id_window = 4096;
};

// A message ready to hand on, in delivery order: either the whole frame or
// the reason it was dropped.
struct Reassembled {
  uint64_t message_id = 0;
  Buffer frame;   // empty when dropped
  Status status;  // OK, or why the message was dropped
  // PayloadChecksum of the frame's payload, computed while the chunks came in (for
  // DecodeLimits::payload_checksum); empty if the frame prefix did not
  // arrive whole in the first chunk, and decoding hashes the payload then.
  std::optional<uint64_t> payload_checksum;
};

// A chunk's bytes in order, possibly spread over several pieces of memory
// (gRPC's receive slices).
using ChunkPieces = std::span<const std::span<const uint8_t>>;

class Reassembler {
 public:
  // Message buffers come from `pool` when given (a finished message's
  // buffer goes back to it once the receiver drops the message; a dropped
  // or partial one is unmapped), else from Buffer::Allocate.
  Reassembler(ReassemblyLimits limits, int stream_count,
              std::shared_ptr<BufferPool> pool = nullptr);

  // Accepts one chunk that arrived on `stream` (0-based, < stream_count).
  // Appends messages that became deliverable to `ready`, in id order. A
  // non-OK return describes a chunk that could not even be attributed to a
  // tracked message (its id is stale or far ahead); it changes no state.
  // `payload_offset` is the chunk's Chunk.payload_offset: non-zero on the
  // chunks of a message sent prefix last, so that its payload is hashed
  // as it arrives; the prefix, when it comes, must agree.
  Status OnChunk(int stream, uint64_t message_id, uint64_t offset, uint64_t total,
                 uint64_t payload_offset, ChunkPieces data, std::vector<Reassembled>* ready);
  Status OnChunk(int stream, uint64_t message_id, uint64_t offset, uint64_t total, ChunkPieces data,
                 std::vector<Reassembled>* ready) {
    return OnChunk(stream, message_id, offset, total, 0, data, ready);
  }
  Status OnChunk(int stream, uint64_t message_id, uint64_t offset, uint64_t total,
                 std::span<const uint8_t> data, std::vector<Reassembled>* ready,
                 uint64_t payload_offset = 0) {
    const std::span<const uint8_t> one[1] = {data};
    return OnChunk(stream, message_id, offset, total, payload_offset, ChunkPieces(one), ready);
  }

  // Frees every partial message (a disconnect); ids restart at 1.
  void Reset();

  // Bytes allocated for messages still being assembled.
  uint64_t open_bytes() const;
  size_t open_messages() const { return open_.size(); }

 private:
  struct Open {
    uint64_t total = 0;
    uint64_t received = 0;
    Buffer frame;
    std::map<uint64_t, uint64_t> ranges;  // begin -> end, merged, disjoint
    // The payload is hashed in order as bytes arrive: [payload_offset,
    // hashed) is in and hashed. payload_offset is 0 until the prefix or a
    // chunk's payload_offset said where the payload begins.
    uint64_t payload_offset = 0;
    uint64_t hashed = 0;
    bool prefix_checked = false;                // the prefix came and agreed
    std::optional<PayloadChecksumStream> hash;  // from when payload_offset is known
  };

  static void CopyIn(Open& o, uint64_t offset, ChunkPieces data);
  static void HashTo(Open& o, uint64_t end);
  static void StartHash(Open& o, uint64_t payload_offset);
  // Checks a prefix in the chunk at offset 0; learns the payload offset.
  Status TakePrefix(uint64_t id, Open& o, ChunkPieces data);

  void Fail(uint64_t id, Status why);
  void Release(std::vector<Reassembled>* ready);
  void DropMissing();

  ReassemblyLimits limits_;
  std::shared_ptr<BufferPool> pool_;
  std::map<uint64_t, Open> open_;
  std::map<uint64_t, Reassembled> done_;  // finished, waiting for earlier ids
  std::vector<uint64_t> stream_last_;     // highest id seen on each stream
  std::deque<uint64_t> recently_failed_;  // late chunks of these are ignored
  uint64_t next_ = 1;                     // next id to release
};

}  // namespace xsilo::grpclink
