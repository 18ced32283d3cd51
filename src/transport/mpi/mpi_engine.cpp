#include "transport/mpi/mpi_engine.h"

#include <fcntl.h>

// The C API only: Open MPI's deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <list>
#include <map>
#include <thread>

namespace xsilo::mpi {

namespace {

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

std::string MpiError(int code, const std::string& what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return what + ": " + (len > 0 ? std::string(text, len) : "MPI error " + std::to_string(code));
}

void LogProblem(const std::string& text) { std::fprintf(stderr, "xsilo mpi: %s\n", text.c_str()); }

Buffer FinEnvelope() {
  Buffer b = std::move(Buffer::AllocateZeroed(sizeof(EnvelopeFixed))).value();
  EnvelopeFixed f{};
  f.magic = kEnvelopeMagic;
  f.kind = kKindFin;
  std::memcpy(b.mutable_data(), &f, sizeof f);
  return b;
}

}  // namespace

Result<Buffer> BuildMessageEnvelope(const std::vector<Buffer>& segments, uint64_t chunk_bytes,
                                    uint64_t inline_len,
                                    const std::function<void(uint8_t*)>& write_inline) {
  const uint64_t size = sizeof(EnvelopeFixed) + 8 * segments.size() + inline_len;
  if (size > static_cast<uint64_t>(INT_MAX)) {
    return InvalidArgument("message envelope of " + std::to_string(size) +
                           " bytes exceeds an MPI count (too many tensors or too large a header)");
  }
  XSILO_ASSIGN_OR_RETURN(Buffer b, Buffer::Allocate(size));
  EnvelopeFixed f{};
  f.magic = kEnvelopeMagic;
  f.kind = kKindMessage;
  f.chunk_bytes = chunk_bytes;
  f.inline_len = inline_len;
  f.segment_count = segments.size();
  uint8_t* d = b.mutable_data();
  std::memcpy(d, &f, sizeof f);
  d += sizeof f;
  for (const Buffer& s : segments) {
    uint64_t n = s.size();
    std::memcpy(d, &n, 8);
    d += 8;
  }
  if (inline_len > 0) write_inline(d);
  return b;
}

// ---------------------------------------------------------------------------
// Engine-side state of a link.

namespace {

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

}  // namespace

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

Link::Link(LinkConfig config) : config_(std::move(config)) {}
Link::~Link() = default;

Result<Received> Link::NextReceived() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return closed_ || !ready_.empty(); });
  if (closed_) return Cancelled("transport stopped");
  Received r = std::move(ready_.front());
  ready_.pop_front();
  return r;
}

void Link::PushReceived(Received r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    ready_.push_back(std::move(r));
  }
  cv_.notify_one();
}

size_t Link::ReadyCount() {
  std::lock_guard<std::mutex> lock(mu_);
  return ready_.size();
}

void Link::CloseReady() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    ready_.clear();
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------------------

namespace {

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

std::atomic<bool> g_initialized{false};

}  // namespace

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

void Engine::Impl::Run(std::promise<Status>* init, int32_t* rank, int32_t* size) {
  thread_id = std::this_thread::get_id();
  prctl(PR_SET_TIMERSLACK, 1000UL);  // 1 us: short sleeps stay short
  int provided = 0;
  int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) {
    init->set_value(Unavailable(MpiError(rc, "MPI_Init_thread")));
    std::lock_guard<std::mutex> lock(mu);
    exited = true;
    return;
  }
  g_initialized = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
  init->set_value(Status::OK());

  int64_t sleep_us = 0;
  int yields = 0;
  bool shutdown_seen = false;
  Clock::time_point linger_deadline;
  for (;;) {
    std::deque<std::function<void()>> batch;
    bool shutting = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      batch.swap(commands);
      shutting = shutdown;
    }
    bool work = !batch.empty();
    for (auto& c : batch) c();
    bool active = false;
    for (auto& l : links) work |= Progress(*l, &active);
    Reap();
    FireCompletions();

    if (shutting) {
      if (!shutdown_seen) {
        shutdown_seen = true;
        linger_deadline = Clock::now() + kExitLinger;
        for (auto& l : links) CloseLink(*l);
        FireCompletions();
      }
      if (links.empty() || Clock::now() > linger_deadline) {
        std::lock_guard<std::mutex> lock(mu);
        if (commands.empty()) {
          exited = true;
          break;
        }
        continue;
      }
    }
    if (work) {
      sleep_us = 0;
      yields = 0;
      continue;
    }
    // Requests in flight need MPI to be called to progress: yield a while,
    // then sleep briefly. Idle, back off up to the links' poll limit.
    if (active && yields < 64) {
      ++yields;
      std::this_thread::yield();
      continue;
    }
    const int64_t cap = active ? kBusyPollMaxUs : PollMaxUs();
    sleep_us = std::min(cap, std::max<int64_t>(sleep_us * 2, active ? 2 : 16));
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::microseconds(sleep_us),
                [&] { return !commands.empty() || shutdown; });
  }
  if (!links.empty()) {
    LogProblem(std::to_string(links.size()) +
               " link(s) still draining at exit (a peer never stopped its transport)");
  }
  MPI_Finalize();
}

int64_t Engine::Impl::PollMaxUs() const {
  int64_t cap = 1000;
  bool any = false;
  for (const auto& l : links) {
    int64_t v = std::max<int64_t>(1, l->config().poll_max_us);
    cap = any ? std::min(cap, v) : v;
    any = true;
  }
  return cap;
}

void Engine::Impl::OpenLink(const std::shared_ptr<Link>& link,
                            const std::shared_ptr<OpenWaiter>& waiter) {
  LinkState& s = *link->state;
  const int32_t world = link->config().world_size;
  s.fin_from.assign(world, 0);
  s.matched.resize(world);
  s.active.resize(world);
  int rc = MPI_Comm_idup(MPI_COMM_WORLD, &s.comm, &s.open_request);
  if (rc != MPI_SUCCESS) {
    s.phase = LinkState::Phase::kFailed;
    waiter->Set(Internal(MpiError(rc, "MPI_Comm_idup")));
    return;
  }
  links.push_back(link);
  open_waiters[link.get()] = waiter;
}

void Engine::Impl::SendFins(Link& link) {
  LinkState& s = *link.state;
  if (s.fins_sent) return;
  s.fins_sent = true;
  PendingSend op;
  Buffer fin = FinEnvelope();
  for (int32_t peer = 0; peer < link.config().world_size; ++peer) {
    if (peer == link.config().rank) continue;
    MPI_Request r;
    int rc = MPI_Isend(fin.data(), static_cast<int>(fin.size()), MPI_BYTE, peer, kTagEnvelope,
                       s.comm, &r);
    if (rc != MPI_SUCCESS) {
      LogProblem(MpiError(rc, "MPI_Isend(fin)"));
      continue;
    }
    op.requests.push_back(r);
  }
  op.keep.push_back(std::move(fin));
  s.sends.push_back(std::move(op));
}

void Engine::Impl::CloseLink(Link& link) {
  LinkState& s = *link.state;
  if (s.closing) return;
  s.closing = true;
  for (auto& op : s.sends) {
    Complete(op.done, Cancelled("transport stopped with the send in flight"));
  }
  link.CloseReady();
  if (s.phase == LinkState::Phase::kOpen) SendFins(link);
}

void Engine::Impl::SendNow(Link& link, const std::vector<int32_t>& peers, Outgoing out,
                           SendCallback done) {
  LinkState& s = *link.state;
  if (s.closing || s.phase != LinkState::Phase::kOpen) {
    Complete(done, Cancelled("transport stopped"));
    return;
  }
  for (int32_t peer : peers) {
    if (s.fin_from[peer]) {
      Complete(done, Unavailable("peer " + std::to_string(peer) + " has stopped its transport"));
      return;
    }
  }
  PendingSend op;
  op.done = std::move(done);
  Status error;
  for (int32_t peer : peers) {
    MPI_Request r;
    int rc = MPI_Isend(out.envelope.data(), static_cast<int>(out.envelope.size()), MPI_BYTE, peer,
                       kTagEnvelope, s.comm, &r);
    if (rc != MPI_SUCCESS) {
      error = Internal(MpiError(rc, "MPI_Isend(envelope)"));
      break;
    }
    op.requests.push_back(r);
    for (const Buffer& seg : out.segments) {
      for (uint64_t off = 0; off < seg.size() && error.ok(); off += out.chunk_bytes) {
        const int len = static_cast<int>(std::min(out.chunk_bytes, seg.size() - off));
        rc = MPI_Isend(seg.data() + off, len, MPI_BYTE, peer, kTagData, s.comm, &r);
        if (rc != MPI_SUCCESS) {
          error = Internal(MpiError(rc, "MPI_Isend(data)"));
          break;
        }
        op.requests.push_back(r);
      }
    }
    if (!error.ok()) break;
  }
  op.keep.push_back(std::move(out.envelope));
  for (auto& seg : out.segments) op.keep.push_back(std::move(seg));
  if (!error.ok()) Complete(op.done, error);
  s.sends.push_back(std::move(op));
}

bool Engine::Impl::Progress(Link& link, bool* active) {
  LinkState& s = *link.state;
  bool work = false;
  if (s.phase == LinkState::Phase::kOpening) {
    *active = true;
    int flag = 0;
    int rc = MPI_Test(&s.open_request, &flag, MPI_STATUS_IGNORE);
    Status result;
    if (rc != MPI_SUCCESS) {
      s.phase = LinkState::Phase::kFailed;
      result = Internal(MpiError(rc, "MPI_Comm_idup"));
    } else if (!flag) {
      return false;
    } else {
      s.phase = LinkState::Phase::kOpen;
      MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN);
      if (s.closing) SendFins(link);
    }
    auto it = open_waiters.find(&link);
    if (it != open_waiters.end()) {
      it->second->Set(result);
      open_waiters.erase(it);
    }
    work = true;
  }
  if (s.phase != LinkState::Phase::kOpen) return work;
  work |= ProgressSends(s);
  work |= ProbeEnvelopes(link);
  work |= ProgressReceives(link);
  if (!s.sends.empty() || s.active_total > 0 || s.matched_total > 0) *active = true;
  return work;
}

bool Engine::Impl::ProgressSends(LinkState& s) {
  bool work = false;
  for (auto it = s.sends.begin(); it != s.sends.end();) {
    int flag = 0;
    int rc = MPI_Testall(static_cast<int>(it->requests.size()), it->requests.data(), &flag,
                         MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      Complete(it->done, Internal(MpiError(rc, "send failed")));
      for (auto& r : it->requests) {
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      }
      // MPI may still read the bytes of freed requests: keep them forever.
      static auto* graveyard = new std::vector<Buffer>();
      for (auto& b : it->keep) graveyard->push_back(std::move(b));
      it = s.sends.erase(it);
      work = true;
      continue;
    }
    if (!flag) {
      ++it;
      continue;
    }
    Complete(it->done, Status::OK());
    it = s.sends.erase(it);
    work = true;
  }
  return work;
}

bool Engine::Impl::ProbeEnvelopes(Link& link) {
  LinkState& s = *link.state;
  bool work = false;
  for (;;) {
    // Backpressure: stop matching while enough is waiting for delivery.
    if (!s.closing &&
        link.ReadyCount() + s.matched_total + s.active_total >= link.config().ready_capacity) {
      break;
    }
    int flag = 0;
    MPI_Message message;
    MPI_Status status;
    int rc = MPI_Improbe(MPI_ANY_SOURCE, kTagEnvelope, s.comm, &flag, &message, &status);
    if (rc != MPI_SUCCESS) {
      LogProblem(MpiError(rc, "MPI_Improbe"));
      break;
    }
    if (!flag) break;
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    s.matched[status.MPI_SOURCE].push_back({message, count});
    ++s.matched_total;
    work = true;
  }
  return work;
}

bool Engine::Impl::ProgressReceives(Link& link) {
  LinkState& s = *link.state;
  bool work = false;
  for (int source = 0; source < link.config().world_size; ++source) {
    auto& in = s.active[source];
    for (;;) {
      if (!in) {
        auto& queue = s.matched[source];
        if (queue.empty()) break;
        MatchedEnvelope m = queue.front();
        queue.pop_front();
        --s.matched_total;
        in = std::make_unique<Incoming>();
        ++s.active_total;
        in->envelope.resize(static_cast<size_t>(std::max(m.count, 0)));
        int rc =
            MPI_Imrecv(in->envelope.data(), m.count, MPI_BYTE, &m.message, &in->envelope_request);
        if (rc != MPI_SUCCESS) LogProblem(MpiError(rc, "MPI_Imrecv(envelope)"));
        work = true;
      }
      if (!in->have_envelope) {
        int flag = 0;
        int rc = MPI_Test(&in->envelope_request, &flag, MPI_STATUS_IGNORE);
        if (rc == MPI_SUCCESS && !flag) break;
        work = true;
        in->have_envelope = true;
        if (rc != MPI_SUCCESS) {
          LogProblem(MpiError(rc, "envelope receive from rank " + std::to_string(source)));
          in.reset();
          --s.active_total;
          continue;
        }
        if (!StartEnvelope(link, source, *in)) {
          in.reset();
          --s.active_total;
          continue;
        }
      }
      bool finished = false;
      work |= ProgressData(link, source, *in, &finished);
      if (!finished) break;
      if (!in->discard && !s.closing) link.PushReceived({source, std::move(in->target)});
      in.reset();
      --s.active_total;
      work = true;
    }
  }
  return work;
}

// Parses the envelope and plans the data receives. False when the message
// has no data to receive (a fin, or a malformed envelope).
bool Engine::Impl::StartEnvelope(Link& link, int source, Incoming& in) {
  LinkState& s = *link.state;
  const std::string from = " from rank " + std::to_string(source);
  EnvelopeFixed f{};
  if (in.envelope.size() < sizeof f) {
    LogProblem("short envelope" + from);
    return false;
  }
  std::memcpy(&f, in.envelope.data(), sizeof f);
  if (f.magic != kEnvelopeMagic) {
    LogProblem("envelope with a bad magic" + from);
    return false;
  }
  if (f.kind == kKindFin) {
    if (!s.fin_from[source]) {
      s.fin_from[source] = 1;
      ++s.fins;
    }
    return false;
  }
  const uint64_t size = in.envelope.size();
  if (f.kind != kKindMessage || f.chunk_bytes == 0 || f.chunk_bytes > kMaxChunkBytes ||
      f.segment_count > (size - sizeof f) / 8 ||
      sizeof f + 8 * f.segment_count + f.inline_len != size) {
    LogProblem("malformed envelope" + from + "; the stream from it is now unusable");
    return false;
  }
  std::vector<uint64_t> sizes(f.segment_count);
  if (!sizes.empty()) std::memcpy(sizes.data(), in.envelope.data() + sizeof f, 8 * sizes.size());
  const uint8_t* inline_bytes = in.envelope.data() + sizeof f + 8 * sizes.size();
  uint64_t total = f.inline_len;
  uint64_t largest = 0;
  bool overflow = false;
  for (uint64_t n : sizes) {
    if (total + n < total) overflow = true;
    total += n;
    largest = std::max(largest, n);
  }
  in.discard = s.closing;
  if (!in.discard && (overflow || total - f.inline_len > link.config().max_data_bytes)) {
    LogProblem("dropping a " + std::to_string(total) + "-byte message" + from +
               ": above the receiver's max_message_bytes");
    in.discard = true;
  }
  if (!in.discard) {
    auto frame = Buffer::Allocate(total);
    if (frame.ok()) {
      in.target = std::move(frame).value();
      if (f.inline_len > 0) std::memcpy(in.target.mutable_data(), inline_bytes, f.inline_len);
    } else {
      LogProblem("dropping a " + std::to_string(total) + "-byte message" + from + ": " +
                 frame.status().ToString());
      in.discard = true;
    }
  }
  if (in.discard) {
    // Drain chunk by chunk into one scratch buffer.
    auto scratch = Buffer::Allocate(std::min(largest, f.chunk_bytes));
    if (!scratch.ok()) {
      LogProblem("cannot drain a message" + from + ": " + scratch.status().ToString());
      return false;
    }
    in.target = std::move(scratch).value();
    in.max_in_flight = 1;
  }
  in.segments = std::move(sizes);
  in.chunk_bytes = f.chunk_bytes;
  in.frame_offset = f.inline_len;
  return true;
}

bool Engine::Impl::ProgressData(Link& link, int source, Incoming& in, bool* finished) {
  LinkState& s = *link.state;
  bool work = false;
  if (!in.in_flight.empty()) {
    int flag = 0;
    int rc = MPI_Testall(static_cast<int>(in.in_flight.size()), in.in_flight.data(), &flag,
                         MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      LogProblem(MpiError(rc, "data receive from rank " + std::to_string(source)));
      for (auto& r : in.in_flight) {
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      }
      static auto* graveyard = new std::vector<Buffer>();
      graveyard->push_back(in.target);
      in.in_flight.clear();
      in.segment = in.segments.size();
      in.discard = true;
      *finished = true;
      return true;
    }
    if (!flag) return false;
    in.in_flight.clear();
    work = true;
  }
  while (in.in_flight.size() < in.max_in_flight && in.more_chunks()) {
    const Chunk c = in.NextChunk();
    MPI_Request r;
    int rc = MPI_Irecv(c.ptr, c.len, MPI_BYTE, source, kTagData, s.comm, &r);
    if (rc != MPI_SUCCESS) {
      LogProblem(MpiError(rc, "MPI_Irecv(data)"));
      continue;
    }
    in.in_flight.push_back(r);
    work = true;
  }
  *finished = in.in_flight.empty() && !in.more_chunks();
  return work;
}

bool Engine::Impl::Drained(const LinkState& s, int32_t world) const {
  return s.closing && s.fins_sent && s.fins >= world - 1 && s.sends.empty() &&
         s.active_total == 0 && s.matched_total == 0;
}

void Engine::Impl::Reap() {
  for (auto it = links.begin(); it != links.end();) {
    LinkState& s = *(*it)->state;
    const bool failed = s.phase == LinkState::Phase::kFailed;
    if (!failed &&
        !(s.phase == LinkState::Phase::kOpen && Drained(s, (*it)->config().world_size))) {
      ++it;
      continue;
    }
    if (s.comm != MPI_COMM_NULL) MPI_Comm_free(&s.comm);
    open_waiters.erase(it->get());
    it = links.erase(it);
  }
}

// ---------------------------------------------------------------------------

namespace {

Engine* g_engine = nullptr;
Status g_engine_status;
std::once_flag g_engine_once;

}  // namespace

Result<Engine*> Engine::Get() {
  std::call_once(g_engine_once, [] {
    auto* engine = new Engine();  // lives until exit; the thread finalizes MPI
    engine->impl_ = new Impl();
    auto init = std::make_shared<std::promise<Status>>();
    auto ready = init->get_future();
    Impl* impl = engine->impl_;
    impl->thread = std::thread([impl, init, engine] {
      impl->Run(init.get(), &engine->world_rank_, &engine->world_size_);
    });
    g_engine_status = ready.get();
    if (!g_engine_status.ok()) {
      impl->thread.join();
      return;
    }
    g_engine = engine;
    std::atexit([] {
      Impl* impl = g_engine->impl_;
      {
        std::lock_guard<std::mutex> lock(impl->mu);
        impl->shutdown = true;
      }
      impl->cv.notify_all();
      if (impl->thread.joinable()) impl->thread.join();
    });
  });
  if (!g_engine_status.ok()) return g_engine_status;
  return g_engine;
}

bool Engine::Initialized() { return g_initialized.load(); }

bool Engine::OnEngineThread() const {
  return impl_->thread_id.load() == std::this_thread::get_id();
}

Result<std::shared_ptr<Link>> Engine::Open(LinkConfig config, Duration timeout) {
  auto link = std::make_shared<Link>(std::move(config));
  link->state = std::make_unique<LinkState>();
  auto waiter = std::make_shared<OpenWaiter>();
  Impl* impl = impl_;
  if (!impl->Post([impl, link, waiter] { impl->OpenLink(link, waiter); })) {
    return Unavailable("the MPI engine has shut down (process exiting)");
  }
  std::unique_lock<std::mutex> lock(waiter->mu);
  if (!waiter->cv.wait_for(lock, timeout, [&] { return waiter->done; })) {
    lock.unlock();
    impl->Post([impl, link] { impl->CloseLink(*link); });
    return Unavailable("not every rank opened an MPI transport within " +
                       std::to_string(timeout.count()) +
                       " ms (each rank must Start its transports in the same order)");
  }
  if (!waiter->status.ok()) return waiter->status;
  return link;
}

void Engine::Send(const std::shared_ptr<Link>& link, std::vector<int32_t> peers, Outgoing out,
                  SendCallback done) {
  Impl* impl = impl_;
  auto shared_done = std::make_shared<SendCallback>(std::move(done));
  bool posted = impl->Post(
      [impl, link, peers = std::move(peers), out = std::move(out), shared_done]() mutable {
        impl->SendNow(*link, peers, std::move(out), std::move(*shared_done));
      });
  if (!posted) (*shared_done)(Cancelled("the MPI engine has shut down (process exiting)"));
}

void Engine::Close(const std::shared_ptr<Link>& link) {
  Impl* impl = impl_;
  if (OnEngineThread()) {
    impl->CloseLink(*link);
    impl->FireCompletions();
    return;
  }
  auto done = std::make_shared<std::promise<void>>();
  auto closed = done->get_future();
  if (!impl->Post([impl, link, done] {
        impl->CloseLink(*link);
        impl->FireCompletions();
        done->set_value();
      })) {
    return;
  }
  closed.wait();
}

// ---------------------------------------------------------------------------

namespace {

// Tries MPI_Init in a forked child, so a failing singleton init (which
// aborts the process) cannot take this one down.
Status ProbeSingleton() {
  const std::string why = "not launched by mpirun (OMPI_COMM_WORLD_SIZE unset) and ";
  int fds[2];
  if (pipe(fds) != 0) return Unavailable(why + "cannot probe a singleton MPI_Init (pipe failed)");
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return Unavailable(why + "cannot probe a singleton MPI_Init (fork failed)");
  }
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, 1);
    dup2(fds[1], 2);
    close(fds[0]);
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) _exit(3);
    MPI_Finalize();
    _exit(provided >= MPI_THREAD_FUNNELED ? 0 : 4);
  }
  close(fds[1]);
  std::string err;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  int status = 0;
  bool exited = false;
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {
      char buf[512];
      ssize_t n = read(fds[0], buf, sizeof buf);
      if (n > 0 && err.size() < 4096) err.append(buf, static_cast<size_t>(n));
    }
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    if (Clock::now() > deadline) break;
  }
  close(fds[0]);
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return Unavailable(why + "a singleton MPI_Init did not finish within 20 s");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::OK();
  std::string first_line;
  for (char c : err) {
    if (c == '\n' && !first_line.empty()) break;
    if (c != '\n') first_line += c;
  }
  return Unavailable(why + "a singleton MPI_Init failed" +
                     (first_line.empty() ? "" : " (" + first_line + ")"));
}

}  // namespace

Status MpiViable() {
  if (Engine::Initialized()) return Status::OK();
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr) {
    return Status::OK();
  }
  const char* singleton = std::getenv("XSILO_MPI_SINGLETON");
  if (singleton != nullptr && std::string(singleton) == "0") {
    return Unavailable(
        "not launched by mpirun (OMPI_COMM_WORLD_SIZE unset) and XSILO_MPI_SINGLETON=0 "
        "forbids a singleton MPI_Init");
  }
  static const Status probed = ProbeSingleton();
  return probed;
}

}  // namespace xsilo::mpi
