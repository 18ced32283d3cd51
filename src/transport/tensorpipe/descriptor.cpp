#include "transport/tensorpipe/descriptor.h"

#include <cstring>
#include <set>

#include "xsilo/core/codec.h"

namespace xsilo::tplink {

namespace {

constexpr std::string_view kMagic = "XTP1";
// Bounds on what a descriptor may announce, checked before any allocation.
constexpr uint64_t kMaxHeaderFrame = 64ull << 20;
constexpr uint32_t kMaxNameBytes = 1u << 16;
constexpr uint32_t kMaxDims = 64;

template <typename T>
void Put(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetString(uint32_t n, std::string* s) {
    if (in_.size() - pos_ < n) return false;
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace

OutgoingPlan PlanOutgoing(const Message& message, uint64_t piece_bytes, bool checksum) {
  OutgoingPlan plan;
  Message header;
  header.type = message.type;
  header.round = message.round;
  header.sender = message.sender;
  header.receivers = message.receivers;
  header.params = message.params;
  EncodedFrame frame = EncodeMessage(header);
  plan.metadata.reserve(kMagic.size() + frame.bytes.size + 64 * message.tensors.size());
  plan.metadata.append(kMagic);
  for (const Buffer& seg : frame.bytes.segments) plan.metadata.append(seg.view());

  Put<uint32_t>(plan.metadata, static_cast<uint32_t>(message.tensors.size()));
  for (const auto& [name, t] : message.tensors) {
    Put<uint32_t>(plan.metadata, static_cast<uint32_t>(name.size()));
    plan.metadata.append(name);
    Put<uint8_t>(plan.metadata, static_cast<uint8_t>(t.dtype));
    Put<uint32_t>(plan.metadata, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) Put<int64_t>(plan.metadata, d);
    const uint64_t n = t.nbytes();
    Put<uint64_t>(plan.metadata, n);
    Put<uint64_t>(plan.metadata, checksum ? Checksum(t.data.span()) : 0);
    const uint64_t pieces = (n + piece_bytes - 1) / piece_bytes;
    Put<uint32_t>(plan.metadata, static_cast<uint32_t>(pieces));
    for (uint64_t off = 0; off < n; off += piece_bytes) {
      plan.pieces.push_back({t.data.mutable_data() + off, std::min(piece_bytes, n - off)});
    }
  }
  return plan;
}

Result<IncomingPlan> PlanIncoming(std::string_view metadata,
                                  const std::vector<uint64_t>& piece_lengths,
                                  uint64_t max_message_bytes) {
  if (metadata.substr(0, kMagic.size()) != kMagic) {
    return Corrupt("tensorpipe descriptor without the XTP1 magic");
  }
  metadata.remove_prefix(kMagic.size());
  DecodeLimits limits;
  limits.max_header_bytes = kMaxHeaderFrame;
  limits.max_payload_bytes = 1 << 20;  // the header frame carries no tensors
  const auto* bytes = reinterpret_cast<const uint8_t*>(metadata.data());
  XSILO_ASSIGN_OR_RETURN(FramePrefix prefix, ParseFramePrefix({bytes, metadata.size()}, limits));
  if (prefix.frame_size() > metadata.size()) {
    return Corrupt("tensorpipe descriptor: header frame of " + std::to_string(prefix.frame_size()) +
                   " bytes in a descriptor of " + std::to_string(metadata.size()));
  }
  IncomingPlan plan;
  {
    Buffer frame = Buffer::CopyFrom(metadata.data(), prefix.frame_size());
    auto header = DecodeMessage(frame, limits);
    if (!header.ok()) return header.status().WithContext("tensorpipe descriptor header");
    if (!header->tensors.empty()) return Corrupt("tensorpipe descriptor header carries tensors");
    plan.message = std::move(header).value();
  }
  Reader in(metadata.substr(prefix.frame_size()));
  uint32_t count = 0;
  if (!in.Get(&count)) return Corrupt("tensorpipe descriptor: truncated tensor table");
  // Entries are parsed one by one from the metadata, so memory stays bounded
  // by its size; the cap only keeps the error early.
  if (count > (1u << 20)) {
    return Corrupt("tensorpipe descriptor announces " + std::to_string(count) + " tensors");
  }
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes;
    uint64_t checksum;
    uint32_t pieces;
  };
  std::vector<Entry> entries;
  std::set<std::string, std::less<>> names;
  uint64_t total = 0;
  size_t piece_index = 0;
  for (uint32_t i = 0; i < count; ++i) {
    Entry e;
    uint32_t name_len = 0, ndim = 0;
    uint8_t dtype = 0;
    if (!in.Get(&name_len) || name_len > kMaxNameBytes || !in.GetString(name_len, &e.name) ||
        !in.Get(&dtype) || !in.Get(&ndim) || ndim > kMaxDims) {
      return Corrupt("tensorpipe descriptor: malformed tensor entry " + std::to_string(i));
    }
    if (dtype > static_cast<uint8_t>(DType::kBool)) {
      return Corrupt("tensorpipe descriptor: unknown dtype " + std::to_string(dtype));
    }
    e.dtype = static_cast<DType>(dtype);
    e.shape.resize(ndim);
    for (auto& d : e.shape) {
      if (!in.Get(&d)) return Corrupt("tensorpipe descriptor: truncated shape");
    }
    if (!in.Get(&e.nbytes) || !in.Get(&e.checksum) || !in.Get(&e.pieces)) {
      return Corrupt("tensorpipe descriptor: truncated tensor entry " + std::to_string(i));
    }
    auto elements = ElementCount(e.shape);
    if (!elements || *elements > e.nbytes || *elements * DTypeSize(e.dtype) != e.nbytes) {
      return Corrupt("tensorpipe descriptor: tensor '" + e.name + "' shape does not match " +
                     std::to_string(e.nbytes) + " bytes");
    }
    if (!names.insert(e.name).second) {
      return Corrupt("tensorpipe descriptor: duplicate tensor '" + e.name + "'");
    }
    total += e.nbytes;
    if (e.nbytes > max_message_bytes || total > max_message_bytes) {
      return ResourceExhausted("tensorpipe message announces more than max_message_bytes (" +
                               std::to_string(max_message_bytes) + ")");
    }
    uint64_t covered = 0;
    if (e.pieces > piece_lengths.size() - piece_index) {
      return Corrupt("tensorpipe descriptor: tensor '" + e.name + "' has more pieces than sent");
    }
    for (uint32_t p = 0; p < e.pieces; ++p) {
      // Lengths are the peer's word too: a sum that wraps around would put
      // a piece past the end of the tensor's buffer.
      const uint64_t len = piece_lengths[piece_index + p];
      if (len > e.nbytes - covered) {
        return Corrupt("tensorpipe descriptor: pieces of tensor '" + e.name + "' hold more than " +
                       std::to_string(e.nbytes) + " bytes");
      }
      covered += len;
    }
    if (covered != e.nbytes) {
      return Corrupt("tensorpipe descriptor: pieces of tensor '" + e.name + "' hold " +
                     std::to_string(covered) + " bytes, not " + std::to_string(e.nbytes));
    }
    piece_index += e.pieces;
    entries.push_back(std::move(e));
  }
  if (!in.done()) return Corrupt("tensorpipe descriptor: trailing bytes after the tensor table");
  if (piece_index != piece_lengths.size()) {
    return Corrupt("tensorpipe message carries pieces no tensor claims");
  }

  piece_index = 0;
  for (auto& e : entries) {
    Buffer data;
    if (e.nbytes > 0) {
      XSILO_ASSIGN_OR_RETURN(data, Buffer::Allocate(e.nbytes));
    }
    uint64_t off = 0;
    for (uint32_t p = 0; p < e.pieces; ++p) {
      const uint64_t len = piece_lengths[piece_index++];
      plan.pieces.push_back({data.mutable_data() + off, len});
      off += len;
    }
    if (e.checksum != 0) plan.checksums.emplace_back(e.name, e.checksum);
    auto tensor = Tensor::Make(e.dtype, std::move(e.shape), std::move(data));
    if (!tensor.ok()) return tensor.status().WithContext("tensorpipe descriptor");
    plan.message.tensors.emplace(std::move(e.name), std::move(tensor).value());
  }
  return plan;
}

Status VerifyIncoming(const IncomingPlan& plan) {
  for (const auto& [name, expected] : plan.checksums) {
    auto it = plan.message.tensors.find(name);
    if (it == plan.message.tensors.end()) continue;
    if (Checksum(it->second.data.span()) != expected) {
      return Corrupt("tensorpipe: checksum mismatch in tensor '" + name + "'");
    }
  }
  return Status::OK();
}

}  // namespace xsilo::tplink
