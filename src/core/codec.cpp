// Frames (docs/wire-format.md): the prefix, the message header (JSON:
// type, round, sender, receivers, params), the payload after it; and the
// gather list a frame travels as. Safetensors payloads: safetensors.cpp;
// checksums: checksums.cpp.
#include "xsilo/core/codec.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/codec_internal.h"
#include "core/json_depth.h"
#include "xsilo/core/base64.h"

namespace xsilo {

using namespace codec_detail;

namespace {

using nlohmann::json;

// Where the prefix's payload checksum sits (docs/wire-format.md).
constexpr uint64_t kPrefixPayloadChecksumAt = 24;

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
  if (!core_detail::JsonDepthAtMost(text)) {
    return Corrupt("message header nests deeper than " +
                   std::to_string(core_detail::kMaxJsonDepth) + " levels");
  }
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
