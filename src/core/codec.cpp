#include "xsilo/core/codec.h"

#include "core/xxh3.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

#include "xsilo/core/base64.h"

namespace xsilo {

namespace {

using nlohmann::json;

constexpr uint64_t kAlign = 64;
// Where the prefix's payload checksum sits (docs/wire-format.md).
constexpr uint64_t kPrefixPayloadChecksumAt = 24;

uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

void PutU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t GetU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// JSON for the safetensors header, padded with spaces so that the data
// region starts at a multiple of 64 from the payload start.
std::string SafetensorsHeaderJson(const TensorMap& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  uint64_t offset = 0;
  for (const auto* entry : PayloadOrder(tensors)) {
    const Tensor& t = entry->second;
    h[entry->first] = {{"dtype", DTypeName(t.dtype)},
                       {"shape", t.shape},
                       {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string s = h.dump();
  s.append(AlignUp(8 + s.size(), kAlign) - 8 - s.size(), ' ');
  return s;
}

json ParamToJson(const ParamValue& v) {
  return std::visit(
      [](const auto& x) -> json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return {{"s", x}};
        } else if constexpr (std::is_same_v<T, int64_t>) {
          return {{"i", x}};
        } else if constexpr (std::is_same_v<T, double>) {
          if (std::isnan(x)) return {{"f", "nan"}};
          if (std::isinf(x)) return {{"f", x > 0 ? "inf" : "-inf"}};
          return {{"f", x}};
        } else {
          return {{"b", Base64Encode(x)}};
        }
      },
      v);
}

Result<ParamValue> ParamFromJson(const std::string& key, const json& j) {
  auto bad = [&] { return Corrupt("message header: parameter '" + key + "' is malformed"); };
  if (!j.is_object() || j.size() != 1) return bad();
  auto first = j.begin();
  const std::string& tag = first.key();
  const json& val = first.value();
  if (tag == "s" && val.is_string()) return ParamValue(val.get<std::string>());
  if (tag == "i" && val.is_number_integer()) return ParamValue(val.get<int64_t>());
  if (tag == "f") {
    if (val.is_number()) return ParamValue(val.get<double>());
    if (val.is_string()) {
      std::string s = val.get<std::string>();
      if (s == "nan") return ParamValue(std::nan(""));
      if (s == "inf") return ParamValue(HUGE_VAL);
      if (s == "-inf") return ParamValue(-HUGE_VAL);
    }
    return bad();
  }
  if (tag == "b" && val.is_string()) {
    auto bytes = Base64Decode(val.get_ref<const std::string&>());
    if (!bytes) return bad();
    return ParamValue(std::move(*bytes));
  }
  return bad();
}

std::string MessageHeaderJson(const Message& m) {
  json params = json::object();
  for (const auto& [k, v] : m.params) params[k] = ParamToJson(v);
  json h = {{"type", m.type},
            {"round", m.round},
            {"sender", m.sender},
            {"receivers", m.receivers},
            {"params", std::move(params)}};
  return h.dump();
}

Status ParseMessageHeader(std::string_view text, Message* m) {
  json h = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) return Corrupt("message header is not a JSON object");
  auto field = [&](const char* name) -> const json* {
    auto it = h.find(name);
    return it == h.end() ? nullptr : &*it;
  };
  const json* type = field("type");
  const json* round = field("round");
  const json* sender = field("sender");
  const json* receivers = field("receivers");
  const json* params = field("params");
  if (!type || !type->is_string()) return Corrupt("message header: 'type' missing or not a string");
  if (!round || !round->is_number_integer()) return Corrupt("message header: 'round' missing");
  if (!sender || !sender->is_number_integer()) return Corrupt("message header: 'sender' missing");
  if (!receivers || !receivers->is_array()) return Corrupt("message header: 'receivers' missing");
  if (!params || !params->is_object()) return Corrupt("message header: 'params' missing");
  m->type = type->get<std::string>();
  m->round = round->get<int64_t>();
  int64_t s = sender->get<int64_t>();
  if (s < INT32_MIN || s > INT32_MAX) return Corrupt("message header: 'sender' out of range");
  m->sender = static_cast<int32_t>(s);
  for (const auto& r : *receivers) {
    if (!r.is_number_integer()) return Corrupt("message header: receiver is not an integer");
    int64_t v = r.get<int64_t>();
    if (v < INT32_MIN || v > INT32_MAX) return Corrupt("message header: receiver out of range");
    m->receivers.push_back(static_cast<int32_t>(v));
  }
  for (const auto& [k, v] : params->items()) {
    XSILO_ASSIGN_OR_RETURN(ParamValue pv, ParamFromJson(k, v));
    m->params.emplace(k, std::move(pv));
  }
  return Status::OK();
}

}  // namespace

void GatherList::Append(Buffer b) {
  if (b.empty()) return;
  size += b.size();
  segments.push_back(std::move(b));
}

Result<Buffer> GatherList::Flatten() const {
  XSILO_ASSIGN_OR_RETURN(Buffer out, Buffer::Allocate(size));
  CopyRange(0, size, out.mutable_data());
  return out;
}

void GatherList::CopyRange(uint64_t offset, uint64_t length, uint8_t* out) const {
  for (const Buffer& seg : segments) {
    if (length == 0) return;
    if (offset >= seg.size()) {
      offset -= seg.size();
      continue;
    }
    uint64_t n = std::min(length, seg.size() - offset);
    std::memcpy(out, seg.data() + offset, n);
    out += n;
    length -= n;
    offset = 0;
  }
}

std::vector<const std::pair<const std::string, Tensor>*> PayloadOrder(const TensorMap& tensors) {
  std::vector<const std::pair<const std::string, Tensor>*> order;
  order.reserve(tensors.size());
  for (const auto& entry : tensors) order.push_back(&entry);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return DTypeSize(a->second.dtype) > DTypeSize(b->second.dtype);
  });
  return order;
}

uint64_t Checksum(std::span<const uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t Checksum(const GatherList& bytes) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const Buffer& seg : bytes.segments) XXH3_64bits_update(state, seg.data(), seg.size());
  uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

struct ChecksumStream::State {
  XXH3_state_t* xxh = XXH3_createState();
  State() { XXH3_64bits_reset(xxh); }
  ~State() { XXH3_freeState(xxh); }
};

ChecksumStream::ChecksumStream() : state_(std::make_unique<State>()) {}
ChecksumStream::~ChecksumStream() = default;
ChecksumStream::ChecksumStream(ChecksumStream&&) noexcept = default;
ChecksumStream& ChecksumStream::operator=(ChecksumStream&&) noexcept = default;
void ChecksumStream::Update(std::span<const uint8_t> bytes) {
  XXH3_64bits_update(state_->xxh, bytes.data(), bytes.size());
}
uint64_t ChecksumStream::Digest() const { return XXH3_64bits_digest(state_->xxh); }

namespace {

// Offset of each segment of `bytes`.
std::vector<uint64_t> SegmentStarts(const GatherList& bytes) {
  std::vector<uint64_t> starts;
  uint64_t at = 0;
  for (const Buffer& seg : bytes.segments) {
    starts.push_back(at);
    at += seg.size();
  }
  return starts;
}

// XXH3-64 of block `i` of `bytes` (`starts` from SegmentStarts).
uint64_t HashBlock(const GatherList& bytes, const std::vector<uint64_t>& starts,
                   uint64_t block_bytes, uint64_t i, XXH3_state_t* state) {
  const uint64_t lo = i * block_bytes, hi = std::min(bytes.size, lo + block_bytes);
  XXH3_64bits_reset(state);
  size_t k =
      static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), lo) - starts.begin() - 1);
  for (uint64_t off = lo; off < hi && k < bytes.segments.size(); ++k) {
    const Buffer& seg = bytes.segments[k];
    const uint64_t end = std::min(hi, starts[k] + seg.size());
    if (end > off) XXH3_64bits_update(state, seg.data() + (off - starts[k]), end - off);
    off = std::max(off, end);
  }
  return XXH3_64bits_digest(state);
}

}  // namespace

PayloadBlockHasher::PayloadBlockHasher(GatherList payload)
    : payload_(std::move(payload)),
      starts_(SegmentStarts(payload_)),
      block_bytes_(BlockBytesFor(payload_.size)),
      sums_((payload_.size + block_bytes_ - 1) / block_bytes_) {}

void PayloadBlockHasher::Hash(uint64_t i) {
  XXH3_state_t* state = XXH3_createState();
  sums_.at(i) = HashBlock(payload_, starts_, block_bytes_, i, state);
  XXH3_freeState(state);
}

uint64_t PayloadBlockHasher::Digest() const { return BlockDigest(sums_); }

std::vector<uint64_t> BlockChecksums(const GatherList& bytes, uint64_t block_bytes, int threads) {
  const uint64_t size = bytes.size;
  if (block_bytes == 0 || size == 0) return {};
  const uint64_t n = (size + block_bytes - 1) / block_bytes;
  std::vector<uint64_t> sums(n);
  const std::vector<uint64_t> starts = SegmentStarts(bytes);
  auto hash_blocks = [&](uint64_t first, uint64_t last) {
    XXH3_state_t* state = XXH3_createState();
    for (uint64_t i = first; i < last; ++i)
      sums[i] = HashBlock(bytes, starts, block_bytes, i, state);
    XXH3_freeState(state);
  };
  // A thread only for at least 8 blocks of work: a smaller payload is
  // hashed before a thread would have started, and every thread that
  // allocates may bind a glibc arena that keeps its pages.
  constexpr uint64_t kMinBlocksPerThread = 8;
  if (threads <= 0)
    threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  const uint64_t workers = std::clamp<uint64_t>(static_cast<uint64_t>(threads), 1,
                                                std::max<uint64_t>(1, n / kMinBlocksPerThread));
  std::vector<std::thread> pool;
  for (uint64_t w = 1; w < workers; ++w) {
    const uint64_t lo = n * w / workers, hi = n * (w + 1) / workers;
    try {
      pool.emplace_back(hash_blocks, lo, hi);
    } catch (const std::system_error&) {
      hash_blocks(lo, n);  // no more threads: the rest on this one
      break;
    }
  }
  hash_blocks(0, n / workers);
  for (auto& t : pool) t.join();
  return sums;
}

std::vector<uint64_t> BlockChecksums(std::span<const uint8_t> bytes, uint64_t block_bytes,
                                     int threads) {
  GatherList one;
  one.segments.push_back(Buffer::Wrap(const_cast<uint8_t*>(bytes.data()), bytes.size(), [] {}));
  one.size = bytes.size();
  return BlockChecksums(one, block_bytes, threads);
}

uint64_t BlockDigest(std::span<const uint64_t> sums) {
  std::vector<uint8_t> le(sums.size() * 8);
  for (size_t i = 0; i < sums.size(); ++i) PutU64(le.data() + 8 * i, sums[i]);
  return XXH3_64bits(le.data(), le.size());
}

uint64_t BlockBytesFor(uint64_t size) {
  uint64_t b = 1ull << 20;
  while (b < (1ull << 40) && (size + b - 1) / b > 1024) b <<= 1;
  return b;
}

uint64_t PayloadChecksum(const GatherList& payload, int threads) {
  return BlockDigest(BlockChecksums(payload, BlockBytesFor(payload.size), threads));
}

uint64_t PayloadChecksum(std::span<const uint8_t> payload, int threads) {
  return BlockDigest(BlockChecksums(payload, BlockBytesFor(payload.size()), threads));
}

struct PayloadChecksumStream::State {
  uint64_t block = 0;
  uint64_t in_block = 0;  // bytes of the current block fed so far
  XXH3_state_t* xxh = XXH3_createState();
  std::vector<uint64_t> sums;
  State() { XXH3_64bits_reset(xxh); }
  ~State() { XXH3_freeState(xxh); }
};

PayloadChecksumStream::PayloadChecksumStream(uint64_t payload_bytes)
    : state_(std::make_unique<State>()) {
  state_->block = BlockBytesFor(payload_bytes);
}
PayloadChecksumStream::~PayloadChecksumStream() = default;
PayloadChecksumStream::PayloadChecksumStream(PayloadChecksumStream&&) noexcept = default;
PayloadChecksumStream& PayloadChecksumStream::operator=(PayloadChecksumStream&&) noexcept = default;

void PayloadChecksumStream::Update(std::span<const uint8_t> bytes) {
  State& st = *state_;
  while (!bytes.empty()) {
    const uint64_t n = std::min<uint64_t>(bytes.size(), st.block - st.in_block);
    XXH3_64bits_update(st.xxh, bytes.data(), n);
    st.in_block += n;
    bytes = bytes.subspan(n);
    if (st.in_block == st.block) {
      st.sums.push_back(XXH3_64bits_digest(st.xxh));
      XXH3_64bits_reset(st.xxh);
      st.in_block = 0;
    }
  }
}

uint64_t PayloadChecksumStream::Digest() const {
  std::vector<uint64_t> sums = state_->sums;
  if (state_->in_block > 0) sums.push_back(XXH3_64bits_digest(state_->xxh));
  return BlockDigest(sums);
}

EncodedPayload EncodeSafetensors(const TensorMap& tensors,
                                 const std::map<std::string, std::string>& metadata,
                                 bool checksum) {
  std::string header = SafetensorsHeaderJson(tensors, metadata);
  Buffer head = std::move(Buffer::Allocate(8 + header.size())).value();
  PutU64(head.mutable_data(), header.size());
  std::memcpy(head.mutable_data() + 8, header.data(), header.size());
  EncodedPayload out;
  out.bytes.Append(std::move(head));
  for (const auto* entry : PayloadOrder(tensors)) out.bytes.Append(entry->second.data);
  if (checksum) out.checksum = Checksum(out.bytes);
  return out;
}

Result<TensorMap> DecodeSafetensors(const Buffer& payload, const DecodeLimits& limits,
                                    std::map<std::string, std::string>* metadata) {
  if (payload.size() < 8) {
    return Corrupt("safetensors payload truncated: " + std::to_string(payload.size()) +
                   " bytes, need at least 8");
  }
  uint64_t n = GetU64(payload.data());
  if (n > limits.max_header_bytes) {
    return Corrupt("safetensors header of " + std::to_string(n) + " bytes exceeds the limit of " +
                   std::to_string(limits.max_header_bytes));
  }
  if (n > payload.size() - 8) {
    return Corrupt("safetensors header length " + std::to_string(n) + " runs past the " +
                   std::to_string(payload.size()) + "-byte payload");
  }
  const char* text = reinterpret_cast<const char*>(payload.data() + 8);
  json h = json::parse(text, text + n, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) return Corrupt("safetensors header is not a JSON object");

  const uint64_t data_start = 8 + n;
  const uint64_t data_len = payload.size() - data_start;
  struct Span {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  TensorMap tensors;
  for (const auto& item : h.items()) {
    const std::string& name = item.key();
    const json& info = item.value();
    if (name == "__metadata__") {
      if (!info.is_object()) return Corrupt("safetensors __metadata__ is not an object");
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string()) return Corrupt("safetensors __metadata__ value is not a string");
        if (metadata) (*metadata)[k] = v.get<std::string>();
      }
      continue;
    }
    if (tensors.size() >= limits.max_tensors) return Corrupt("too many tensors in payload");
    auto bad = [&](const std::string& why) {
      return Corrupt("safetensors tensor '" + name + "': " + why);
    };
    if (!info.is_object()) return bad("entry is not an object");
    auto dt = info.find("dtype");
    auto sh = info.find("shape");
    auto off = info.find("data_offsets");
    if (dt == info.end() || !dt->is_string()) return bad("missing dtype");
    if (sh == info.end() || !sh->is_array()) return bad("missing shape");
    if (off == info.end() || !off->is_array() || off->size() != 2) return bad("bad data_offsets");
    auto dtype = ParseDType(dt->get_ref<const std::string&>());
    if (!dtype.ok()) return bad("unknown dtype '" + dt->get<std::string>() + "'");
    std::vector<int64_t> shape;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) return bad("shape has a negative or non-integer dimension");
      uint64_t v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(INT64_MAX)) return bad("shape dimension too large");
      shape.push_back(static_cast<int64_t>(v));
    }
    if (!(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
      return bad("data_offsets are not unsigned integers");
    }
    uint64_t begin = (*off)[0].get<uint64_t>();
    uint64_t end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_len) {
      return bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                 "] outside the " + std::to_string(data_len) + "-byte data region");
    }
    auto count = ElementCount(shape);
    uint64_t esize = DTypeSize(*dtype);
    if (!count || *count > UINT64_MAX / esize || *count * esize != end - begin) {
      return bad("shape and byte size disagree");
    }
    Buffer view = payload.SliceUnchecked(data_start + begin, end - begin);
    auto [it, inserted] = tensors.emplace(name, Tensor{*dtype, std::move(shape), std::move(view)});
    if (!inserted) return bad("duplicate name");
    spans.push_back({begin, end, &it->first});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (const Span& s : spans) {
    if (s.begin < cursor) return Corrupt("safetensors tensor '" + *s.name + "' overlaps another");
    if (s.begin > cursor)
      return Corrupt("safetensors data region has a hole before '" + *s.name + "'");
    cursor = s.end;
  }
  if (cursor != data_len) {
    return Corrupt("safetensors data region has " + std::to_string(data_len - cursor) +
                   " unindexed trailing bytes");
  }
  return tensors;
}

uint64_t FramePrefix::payload_offset() const {
  return AlignUp(kFramePrefixSize + header_len, kAlign);
}

bool LooksLikeFrame(std::span<const uint8_t> bytes) {
  return bytes.size() >= 4 && GetU32(bytes.data()) == kFrameMagic;
}

Result<FramePrefix> ParseFramePrefix(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  if (bytes.size() < kFramePrefixSize) {
    return Corrupt("frame truncated: " + std::to_string(bytes.size()) + " bytes, prefix needs " +
                   std::to_string(kFramePrefixSize));
  }
  if (!LooksLikeFrame(bytes)) return Corrupt("not an xsilo frame (bad magic)");
  FramePrefix p;
  p.version = GetU16(bytes.data() + 4);
  p.flags = GetU16(bytes.data() + 6);
  p.header_len = GetU64(bytes.data() + 8);
  p.payload_len = GetU64(bytes.data() + 16);
  p.payload_checksum = GetU64(bytes.data() + kPrefixPayloadChecksumAt);
  p.header_checksum = GetU64(bytes.data() + 32);
  if (p.version != kWireVersion) {
    return Corrupt("unsupported wire version " + std::to_string(p.version) + " (this build reads " +
                   std::to_string(kWireVersion) + ")");
  }
  if (p.header_len > limits.max_header_bytes) {
    return Corrupt("message header of " + std::to_string(p.header_len) +
                   " bytes exceeds the limit of " + std::to_string(limits.max_header_bytes));
  }
  if (p.payload_len > limits.max_payload_bytes) {
    return ResourceExhausted("payload of " + std::to_string(p.payload_len) +
                             " bytes exceeds the limit of " +
                             std::to_string(limits.max_payload_bytes));
  }
  return p;
}

EncodedFrame EncodeMessage(const Message& message, bool checksum) {
  std::string header = MessageHeaderJson(message);
  EncodedPayload payload = EncodeSafetensors(message.tensors, {}, /*checksum=*/false);
  if (checksum) payload.checksum = PayloadChecksum(payload.bytes);
  FramePrefix p;
  p.header_len = header.size();
  uint64_t payload_offset = p.payload_offset();

  // Prefix, header, padding and the safetensors header go in one small
  // segment; tensor Buffers follow untouched.
  const Buffer& st_head = payload.bytes.segments.front();
  Buffer head = std::move(Buffer::AllocateZeroed(payload_offset + st_head.size())).value();
  uint8_t* d = head.mutable_data();
  PutU32(d, kFrameMagic);
  PutU16(d + 4, kWireVersion);
  PutU16(d + 6, 0);
  PutU64(d + 8, header.size());
  PutU64(d + 16, payload.bytes.size);
  PutU64(d + kPrefixPayloadChecksumAt, payload.checksum);
  PutU64(d + 32, Checksum({reinterpret_cast<const uint8_t*>(header.data()), header.size()}));
  std::memcpy(d + kFramePrefixSize, header.data(), header.size());
  std::memcpy(d + payload_offset, st_head.data(), st_head.size());

  EncodedFrame frame;
  frame.payload_offset = payload_offset;
  frame.payload_checksum = payload.checksum;
  frame.bytes.Append(std::move(head));
  for (size_t i = 1; i < payload.bytes.segments.size(); ++i) {
    frame.bytes.Append(payload.bytes.segments[i]);
  }
  return frame;
}

GatherList FramePayload(const EncodedFrame& frame) {
  GatherList out;
  uint64_t skip = frame.payload_offset;
  for (const Buffer& seg : frame.bytes.segments) {
    if (skip >= seg.size()) {
      skip -= seg.size();
      continue;
    }
    out.Append(seg.SliceUnchecked(skip, seg.size() - skip));
    skip = 0;
  }
  return out;
}

void SetFramePayloadChecksum(const EncodedFrame& frame, uint64_t sum) {
  // EncodeMessage's first segment holds the whole prefix.
  Buffer head = frame.bytes.segments.front();
  PutU64(head.mutable_data() + kPrefixPayloadChecksumAt, sum);
}

Result<Message> DecodeMessage(const Buffer& frame, const DecodeLimits& limits) {
  XSILO_ASSIGN_OR_RETURN(FramePrefix p, ParseFramePrefix(frame.span(), limits));
  if (p.payload_offset() > frame.size() || p.payload_len != frame.size() - p.payload_offset()) {
    return Corrupt("frame size mismatch: prefix announces " + std::to_string(p.payload_offset()) +
                   " + " + std::to_string(p.payload_len) + " bytes, frame has " +
                   std::to_string(frame.size()));
  }
  std::span<const uint8_t> header(frame.data() + kFramePrefixSize, p.header_len);
  if (Checksum(header) != p.header_checksum) return Corrupt("message header checksum mismatch");
  Buffer payload = frame.SliceUnchecked(p.payload_offset(), p.payload_len);
  if (limits.verify_checksum &&
      (limits.payload_checksum ? *limits.payload_checksum : PayloadChecksum(payload.span())) !=
          p.payload_checksum) {
    return Corrupt("payload checksum mismatch: the message was damaged in transit");
  }
  Message m;
  XSILO_RETURN_IF_ERROR(
      ParseMessageHeader({reinterpret_cast<const char*>(header.data()), header.size()}, &m));
  XSILO_ASSIGN_OR_RETURN(m.tensors, DecodeSafetensors(payload, limits));
  return m;
}

}  // namespace xsilo
