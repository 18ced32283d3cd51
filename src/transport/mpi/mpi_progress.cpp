// The engine thread's progress on a link: sends tested, envelopes probed
// and matched, data received chunk by chunk into the frame.
#include <cstring>

#include "transport/mpi/mpi_engine_internal.h"

namespace xsilo::mpi {

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

}  // namespace xsilo::mpi
