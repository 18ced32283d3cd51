// The process-wide MPI engine behind the mpi-generic and mpi-buffer
// transports. Private to src/: nothing here is part of the public API, and
// <mpi.h> is included only by the .cpp files.
//
// Threading model (see docs/transport-mpi.md):
//  - One engine thread per process calls MPI_Init_thread(FUNNELED) and then
//    makes every MPI call of every MPI transport in the process, so no MPI
//    call ever runs concurrently (MPI_THREAD_FUNNELED is enough).
//  - Transports talk to it through a command queue. The engine posts
//    non-blocking operations (Isend, Improbe + Imrecv) and tests them.
//  - It never spins while idle: without requests in flight it sleeps on a
//    condition variable between probes, backing off up to `poll_max_us`;
//    with requests in flight it yields, then sleeps up to 100 us.
//  - Send callbacks fire on the engine thread (keep them short).
//  - The engine finalizes MPI at process exit (atexit), after every closed
//    link has drained or a linger deadline passed.
//
// Protocol on each link's communicator (a dup of MPI_COMM_WORLD per
// transport instance, so instances never see each other's messages):
//  - tag kTagEnvelope: an envelope (EnvelopeFixed, then segment_count
//    uint64 sizes, then inline_len inline bytes) of kind message or fin;
//  - tag kTagData: the message's data segments, each cut into chunks of at
//    most chunk_bytes (<= 1 GiB, so MPI's int counts never overflow).
//  The receiver learns every size from the envelope, allocates the frame
//  once and receives every chunk straight into it. MPI's non-overtaking
//  rule per (source, tag) keeps envelopes and data in order; the receiver
//  handles one message per source at a time.
//  A stopping link sends a fin to every peer after its last envelope and
//  keeps draining (receiving and discarding) until it has a fin from every
//  peer and its own sends completed; only then is its communicator freed.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "xsilo/core/buffer.h"
#include "xsilo/transport/transport.h"

namespace xsilo::mpi {

inline constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 30;

// What a transport asks the engine to send to each of a set of peers.
struct Outgoing {
  Buffer envelope;               // built by BuildEnvelope
  std::vector<Buffer> segments;  // non-empty data segments, in order
  uint64_t chunk_bytes = kMaxChunkBytes;
};

// An envelope for a message whose frame is `inline_bytes` followed by the
// data segments. Fails if the envelope would not fit an MPI int count.
Result<Buffer> BuildMessageEnvelope(const std::vector<Buffer>& segments, uint64_t chunk_bytes,
                                    uint64_t inline_len,
                                    const std::function<void(uint8_t*)>& write_inline);

struct LinkConfig {
  int32_t rank = 0;
  int32_t world_size = 1;
  // Messages announcing more data bytes (beyond the envelope's inline
  // bytes) are drained and dropped, never allocated.
  uint64_t max_data_bytes = 0;
  // Received frames waiting for the delivery thread before the engine stops
  // probing for more (backpressure reaches the senders through MPI).
  size_t ready_capacity = 64;
  // Longest sleep between probes while idle, microseconds.
  int64_t poll_max_us = 1000;
};

struct Received {
  int32_t source = -1;
  Buffer frame;
};

struct LinkState;  // engine-side state, defined in mpi_engine_internal.h

// One transport instance's connection to the engine. Created by Open.
class Link {
 public:
  explicit Link(LinkConfig config);
  ~Link();
  const LinkConfig& config() const { return config_; }

  // For the delivery thread: the next received frame, or nullopt-like
  // (Cancelled) once the link is closed. Blocks until one of the two.
  Result<Received> NextReceived();

  // Engine side.
  void PushReceived(Received r);
  size_t ReadyCount();
  void CloseReady();

  std::unique_ptr<LinkState> state;  // touched only by the engine thread

 private:
  const LinkConfig config_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Received> ready_;
  bool closed_ = false;
};

class Engine {
 public:
  // Starts the engine thread and MPI on first use; the Status of
  // MPI_Init_thread is sticky.
  static Result<Engine*> Get();
  // True once MPI was initialized in this process by the engine.
  static bool Initialized();

  int32_t world_rank() const { return world_rank_; }
  int32_t world_size() const { return world_size_; }

  // Duplicates MPI_COMM_WORLD for a new link (collective: every process
  // opens its links in the same order). Unavailable if peers do not join
  // within `timeout`; the abandoned link then drains in the background.
  Result<std::shared_ptr<Link>> Open(LinkConfig config, Duration timeout);
  // Posts the message to every peer; `done` fires once on the engine thread.
  void Send(const std::shared_ptr<Link>& link, std::vector<int32_t> peers, Outgoing out,
            SendCallback done);
  // Fails every send in flight with Cancelled (their callbacks have fired
  // when this returns), sends fins, and leaves the link draining.
  void Close(const std::shared_ptr<Link>& link);

  bool OnEngineThread() const;

  struct Impl;

 private:
  Engine() = default;
  Impl* impl_ = nullptr;
  int32_t world_rank_ = 0;
  int32_t world_size_ = 1;
};

// OK when this process can use MPI: launched by mpirun (or a PMIx
// launcher), MPI already initialized, or a singleton MPI_Init works (probed
// once, in a forked child). Otherwise says why not.
Status MpiViable();

}  // namespace xsilo::mpi
