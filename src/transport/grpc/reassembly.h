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
#include <span>
#include <vector>

#include "xsilo/core/buffer.h"
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
};

class Reassembler {
 public:
  Reassembler(ReassemblyLimits limits, int stream_count);

  // Accepts one chunk that arrived on `stream` (0-based, < stream_count).
  // Appends messages that became deliverable to `ready`, in id order. A
  // non-OK return describes a chunk that could not even be attributed to a
  // tracked message (its id is stale or far ahead); it changes no state.
  Status OnChunk(int stream, uint64_t message_id, uint64_t offset, uint64_t total,
                 std::span<const uint8_t> data, std::vector<Reassembled>* ready);

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
  };

  void Fail(uint64_t id, Status why);
  void Release(std::vector<Reassembled>* ready);
  void DropMissing();

  ReassemblyLimits limits_;
  std::map<uint64_t, Open> open_;
  std::map<uint64_t, Reassembled> done_;  // finished, waiting for earlier ids
  std::vector<uint64_t> stream_last_;     // highest id seen on each stream
  std::deque<uint64_t> recently_failed_;  // late chunks of these are ignored
  uint64_t next_ = 1;                     // next id to release
};

}  // namespace xsilo::grpclink
