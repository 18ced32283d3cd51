// Safetensors payloads: the header (JSON, padded so that the data starts
// 64-aligned), encoding as a gather list over the tensors' own Buffers, and
// decoding with limits and every offset checked.
#include "xsilo/core/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/codec_internal.h"
#include "core/json_depth.h"

namespace xsilo {

using namespace codec_detail;

namespace {

using nlohmann::json;

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

}  // namespace

std::vector<const std::pair<const std::string, Tensor>*> PayloadOrder(const TensorMap& tensors) {
  std::vector<const std::pair<const std::string, Tensor>*> order;
  order.reserve(tensors.size());
  for (const auto& entry : tensors) order.push_back(&entry);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return DTypeSize(a->second.dtype) > DTypeSize(b->second.dtype);
  });
  return order;
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
  if (!core_detail::JsonDepthAtMost(std::string_view(text, n))) {
    return Corrupt("safetensors header nests deeper than " +
                   std::to_string(core_detail::kMaxJsonDepth) + " levels");
  }
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

}  // namespace xsilo
