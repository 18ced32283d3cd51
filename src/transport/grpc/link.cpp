#include "transport/grpc/link.h"

#include <algorithm>

namespace xsilo::grpclink {

namespace {

Ack OutcomeAck(uint64_t id, const Status& s) {
  Ack a;
  a.set_message_id(id);
  a.set_code(static_cast<int32_t>(s.code()));
  if (!s.ok()) a.set_error(s.message());
  return a;
}

Status AckStatus(const Ack& a) {
  if (a.code() == 0) return Status::OK();
  int32_t code = a.code();
  if (code < 0 || code > static_cast<int32_t>(StatusCode::kInternal))
    code = static_cast<int32_t>(StatusCode::kInternal);
  return Status(static_cast<StatusCode>(code), "peer: " + a.error());
}

}  // namespace

PeerLink::PeerLink(LinkConfig config)
    : config_(std::move(config)), reassembler_(config_.limits, 1, config_.pool) {}

void PeerLink::Fire(Failures& failures) {
  for (auto& [cb, s] : failures) {
    if (cb) cb(s);
  }
  failures.clear();
}

PrefixLast::PrefixLast(std::shared_ptr<const EncodedFrame> f)
    : frame(std::move(f)),
      hasher(FramePayload(*frame)),
      claimed(new std::atomic<bool>[hasher.blocks()]),
      left(hasher.blocks()) {
  for (uint64_t i = 0; i < hasher.blocks(); ++i) claimed[i].store(false);
  ready = done.get_future().share();
}

void PrefixLast::HashFor(uint64_t from, uint64_t length) {
  const uint64_t block = hasher.block_bytes(), end = from + length;
  const uint64_t first = from / block;
  const uint64_t last = end >= hasher.size() ? hasher.blocks() : end / block;
  uint64_t mine = 0;
  for (uint64_t i = first; i < last; ++i) {
    if (claimed[i].exchange(true, std::memory_order_relaxed)) continue;
    hasher.Hash(i);
    ++mine;
  }
  // acq_rel: the writer that hashes the last block sees every other sum.
  if (mine > 0 && left.fetch_sub(mine, std::memory_order_acq_rel) == mine) {
    SetFramePayloadChecksum(*frame, hasher.Digest());
    done.set_value();
  }
}

OutFrame EncodeForLink(const Message& message, uint64_t prefix_last_bytes) {
  if (message.payload_bytes() < prefix_last_bytes) {
    return {std::make_shared<const EncodedFrame>(EncodeMessage(message)), nullptr};
  }
  auto frame = std::make_shared<const EncodedFrame>(EncodeMessage(message, /*checksum=*/false));
  auto prefix_last = std::make_shared<PrefixLast>(frame);
  return {std::move(frame), std::move(prefix_last)};
}

void PeerLink::Enqueue(OutFrame frame, SendCallback done, int stripe) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) {
      auto o = std::make_shared<Outgoing>();
      if (frame.prefix_last) o->head = frame.frame->payload_offset;
      o->frame = std::move(frame.frame);
      o->prefix_last = std::move(frame.prefix_last);
      o->done = std::move(done);
      o->stripe = std::max(stripe, 0);
      o->queued = Clock::now();
      queue_.push_back(std::move(o));
      cv_.notify_all();
      return;
    }
  }
  done(Cancelled("transport stopped"));
}

void PeerLink::ExpireQueued(Clock::duration max_wait) {
  Failures failures;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_ && attached_ == stream_count_) return;
    const auto now = Clock::now();
    while (!queue_.empty() && now - queue_.front()->queued > max_wait) {
      failures.emplace_back(std::move(queue_.front()->done),
                            Unavailable("peer " + std::to_string(config_.peer) +
                                        " not connected within the connect timeout"));
      queue_.pop_front();
    }
  }
  Fire(failures);
}

Status PeerLink::Attach(uint64_t session, int stream_count, StreamSlot* slot) {
  Failures failures;
  Status result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Cancelled("transport stopped");
    if (draining_ && session != session_) return Cancelled("transport stopping");
    if (stream_count < 1 || slot->index < 0 || slot->index >= stream_count)
      return InvalidArgument("stream " + std::to_string(slot->index) + " of " +
                             std::to_string(stream_count));
    if (session != session_) {
      if (!broken_)
        BreakLocked(Unavailable("peer reconnected; message lost with the old connection"),
                    &failures);
      session_ = session;
      broken_ = false;
      stream_count_ = stream_count;
      attached_ = 0;
      goodbyes_heard_ = 0;
      slots_.assign(static_cast<size_t>(stream_count), nullptr);
      reassembler_ = Reassembler(config_.limits, stream_count, config_.pool);
      in_flight_ = 0;
      next_id_ = 1;
      owed_credit_ = 0;
      undelivered_ = 0;
      control_.clear();
    }
    if (broken_) {
      result = Unavailable("session already ended");
    } else if (stream_count != stream_count_) {
      result = InvalidArgument("stream count " + std::to_string(stream_count) +
                               " differs from the session's " + std::to_string(stream_count_));
    } else if (slots_[static_cast<size_t>(slot->index)] != nullptr) {
      result = AlreadyExists("stream " + std::to_string(slot->index) + " attached twice");
    } else {
      slots_[static_cast<size_t>(slot->index)] = slot;
      slot->session = session;
      slot->dead = false;
      slot->said_goodbye = false;
      slot->heard_goodbye = false;
      ++attached_;
    }
  }
  cv_.notify_all();
  Fire(failures);
  return result;
}

void PeerLink::Detach(StreamSlot* slot) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slot->session == session_ && slot->index < static_cast<int>(slots_.size()) &&
      slots_[static_cast<size_t>(slot->index)] == slot) {
    slots_[static_cast<size_t>(slot->index)] = nullptr;
  }
}

void PeerLink::BreakLocked(const Status& why, Failures* failures) {
  broken_ = true;
  for (StreamSlot* s : slots_) {
    if (s != nullptr && !s->dead) {
      s->dead = true;
      if (s->cancel) s->cancel();
    }
  }
  for (auto& [id, o] : sent_) failures->emplace_back(std::move(o->done), why);
  sent_.clear();
  if (current_) {
    current_.reset();  // it is in sent_ too
  }
  reassembler_.Reset();
  control_.clear();
  in_flight_ = 0;
  owed_credit_ = 0;
  undelivered_ = 0;
}

void PeerLink::Break(uint64_t session, const Status& why) {
  Failures failures;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (session != session_ || broken_) return;
    BreakLocked(why, &failures);
  }
  cv_.notify_all();
  Fire(failures);
}

bool PeerLink::WaitEnded(uint64_t session, Clock::duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return session != session_ || broken_; });
}

bool PeerLink::Up() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !broken_ && attached_ == stream_count_;
}

bool PeerLink::Current(uint64_t session) const {
  std::lock_guard<std::mutex> lock(mu_);
  return session == session_ && !broken_;
}

uint64_t PeerLink::open_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reassembler_.open_bytes();
}

bool PeerLink::CanDispatchLocked(const StreamSlot& slot) const {
  if (broken_ || attached_ != stream_count_) return false;
  const Outgoing* next =
      current_ ? current_.get() : (queue_.empty() ? nullptr : queue_.front().get());
  if (next == nullptr || slot.index >= StreamsForLocked(*next)) return false;
  uint64_t offset = 0, len = 0;
  NextChunkLocked(*next, &offset, &len);
  // At least kStreamWindowBytes per stream of the session: a striped send
  // to a long link needs its bandwidth-delay product in flight (ca-hk Big
  // over 40 streams: 2.95 s with 32 MiB, 1.47 s with 128 MiB).
  const uint64_t window =
      std::max(config_.window_bytes, static_cast<uint64_t>(stream_count_) * kStreamWindowBytes);
  return in_flight_ == 0 || in_flight_ + len <= window;
}

int PeerLink::StreamsForLocked(const Outgoing& m) const {
  return m.stripe > 0 ? std::min(m.stripe, stream_count_) : stream_count_;
}

// Every stream's chunk is chunk_bytes, however many streams a message is
// striped over. A stream carries about one chunk per round trip (a gRPC
// Write completes only once the peer's flow-control window took it), so
// dividing chunk_bytes by N, as this once did to keep per-peer buffering
// flat in N, left a striped send no faster than one stream on a long link:
// 16 streams of 64 KiB moved Big to ca-hk at 8 MB/s (docs/auto.md). The
// sender copies nothing (chunks are slices of the message's Buffers); the
// receiver holds up to a chunk per stream in gRPC's buffers.
uint64_t PeerLink::StripeChunkLocked(const Outgoing&) const { return config_.chunk_bytes; }

void PeerLink::NextChunkLocked(const Outgoing& m, uint64_t* offset, uint64_t* length) const {
  const uint64_t size = m.frame->bytes.size, chunk = StripeChunkLocked(m);
  if (m.head == 0) {
    *offset = m.dispatched;
    *length = std::min(chunk, size - m.dispatched);
  } else if (m.dispatched < size - m.head) {
    *offset = m.head + m.dispatched;
    *length = std::min(chunk, size - *offset);
  } else {
    *offset = 0;
    *length = m.head;
  }
}

void PeerLink::WriterLoop(StreamSlot* slot) {
  Frame control_frame;
  for (;;) {
    std::shared_ptr<Outgoing> msg;
    uint64_t offset = 0, len = 0;
    std::shared_ptr<PrefixLast> prefix_last;  // set: hash, or wait, before the write
    {
      std::unique_lock<std::mutex> lock(mu_);
      // After the Goodbye nothing more is written on this stream.
      cv_.wait(lock, [&] {
        return slot->dead ||
               (goodbye_ ? !slot->said_goodbye : !control_.empty() || CanDispatchLocked(*slot));
      });
      if (slot->dead) return;
      ++writing_;
      if (goodbye_) {
        slot->said_goodbye = true;
        control_frame.mutable_goodbye();
      } else if (!control_.empty()) {
        *control_frame.mutable_ack() = std::move(control_.front());
        control_.pop_front();
      } else {
        if (!current_) {
          current_ = std::move(queue_.front());
          queue_.pop_front();
          current_->id = next_id_++;
          sent_[current_->id] = current_;
        }
        msg = current_;
        NextChunkLocked(*msg, &offset, &len);
        prefix_last = msg->prefix_last;
        msg->dispatched += len;
        if (msg->dispatched == msg->frame->bytes.size) current_.reset();
        in_flight_ += len;
      }
    }
    bool ok;
    if (msg) {
      ChunkOut chunk{msg->id, offset, len, msg->frame, msg->head};
      msg.reset();
      // Prefix last: a payload chunk hashes its blocks first; the prefix,
      // dispatched after every payload chunk, waits for the last of them
      // (another stream's writer may still be hashing one).
      if (prefix_last && offset == 0) {
        prefix_last->ready.wait();
      } else if (prefix_last) {
        prefix_last->HashFor(offset - chunk.payload_offset, len);
      }
      ok = slot->write_chunk(chunk);
    } else {
      ok = slot->write(control_frame);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --writing_;
    }
    cv_.notify_all();
    if (!ok) {
      Break(slot->session, Unavailable("connection to peer " + std::to_string(config_.peer) +
                                       " lost before delivery was confirmed"));
      return;
    }
  }
}

bool PeerLink::OnChunk(StreamSlot* slot, const ChunkIn& c) {
  std::vector<Reassembled> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot->dead || slot->session != session_ || slot->heard_goodbye) return false;
    uint64_t size = 0;
    for (const auto& piece : c.pieces) size += piece.size();
    if (draining_) {
      RefuseWhileDrainingLocked(c.message_id, size);
      cv_.notify_all();
      return true;
    }
    Status s = reassembler_.OnChunk(slot->index, c.message_id, c.offset, c.total, c.payload_offset,
                                    c.pieces, &ready);
    owed_credit_ += size;
    if (!s.ok()) control_.push_back(OutcomeAck(c.message_id, s));
    for (auto& r : ready) {
      ++undelivered_;
      config_.sink(Arrival{this, session_, std::move(r)});
    }
    const uint64_t threshold = std::max<uint64_t>(config_.window_bytes / 4, 1);
    if (undelivered_ == 0 && owed_credit_ >= threshold) {
      Ack a;
      a.set_credit(owed_credit_);
      owed_credit_ = 0;
      control_.push_back(std::move(a));
    }
  }
  cv_.notify_all();
  return true;
}

bool PeerLink::OnFrame(StreamSlot* slot, const Frame& frame) {
  if (frame.has_chunk()) {
    const Chunk& c = frame.chunk();
    ChunkIn chunk{c.message_id(), c.offset(), c.total(), c.payload_offset(), {}};
    chunk.pieces.emplace_back(reinterpret_cast<const uint8_t*>(c.data().data()), c.data().size());
    return OnChunk(slot, chunk);
  }
  if (frame.has_ack()) {
    const Ack& a = frame.ack();
    SendCallback done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (slot->dead || slot->session != session_ || slot->heard_goodbye) return false;
      in_flight_ -= std::min(in_flight_, a.credit());
      if (a.message_id() != 0) {
        auto it = sent_.find(a.message_id());
        if (it != sent_.end()) {
          done = std::move(it->second->done);
          if (current_ == it->second) current_.reset();  // refused mid-message
          sent_.erase(it);
        }
      }
    }
    cv_.notify_all();
    if (done) done(AckStatus(a));
    return true;
  }
  if (frame.has_goodbye()) {
    // Every stream is ordered and the peer wrote its Goodbye on each one
    // after all the outcomes it owed us: once the last one is in, nothing
    // more will come, and what the peer has not acked it did not deliver.
    Failures failures;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (slot->dead || slot->session != session_ || slot->heard_goodbye) return false;
      slot->heard_goodbye = true;
      if (++goodbyes_heard_ < stream_count_) return true;
      BreakLocked(
          Unavailable("peer " + std::to_string(config_.peer) + " stopped; message not delivered"),
          &failures);
    }
    cv_.notify_all();
    Fire(failures);
    return true;
  }
  return false;  // Hello / HelloAck after the handshake, or an empty frame
}

// While draining, a chunk is not assembled: its message is refused once
// (the sender's callback fires with Cancelled, "not delivered") and its
// bytes are credited back so the sender's other messages are not held up
// by flow control on their way to the same refusal.
void PeerLink::RefuseWhileDrainingLocked(uint64_t message_id, uint64_t bytes) {
  owed_credit_ += bytes;
  if (goodbye_) return;  // nothing more is written; our Goodbye says it all
  Ack a;
  if (message_id != last_refused_) {
    last_refused_ = message_id;
    a = OutcomeAck(message_id, Cancelled("receiver stopped; message not delivered"));
  } else if (owed_credit_ < std::max<uint64_t>(config_.window_bytes / 4, 1)) {
    return;
  }
  a.set_credit(owed_credit_);
  owed_credit_ = 0;
  control_.push_back(std::move(a));
}

bool PeerLink::DrainedLocked() const {
  return attached_ == stream_count_ && queue_.empty() && !current_ && sent_.empty() &&
         undelivered_ == 0 && control_.empty() && writing_ == 0;
}

void PeerLink::BeginDrain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

bool PeerLink::Drain(Clock::time_point deadline) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    draining_ = true;
    if (closed_ || broken_) return false;
    const uint64_t session = session_;
    cv_.wait_until(lock, deadline,
                   [&] { return broken_ || session_ != session || DrainedLocked(); });
    if (broken_ || session_ != session || !DrainedLocked()) return false;
    goodbye_ = true;
  }
  cv_.notify_all();
  return true;
}

bool PeerLink::WaitBroken(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return broken_ || closed_; });
}

void PeerLink::OnDelivered(uint64_t session, uint64_t message_id, const Status& outcome) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (session != session_ || broken_) return;
    if (undelivered_ > 0) --undelivered_;
    if (goodbye_) return;
    Ack a = OutcomeAck(message_id, outcome);
    if (undelivered_ == 0) {
      a.set_credit(owed_credit_);
      owed_credit_ = 0;
    }
    control_.push_back(std::move(a));
  }
  cv_.notify_all();
}

void PeerLink::Close(const Status& why) {
  Failures failures;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    // A message with chunks out may or may not have arrived; say which kind
    // of failure this is.
    const Status unconfirmed(why.code(), why.message() + " before peer " +
                                             std::to_string(config_.peer) + " confirmed delivery");
    if (!broken_) BreakLocked(unconfirmed, &failures);
    for (auto& o : queue_) failures.emplace_back(std::move(o->done), why);
    queue_.clear();
    for (auto& [id, o] : sent_) failures.emplace_back(std::move(o->done), unconfirmed);
    sent_.clear();
    current_.reset();
    for (StreamSlot* s : slots_) {
      if (s != nullptr && !s->dead) {
        s->dead = true;
        if (s->cancel) s->cancel();
      }
    }
  }
  cv_.notify_all();
  Fire(failures);
}

}  // namespace xsilo::grpclink
