#include "transport/grpc/wire.h"

#include <string>

namespace xsilo::grpclink {

namespace {

// Wire types and the tags of the fields written by hand (link.proto).
constexpr uint32_t kVarint = 0, kLengthDelimited = 2;
constexpr uint32_t kFrameChunkField = 3;
constexpr uint32_t kChunkIdField = 1, kChunkOffsetField = 2, kChunkTotalField = 3,
                   kChunkDataField = 4, kChunkPayloadOffsetField = 5;
constexpr uint8_t Tag(uint32_t field, uint32_t wire_type) {
  return static_cast<uint8_t>(field << 3 | wire_type);
}

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

uint8_t* PutVarint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

// A proto3 scalar at its default is not written, as protobuf does.
size_t VarintFieldSize(uint64_t v) { return v == 0 ? 0 : 1 + VarintSize(v); }
uint8_t* PutVarintField(uint8_t* p, uint32_t field, uint64_t v) {
  if (v == 0) return p;
  *p++ = Tag(field, kVarint);
  return PutVarint(p, v);
}

void ReleaseView(void* view) { delete static_cast<Buffer*>(view); }

// Reads a byte stream spread over slices.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const auto& s : slices_) left_ += s.size();
  }
  uint64_t left() const { return left_; }

  bool Byte(uint8_t* b) {
    if (left_ == 0) return false;
    Settle();
    *b = slices_[index_].begin()[pos_++];
    --left_;
    return true;
  }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // Moves past `n` bytes; with `pieces`, records them there.
  bool Skip(uint64_t n, std::vector<std::span<const uint8_t>>* pieces) {
    if (n > left_) return false;
    left_ -= n;
    while (n > 0) {
      Settle();
      const grpc::Slice& s = slices_[index_];
      const uint64_t take = std::min<uint64_t>(n, s.size() - pos_);
      if (pieces) pieces->emplace_back(s.begin() + pos_, take);
      pos_ += take;
      n -= take;
    }
    return true;
  }

 private:
  // Steps over exhausted (and empty) slices; only called with bytes left.
  void Settle() {
    while (pos_ == slices_[index_].size()) {
      ++index_;
      pos_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t pos_ = 0;
  uint64_t left_ = 0;
};

// The fast path: a Frame holding nothing but a Chunk whose fields are the
// four known ones. False leaves the frame to protobuf.
bool ParseChunkInPlace(const std::vector<grpc::Slice>& slices, ChunkIn* chunk) {
  SliceReader in(slices);
  uint64_t tag = 0, length = 0;
  if (!in.Varint(&tag) || tag != Tag(kFrameChunkField, kLengthDelimited)) return false;
  if (!in.Varint(&length) || length != in.left()) return false;
  *chunk = ChunkIn();
  while (in.left() > 0) {
    if (!in.Varint(&tag)) return false;
    const uint64_t field = tag >> 3;
    const uint64_t wire_type = tag & 7;
    if (wire_type == kVarint && field == kChunkIdField) {
      if (!in.Varint(&chunk->message_id)) return false;
    } else if (wire_type == kVarint && field == kChunkOffsetField) {
      if (!in.Varint(&chunk->offset)) return false;
    } else if (wire_type == kVarint && field == kChunkTotalField) {
      if (!in.Varint(&chunk->total)) return false;
    } else if (wire_type == kVarint && field == kChunkPayloadOffsetField) {
      if (!in.Varint(&chunk->payload_offset)) return false;
    } else if (wire_type == kLengthDelimited && field == kChunkDataField) {
      chunk->pieces.clear();  // a repeated singular field: the last one counts
      if (!in.Varint(&length) || !in.Skip(length, &chunk->pieces)) return false;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

grpc::ByteBuffer ChunkToByteBuffer(const ChunkOut& c) {
  const uint64_t chunk_size = VarintFieldSize(c.message_id) + VarintFieldSize(c.offset) +
                              VarintFieldSize(c.frame->bytes.size) +
                              VarintFieldSize(c.payload_offset) + 1 + VarintSize(c.length) +
                              c.length;
  uint8_t head[80];
  uint8_t* p = head;
  *p++ = Tag(kFrameChunkField, kLengthDelimited);
  p = PutVarint(p, chunk_size);
  p = PutVarintField(p, kChunkIdField, c.message_id);
  p = PutVarintField(p, kChunkOffsetField, c.offset);
  p = PutVarintField(p, kChunkTotalField, c.frame->bytes.size);
  p = PutVarintField(p, kChunkPayloadOffsetField, c.payload_offset);
  *p++ = Tag(kChunkDataField, kLengthDelimited);
  p = PutVarint(p, c.length);

  std::vector<grpc::Slice> slices;
  slices.emplace_back(head, static_cast<size_t>(p - head));
  uint64_t offset = c.offset, length = c.length;
  for (const Buffer& seg : c.frame->bytes.segments) {
    if (length == 0) break;
    if (offset >= seg.size()) {
      offset -= seg.size();
      continue;
    }
    const uint64_t n = std::min(length, seg.size() - offset);
    // Each slice holds a view of its segment until gRPC is done with it.
    auto* view = new Buffer(seg.SliceUnchecked(offset, n));
    slices.emplace_back(view->mutable_data(), static_cast<size_t>(n), &ReleaseView, view);
    length -= n;
    offset = 0;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer FrameToByteBuffer(const Frame& frame) {
  std::string bytes = frame.SerializeAsString();
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

bool ParseIncoming(const grpc::ByteBuffer& bytes, Incoming* out) {
  out->slices.clear();
  if (!bytes.Dump(&out->slices).ok()) return false;
  out->is_chunk = ParseChunkInPlace(out->slices, &out->chunk);
  if (out->is_chunk) return true;
  std::string flat;
  flat.reserve(bytes.Length());
  for (const auto& s : out->slices) flat.append(reinterpret_cast<const char*>(s.begin()), s.size());
  out->slices.clear();
  if (!out->frame.ParseFromString(flat)) return false;
  if (!out->frame.has_chunk()) return true;
  // A chunk protobuf had to parse (unusual field order or unknown fields).
  const Chunk& c = out->frame.chunk();
  out->is_chunk = true;
  out->chunk = ChunkIn{c.message_id(), c.offset(), c.total(), c.payload_offset(), {}};
  out->chunk.pieces.emplace_back(reinterpret_cast<const uint8_t*>(c.data().data()),
                                 c.data().size());
  return true;
}

}  // namespace xsilo::grpclink
