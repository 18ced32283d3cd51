// PeerLink: everything one party knows about one peer of the gRPC
// transport, independent of how streams are opened (server handler or
// client dial-out). It owns the send queue, chunk dispatch and credit-based
// flow control, the receive-side reassembly, and the session (the set of
// striped streams currently connected to the peer).
//
// Threads (docs/transport-grpc.md): one writer thread per stream runs
// WriterLoop; one reader per stream calls OnFrame; the transport's delivery
// thread calls OnDelivered; users call Enqueue; the janitor calls
// ExpireQueued. All state is guarded by one mutex; user callbacks and
// gRPC writes run outside it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/grpc/link.pb.h"
#include "transport/grpc/reassembly.h"
#include "xsilo/core/codec.h"
#include "xsilo/transport/transport.h"

namespace xsilo::grpclink {

using Clock = std::chrono::steady_clock;

// A chunk to write: bytes [offset, offset + length) of `frame`, sent from
// the frame's own Buffers (wire.h), which it keeps alive.
struct ChunkOut {
  uint64_t message_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::shared_ptr<const EncodedFrame> frame;
  uint64_t payload_offset = 0;  // Chunk.payload_offset: set if the prefix goes last
};

// A chunk read: its bytes are views into the stream's receive buffers.
struct ChunkIn {
  uint64_t message_id = 0;
  uint64_t offset = 0;
  uint64_t total = 0;
  uint64_t payload_offset = 0;
  std::vector<std::span<const uint8_t>> pieces;
};

// One bidirectional stream as a link sees it. `write` and `write_chunk` run
// on the stream's writer thread only; `cancel` may run on any thread and
// must not block.
struct StreamSlot {
  int index = 0;
  uint64_t session = 0;
  std::function<bool(const Frame&)> write;
  std::function<bool(const ChunkOut&)> write_chunk;
  std::function<void()> cancel;
  // Guarded by the owning link's mutex.
  bool dead = false;
  bool said_goodbye = false;   // our Goodbye went out on this stream
  bool heard_goodbye = false;  // the peer's Goodbye came in on this stream
};

// A frame sent prefix last (docs/transport-grpc.md, "Prefix last"): its
// payload checksum is computed while the payload goes out, by the writers
// themselves, each hashing the blocks that end in the chunk it is about to
// write (the bytes are then in cache for the socket's copy); whoever
// hashes the last block writes the sum into the prefix and sets `ready`.
// The prefix, [0, payload_offset), is the last chunk and waits for it. A
// broadcast's links share one: each block is hashed by the first writer,
// of any link, to reach it.
struct PrefixLast {
  explicit PrefixLast(std::shared_ptr<const EncodedFrame> frame);
  // Hashes the blocks whose last byte lies in payload bytes
  // [from, from + length): call once for each payload chunk.
  void HashFor(uint64_t from, uint64_t length);

  std::shared_ptr<const EncodedFrame> frame;
  PayloadBlockHasher hasher;
  std::unique_ptr<std::atomic<bool>[]> claimed;  // per block: a writer took it
  std::atomic<uint64_t> left;                    // blocks not yet hashed
  std::promise<void> done;
  std::shared_future<void> ready;
};

// A frame to send; `prefix_last` set if it goes prefix last. A broadcast's
// peers share one OutFrame.
struct OutFrame {
  std::shared_ptr<const EncodedFrame> frame;
  std::shared_ptr<PrefixLast> prefix_last;
};

// Encodes `message` for PeerLink::Enqueue: prefix last if its tensors hold
// at least `prefix_last_bytes`, else hashed before anything is sent.
OutFrame EncodeForLink(const Message& message, uint64_t prefix_last_bytes);

// Payloads from which the grpc transport sends the prefix last.
inline constexpr uint64_t kPrefixLastBytes = 8ull << 20;

// One message queued for one peer. A broadcast's Outgoings share `frame`.
struct Outgoing {
  std::shared_ptr<const EncodedFrame> frame;
  std::shared_ptr<PrefixLast> prefix_last;  // set: prefix last
  uint64_t head = 0;                        // prefix last: bytes [0, head) go after the others
  SendCallback done;
  Clock::time_point queued;
  uint64_t id = 0;          // assigned when its first chunk is dispatched
  uint64_t dispatched = 0;  // bytes dispatched so far
  int stripe = 0;           // its chunks go on streams [0, stripe); 0: all
};

class PeerLink;

// A reassembled (or dropped) message on its way to the inbox.
struct Arrival {
  PeerLink* link = nullptr;
  uint64_t session = 0;
  Reassembled message;
};

// The least in-flight window per stream of a session (PeerLink's window is
// the larger of LinkConfig::window_bytes and this times the streams).
inline constexpr uint64_t kStreamWindowBytes = 4ull << 20;

struct LinkConfig {
  int32_t peer = 0;
  uint64_t chunk_bytes = 4ull << 20;
  uint64_t window_bytes = 32ull << 20;
  ReassemblyLimits limits;
  // Where message buffers come from (null: Buffer::Allocate).
  std::shared_ptr<BufferPool> pool;
  // Receives finished messages in order; called with the link's mutex held,
  // so it must only queue.
  std::function<void(Arrival)> sink;
};

class PeerLink {
 public:
  explicit PeerLink(LinkConfig config);
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  int32_t peer() const { return config_.peer; }

  // Queues a message; `done` fires once when the peer delivered it (or with
  // the reason it was not). Fails at once with Cancelled after Close.
  // `stripe` > 0: its chunks go on the first `stripe` streams only (the
  // others idle while it is dispatched); 0: on all of them.
  void Enqueue(OutFrame frame, SendCallback done, int stripe = 0);
  // Fails queued messages that waited longer than `max_wait` while no
  // session was up.
  void ExpireQueued(Clock::duration max_wait);

  // Registers `slot` as stream `slot->index` of `session`. A session id
  // other than the current one starts a new session and ends the old one
  // (the peer reconnected). The session is up once all `stream_count`
  // streams are attached.
  Status Attach(uint64_t session, int stream_count, StreamSlot* slot);
  // Forgets `slot`; call after its reader and writer have finished.
  void Detach(StreamSlot* slot);
  // Ends `session` if it is current: cancels its streams, fails messages
  // with chunks already sent with `why`, frees partially received ones.
  void Break(uint64_t session, const Status& why);
  // Waits until `session` ended or `timeout` passed; true if it ended.
  bool WaitEnded(uint64_t session, Clock::duration timeout);
  bool Up() const;
  // True while arrivals of `session` should still be delivered.
  bool Current(uint64_t session) const;

  // The writer thread body of one stream; returns when the stream dies.
  void WriterLoop(StreamSlot* slot);
  // Handles one frame read from `slot`; false on a protocol violation
  // (the caller ends the stream).
  bool OnFrame(StreamSlot* slot, const Frame& frame);
  bool OnChunk(StreamSlot* slot, const ChunkIn& chunk);
  // The delivery thread reports the outcome of an arrival.
  void OnDelivered(uint64_t session, uint64_t message_id, const Status& outcome);

  // Clean stop, step 1 (docs/transport-grpc.md, "Stop"): from now on
  // chunks of the peer are refused (a Cancelled outcome, "not delivered")
  // instead of assembled. Waits until `deadline` for every message of ours
  // to have its outcome and every outcome we owe the peer to be written;
  // then every stream ends with a Goodbye and Drain returns true. False if
  // the deadline passed or no session is up (nothing is said then).
  bool Drain(Clock::time_point deadline);
  // Step 1 without the wait: refuse the peer's chunks from now on.
  void BeginDrain();
  // Clean stop, step 2: waits until `deadline` for the peer to end the
  // session (it does once our Goodbye arrived on every stream).
  bool WaitBroken(Clock::time_point deadline);

  // Ends the session and fails every pending message with `why`; later
  // Enqueues fail with Cancelled.
  void Close(const Status& why);

  // Bytes of partially received messages (for tests).
  uint64_t open_bytes() const;

 private:
  using Failures = std::vector<std::pair<SendCallback, Status>>;
  bool CanDispatchLocked(const StreamSlot& slot) const;
  // Streams that carry `m`'s chunks, and the chunk size striped over them.
  int StreamsForLocked(const Outgoing& m) const;
  uint64_t StripeChunkLocked(const Outgoing& m) const;
  // The frame range [*offset, *offset + *length) of `m`'s next chunk: in
  // order, or, prefix last, [head, size) in order and then [0, head).
  void NextChunkLocked(const Outgoing& m, uint64_t* offset, uint64_t* length) const;
  void BreakLocked(const Status& why, Failures* failures);
  static void Fire(Failures& failures);

  bool DrainedLocked() const;
  void RefuseWhileDrainingLocked(uint64_t message_id, uint64_t bytes);

  const LinkConfig config_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  bool draining_ = false;  // Drain began: the peer's chunks are refused
  bool goodbye_ = false;   // Drain finished: writers say Goodbye, then nothing

  // Session.
  uint64_t session_ = 0;
  bool broken_ = true;  // no session yet
  int stream_count_ = 0;
  int attached_ = 0;
  int goodbyes_heard_ = 0;
  std::vector<StreamSlot*> slots_;

  // Send side.
  std::deque<std::shared_ptr<Outgoing>> queue_;
  std::shared_ptr<Outgoing> current_;                   // partly dispatched
  std::map<uint64_t, std::shared_ptr<Outgoing>> sent_;  // awaiting the peer's ack
  uint64_t next_id_ = 1;
  uint64_t in_flight_ = 0;  // bytes sent and not yet credited back
  std::deque<Ack> control_;
  int writing_ = 0;  // writers in the middle of a write

  // Receive side.
  Reassembler reassembler_;
  uint64_t owed_credit_ = 0;   // bytes consumed, not yet credited to the peer
  uint64_t undelivered_ = 0;   // arrivals handed to the sink, not yet delivered
  uint64_t last_refused_ = 0;  // while draining: the last message id refused
};

}  // namespace xsilo::grpclink
