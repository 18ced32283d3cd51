#include "transport/grpc/reassembly.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "xsilo/core/codec.h"
#include "xsilo/core/copy.h"

namespace xsilo::grpclink {

namespace {
std::string Id(uint64_t id) { return "message " + std::to_string(id); }
constexpr size_t kFailedMemory = 256;
}  // namespace

Reassembler::Reassembler(ReassemblyLimits limits, int stream_count,
                         std::shared_ptr<BufferPool> pool)
    : limits_(limits),
      pool_(std::move(pool)),
      stream_last_(static_cast<size_t>(std::max(stream_count, 1)), 0) {}

uint64_t Reassembler::open_bytes() const {
  uint64_t n = 0;
  for (const auto& [id, o] : open_) n += o.total;
  return n;
}

void Reassembler::Reset() {
  open_.clear();
  done_.clear();
  recently_failed_.clear();
  std::fill(stream_last_.begin(), stream_last_.end(), 0);
  next_ = 1;
}

void Reassembler::Fail(uint64_t id, Status why) {
  open_.erase(id);
  recently_failed_.push_back(id);
  if (recently_failed_.size() > kFailedMemory) recently_failed_.pop_front();
  done_[id] = Reassembled{id, Buffer(), std::move(why)};
}

void Reassembler::Release(std::vector<Reassembled>* ready) {
  for (auto it = done_.find(next_); it != done_.end(); it = done_.find(next_)) {
    ready->push_back(std::move(it->second));
    done_.erase(it);
    ++next_;
  }
}

// Each stream carries its chunks in send order and a sender finishes
// dispatching message k before it starts k+1, so once every stream has shown
// an id above k no chunk of k can still come.
void Reassembler::DropMissing() {
  uint64_t floor = *std::min_element(stream_last_.begin(), stream_last_.end());
  for (uint64_t id = next_; id < floor; ++id) {
    if (done_.count(id)) continue;
    auto it = open_.find(id);
    if (it == open_.end()) {
      Fail(id, Corrupt(Id(id) + " never arrived: later messages came on every stream"));
    } else {
      Fail(id, Corrupt("missing chunk: " + Id(id) + " has " + std::to_string(it->second.received) +
                       " of " + std::to_string(it->second.total) +
                       " bytes and every stream has moved on to later messages"));
    }
  }
}

void Reassembler::StartHash(Open& o, uint64_t payload_offset) {
  o.payload_offset = payload_offset;
  o.hashed = payload_offset;
  o.hash.emplace(o.total - payload_offset);
}

void Reassembler::HashTo(Open& o, uint64_t end) {
  if (end > o.hashed) {
    o.hash->Update(std::span<const uint8_t>(o.frame.data() + o.hashed, end - o.hashed));
    o.hashed = end;
  }
}

// Each block that extends the hashed run is hashed as it is copied, from
// gRPC's slice, which the copy just read into cache: no second pass over
// the message. A large frame is copied around the cache (CopyStreaming):
// its buffer is cold, and writing it through the cache read every line of
// it first (265 MB in gRPC's 16-64 KiB slices: 35 ms copy and hash against
// 23 ms on the development VM).
void Reassembler::CopyIn(Open& o, uint64_t offset, ChunkPieces data) {
  constexpr uint64_t kBlock = 256 << 10;
  constexpr uint64_t kStreamingFrameBytes = 8ull << 20;
  const bool streaming = o.total >= kStreamingFrameBytes;
  uint64_t at = offset;
  for (std::span<const uint8_t> piece : data) {
    while (!piece.empty()) {
      const uint64_t n = std::min<uint64_t>(piece.size(), kBlock);
      uint8_t* to = o.frame.mutable_data() + at;
      if (streaming)
        CopyStreaming(to, piece.data(), n);
      else
        std::memcpy(to, piece.data(), n);
      if (o.hash && at <= o.hashed && o.hashed < at + n) {
        o.hash->Update(piece.subspan(o.hashed - at, at + n - o.hashed));
        o.hashed = at + n;
      }
      at += n;
      piece = piece.subspan(n);
    }
  }
  // Before HashTo reads the frame back or another thread takes it.
  if (streaming) FenceStreamingStores();
}

Status Reassembler::TakePrefix(uint64_t id, Open& o, ChunkPieces data) {
  uint8_t head[kFramePrefixSize];
  uint64_t got = 0;
  for (auto piece = data.begin(); got < kFramePrefixSize; ++piece) {
    const uint64_t n = std::min<uint64_t>(piece->size(), kFramePrefixSize - got);
    std::memcpy(head + got, piece->data(), n);
    got += n;
  }
  DecodeLimits dl;
  dl.max_payload_bytes = limits_.max_message_bytes;
  auto p = ParseFramePrefix(head, dl);
  if (!p.ok()) return p.status().WithContext(Id(id));
  if (p->frame_size() != o.total) {
    return Corrupt(Id(id) + ": frame prefix says " + std::to_string(p->frame_size()) +
                   " bytes, chunks announce " + std::to_string(o.total));
  }
  if (o.payload_offset == 0) {
    StartHash(o, p->payload_offset());
  } else if (o.payload_offset != p->payload_offset()) {
    return Corrupt(Id(id) + ": frame prefix puts the payload at " +
                   std::to_string(p->payload_offset()) + ", chunks at " +
                   std::to_string(o.payload_offset));
  }
  o.prefix_checked = true;
  return Status::OK();
}

Status Reassembler::OnChunk(int stream, uint64_t id, uint64_t offset, uint64_t total,
                            uint64_t payload_offset, ChunkPieces data,
                            std::vector<Reassembled>* ready) {
  if (stream < 0 || static_cast<size_t>(stream) >= stream_last_.size()) {
    return InvalidArgument("chunk on unknown stream " + std::to_string(stream));
  }
  if (id == 0) return Corrupt("chunk with message id 0");
  if (id < next_ || done_.count(id)) {
    if (std::find(recently_failed_.begin(), recently_failed_.end(), id) != recently_failed_.end())
      return Status::OK();  // the rest of a message already dropped and reported
    return Corrupt("duplicate chunk: " + Id(id) + " was already complete");
  }
  if (id - next_ >= limits_.id_window) {
    return Corrupt(Id(id) + " is more than " + std::to_string(limits_.id_window) +
                   " ahead of the next expected id " + std::to_string(next_));
  }
  stream_last_[static_cast<size_t>(stream)] =
      std::max(stream_last_[static_cast<size_t>(stream)], id);

  auto it = open_.find(id);
  if (it == open_.end()) {
    if (total > limits_.max_message_bytes) {
      Fail(id, ResourceExhausted(Id(id) + " announces " + std::to_string(total) +
                                 " bytes, above max_message_bytes " +
                                 std::to_string(limits_.max_message_bytes)));
    } else if (total < kFramePrefixSize) {
      Fail(id, Corrupt(Id(id) + " announces " + std::to_string(total) +
                       " bytes, less than a frame prefix"));
    } else if (open_.size() >= limits_.max_open_messages) {
      Fail(id, ResourceExhausted(Id(id) + ": already " + std::to_string(open_.size()) +
                                 " messages in assembly from this peer"));
    } else {
      auto buf = pool_ ? pool_->Allocate(total) : Buffer::Allocate(total);
      if (!buf.ok()) {
        Fail(id, buf.status().WithContext(Id(id)));
      } else {
        Open o;
        o.total = total;
        o.frame = std::move(buf).value();
        it = open_.emplace(id, std::move(o)).first;
      }
    }
  }
  if (it != open_.end()) {
    Open& o = it->second;
    uint64_t len = 0;
    for (const auto& piece : data) len += piece.size();
    if (total != o.total) {
      Fail(id, Corrupt(Id(id) + ": chunk announces total " + std::to_string(total) +
                       ", earlier chunks " + std::to_string(o.total)));
    } else if (offset > o.total || len > o.total - offset) {
      Fail(id, Corrupt(Id(id) + ": chunk [" + std::to_string(offset) + ", +" + std::to_string(len) +
                       ") exceeds the announced total " + std::to_string(o.total)));
    } else if (len == 0) {
      Fail(id, Corrupt(Id(id) + ": empty chunk at offset " + std::to_string(offset)));
    } else {
      // Overlap check against the merged ranges around `offset`.
      const uint64_t end = offset + len;
      auto next = o.ranges.lower_bound(offset);
      bool overlap = next != o.ranges.end() && next->first < end;
      if (!overlap && next != o.ranges.begin()) overlap = std::prev(next)->second > offset;
      if (overlap) {
        Fail(id, Corrupt("duplicate chunk: " + Id(id) + " bytes [" + std::to_string(offset) + ", " +
                         std::to_string(end) + ") arrived twice"));
      } else {
        Status prefix;
        if (payload_offset != 0 && payload_offset != o.payload_offset) {
          if (o.payload_offset != 0) {
            prefix =
                Corrupt(Id(id) + ": chunk puts the payload at " + std::to_string(payload_offset) +
                        ", earlier chunks at " + std::to_string(o.payload_offset));
          } else if (payload_offset < kFramePrefixSize || payload_offset > o.total) {
            prefix =
                Corrupt(Id(id) + ": chunk puts the payload at " + std::to_string(payload_offset) +
                        ", outside its frame of " + std::to_string(o.total) + " bytes");
          } else {
            StartHash(o, payload_offset);
          }
        }
        if (prefix.ok() && offset == 0 && len >= kFramePrefixSize) prefix = TakePrefix(id, o, data);
        if (!prefix.ok()) {
          Fail(id, prefix);
        } else {
          CopyIn(o, offset, data);
          o.received += len;
          // Insert and merge with neighbours.
          uint64_t b = offset, e = end;
          if (next != o.ranges.end() && next->first == e) {
            e = next->second;
            next = o.ranges.erase(next);
          }
          if (next != o.ranges.begin() && std::prev(next)->second == b) {
            std::prev(next)->second = e;
          } else {
            o.ranges.emplace(b, e);
          }
          // Catch up over bytes that arrived ahead of a gap this chunk filled.
          if (o.hash) {
            auto run = o.ranges.upper_bound(o.hashed);
            if (run != o.ranges.begin() && std::prev(run)->second > o.hashed)
              HashTo(o, std::prev(run)->second);
          }
          if (o.received == o.total) {
            BufferPool::Recycle(o.frame);
            // Without a prefix that agreed (one cut short in the first
            // chunk), decoding hashes the payload itself.
            std::optional<uint64_t> sum;
            if (o.prefix_checked && o.hashed == o.total) sum = o.hash->Digest();
            done_[id] = Reassembled{id, std::move(o.frame), Status::OK(), sum};
            open_.erase(it);
          }
        }
      }
    }
  }
  DropMissing();
  Release(ready);
  return Status::OK();
}

}  // namespace xsilo::grpclink
