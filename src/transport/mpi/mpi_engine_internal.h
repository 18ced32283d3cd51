// The MPI engine's internals, shared by its parts (mpi_engine.h has the
// threading model and the protocol):
//   mpi_envelope.cpp   the envelope a message or a fin travels with;
//   mpi_link.cpp       a link's queue of received messages;
//   mpi_engine.cpp     the engine thread, links' open/send/close, the
//                      process-wide engine and its exit;
//   mpi_progress.cpp   progress: sends tested, envelopes probed, data
//                      received chunk by chunk into the frame;
//   mpi_viability.cpp  whether MPI can run here (MpiViable).
// Includes <mpi.h>: only the .cpp files of this folder include this header.
#pragma once

// The C API only: Open MPI's deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <thread>

#include "transport/mpi/mpi_engine.h"

namespace xsilo::mpi {

using Clock = std::chrono::steady_clock;

constexpr int kTagEnvelope = 1;
constexpr int kTagData = 2;
constexpr uint32_t kEnvelopeMagic = 0x49504d58;  // "XMPI" little-endian
constexpr uint8_t kKindMessage = 1;
constexpr uint8_t kKindFin = 2;
// Receives of one message kept in flight at once.
constexpr size_t kMaxReceivesInFlight = 1024;
// Longest sleep between tests while requests are in flight, microseconds.
constexpr int64_t kBusyPollMaxUs = 100;
// How long process exit waits for closed links to drain before finalizing.
constexpr auto kExitLinger = std::chrono::seconds(30);

struct EnvelopeFixed {
  uint32_t magic;
  uint8_t kind;
  uint8_t reserved[3];
  uint64_t chunk_bytes;
  uint64_t inline_len;
  uint64_t segment_count;
};
static_assert(sizeof(EnvelopeFixed) == 32);

std::string MpiError(int code, const std::string& what);
void LogProblem(const std::string& text);
// A fin: the last envelope a closing link sends each peer.
Buffer FinEnvelope();

// ---------------------------------------------------------------------------
// Engine-side state of a link.

struct PendingSend {
  std::vector<MPI_Request> requests;
  std::vector<Buffer> keep;  // the bytes MPI reads until every request completes
  SendCallback done;         // empty once fired
};

struct Chunk {
  uint8_t* ptr;
  int len;
};

// The message being received from one source.
struct Incoming {
  std::vector<uint8_t> envelope;
  MPI_Request envelope_request = MPI_REQUEST_NULL;
  bool have_envelope = false;
  bool discard = false;  // drain into `target` and drop
  Buffer target;         // the frame, or a scratch chunk when discarding
  // The data receives, generated one chunk at a time from the segment
  // sizes (never planned up front: a size claim must not cost memory).
  std::vector<uint64_t> segments;
  uint64_t chunk_bytes = 0;
  size_t segment = 0;         // the segment the next chunk is in
  uint64_t segment_off = 0;   // the next chunk's offset in it
  uint64_t frame_offset = 0;  // where that segment starts in the frame
  size_t max_in_flight = kMaxReceivesInFlight;
  std::vector<MPI_Request> in_flight;

  bool more_chunks() {
    while (segment < segments.size() && segment_off >= segments[segment]) {
      frame_offset += segments[segment++];
      segment_off = 0;
    }
    return segment < segments.size();
  }
  // The next data receive; call only when more_chunks().
  Chunk NextChunk() {
    const uint64_t len = std::min(chunk_bytes, segments[segment] - segment_off);
    uint8_t* ptr =
        discard ? target.mutable_data() : target.mutable_data() + frame_offset + segment_off;
    segment_off += len;
    return {ptr, static_cast<int>(len)};
  }
};

struct MatchedEnvelope {
  MPI_Message message;
  int count;
};

struct LinkState {
  enum class Phase { kOpening, kOpen, kFailed };
  Phase phase = Phase::kOpening;
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request open_request = MPI_REQUEST_NULL;
  bool closing = false;
  bool fins_sent = false;
  std::vector<char> fin_from;
  int fins = 0;
  std::list<PendingSend> sends;
  std::vector<std::deque<MatchedEnvelope>> matched;  // per source
  std::vector<std::unique_ptr<Incoming>> active;     // per source
  size_t matched_total = 0;
  size_t active_total = 0;
  // Open handshake, read by the opening thread under Link's mutex.
};

// Lets Open wait for the engine to complete MPI_Comm_idup.
struct OpenWaiter {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  void Set(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      status = std::move(s);
    }
    cv.notify_all();
  }
};

struct Engine::Impl {
  std::thread thread;
  std::atomic<std::thread::id> thread_id;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> commands;
  bool shutdown = false;
  bool exited = false;

  // Engine thread only.
  std::vector<std::shared_ptr<Link>> links;
  std::map<Link*, std::shared_ptr<OpenWaiter>> open_waiters;
  std::vector<std::pair<SendCallback, Status>> completions;

  bool Post(std::function<void()> command) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (exited) return false;
      commands.push_back(std::move(command));
    }
    cv.notify_one();
    return true;
  }

  void Complete(SendCallback& done, Status s) {
    if (done) completions.emplace_back(std::move(done), std::move(s));
    done = nullptr;
  }

  void FireCompletions() {
    while (!completions.empty()) {
      std::vector<std::pair<SendCallback, Status>> batch;
      batch.swap(completions);
      for (auto& [done, status] : batch) done(status);
    }
  }

  void Run(std::promise<Status>* init, int32_t* rank, int32_t* size);
  void OpenLink(const std::shared_ptr<Link>& link, const std::shared_ptr<OpenWaiter>& waiter);
  void SendNow(Link& link, const std::vector<int32_t>& peers, Outgoing out, SendCallback done);
  void CloseLink(Link& link);
  void SendFins(Link& link);
  bool Progress(Link& link, bool* active);
  bool ProgressSends(LinkState& s);
  bool ProbeEnvelopes(Link& link);
  bool ProgressReceives(Link& link);
  bool StartEnvelope(Link& link, int source, Incoming& in);
  bool ProgressData(Link& link, int source, Incoming& in, bool* finished);
  bool Drained(const LinkState& s, int32_t world) const;
  void Reap();
  int64_t PollMaxUs() const;
};

}  // namespace xsilo::mpi
