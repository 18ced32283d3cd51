// libFuzzer target: the tensor decoder of xsilo/core/compress.h, on frames
// a peer could send. Two modes, chosen by bit 7 of the first byte:
//
//  - mutate (bit 7 clear): a tensor built from the input is compressed by
//    the recipe the first byte names, then up to seven bytes of its encoded
//    form and one of its table are changed as the input says. Decoding
//    must either refuse (Corrupt, or FailedPrecondition for a delta) or
//    give exactly what decoding the unchanged frame gives; the unchanged
//    frame itself must decode, bit for bit when lossless.
//  - raw (bit 7 set): the input up to its first NUL is the codec table,
//    the rest the bytes of the one encoded tensor "w"; decoding must return
//    a Status (never crash, never allocate past the limit).
//
// Layout of a mutate input: [recipe][mutations][3 bytes per mutation]
// [3 bytes of table mutation when asked][payload]. Bit 6 of the first
// byte and bits 4-5 of the second make the tensor span two chunks; bit 6
// of the second makes a delta a top-k one, bit 7 one on the values' scale.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "xsilo/core/compress.h"

namespace {

using xsilo::Buffer;
using xsilo::DType;
using xsilo::Message;
using xsilo::StatusCode;
using xsilo::Tensor;
using xsilo::TensorMap;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

bool Refusal(StatusCode c) {
  return c == StatusCode::kCorrupt || c == StatusCode::kFailedPrecondition;
}

xsilo::CompressOptions Options() {
  xsilo::CompressOptions o;
  o.threads = 1;
  o.min_tensor_bytes = 0;
  o.int8_block = 64;
  o.chunk_bytes = 64 << 10;
  o.max_decoded_bytes = 1 << 20;
  return o;
}

// A tensor of `dtype` whose bytes are the payload, tiled to `bytes` with a
// drift so that tiles differ.
Tensor FromPayload(DType dtype, const uint8_t* p, size_t n, size_t bytes) {
  const size_t elem = xsilo::DTypeSize(dtype);
  bytes -= bytes % elem;
  std::vector<uint8_t> v(bytes);
  for (size_t at = 0, tile = 0; at < bytes; at += n, ++tile) {
    const size_t len = std::min(n, bytes - at);
    std::memcpy(v.data() + at, p, len);
    v[at] = static_cast<uint8_t>(v[at] + tile);
  }
  return *Tensor::Make(dtype, {static_cast<int64_t>(bytes / elem)},
                       Buffer::CopyFrom(v.data(), v.size()));
}

bool SameBytes(const Message& a, const Message& b) {
  if (a.tensors.size() != b.tensors.size()) return false;
  for (const auto& [name, t] : a.tensors) {
    auto it = b.tensors.find(name);
    if (it == b.tensors.end() || it->second.dtype != t.dtype || it->second.shape != t.shape ||
        it->second.nbytes() != t.nbytes() ||
        std::memcmp(it->second.data.data(), t.data.data(), t.nbytes()) != 0) {
      return false;
    }
  }
  return true;
}

void Raw(const uint8_t* data, size_t size) {
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t table_len = nul ? static_cast<size_t>(nul - data) : size;
  Message m;
  m.params[xsilo::kCodecParam] = std::string(reinterpret_cast<const char*>(data), table_len);
  const size_t rest = nul ? size - table_len - 1 : 0;
  m.tensors["w"] = *Tensor::Make(DType::kU8, {static_cast<int64_t>(rest)},
                                 Buffer::CopyFrom(nul ? nul + 1 : data, rest));
  static const TensorMap reference = [] {
    TensorMap r;
    const uint8_t seed[] = {1, 2, 3, 5, 8, 13, 21, 34};
    r["w"] = FromPayload(DType::kF32, seed, sizeof seed, 4096);
    return r;
  }();
  auto s = xsilo::DecompressMessage(
      &m, [](int64_t key) { return key == 1 ? &reference : nullptr; }, Options());
  Check(s.ok() || Refusal(s.code()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  if (data[0] & 0x80) {
    Raw(data + 1, size - 1);
    return 0;
  }
  if (size < 2) return 0;
  const uint8_t recipe_byte = data[0];
  const size_t mutations = data[1] & 7;
  const bool mutate_table = (data[1] & 8) != 0;
  size_t at = 2;
  const size_t header = at + 3 * mutations + (mutate_table ? 3 : 0);
  if (size < header + 4) return 0;
  const uint8_t* payload = data + header;
  const size_t payload_size = size - header;

  static const DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kI64, DType::kU8};
  xsilo::TensorRecipe recipe;
  recipe.quant = static_cast<xsilo::Quant>(recipe_byte & 3);
  recipe.delta = (recipe_byte & 4) != 0;
  recipe.zstd = (recipe_byte & 8) == 0;
  // Top-k of a delta: its frames decode like any delta's, so they are
  // mutated like them.
  if (recipe.delta && (data[1] & 0x40)) recipe.topk = 0.25;
  // Bit 7: a lossy delta on the values' scale (a no-op for lossless ones).
  recipe.value_scale = recipe.delta && recipe.topk == 0 && (data[1] & 0x80);
  const DType dtype =
      recipe.quant != xsilo::Quant::kNone ? DType::kF32 : kDTypes[(recipe_byte >> 4) & 3];
  // About one run in sixteen spans two chunks (the second a short one):
  // their loops cost most of a run's time under the sanitizers.
  const bool two_chunks = (recipe_byte & 0x40) && (data[1] & 0x30) == 0x30;
  const size_t bytes = two_chunks ? (68 << 10) : payload_size;
  const auto options = Options();

  Message original;
  original.tensors["w"] = FromPayload(dtype, payload, payload_size, bytes);
  if (original.tensors["w"].nbytes() == 0) return 0;
  TensorMap reference;
  reference["w"] =
      FromPayload(dtype, payload + payload_size / 2, payload_size - payload_size / 2, bytes);
  Message encoded = original;
  auto s = xsilo::CompressMessage(&encoded, recipe, options, recipe.delta ? &reference : nullptr,
                                  recipe.delta ? 7 : 0);
  Check(s.ok());
  auto lookup = [&](int64_t key) { return key == 7 ? &reference : nullptr; };

  Message clean = encoded;
  Check(xsilo::DecompressMessage(&clean, lookup, options).ok());
  if (recipe.quant == xsilo::Quant::kNone && recipe.topk == 0) Check(SameBytes(clean, original));

  // A tensor that went as it was (nothing gained, or values no lossy cast
  // takes) has no codec to guard it: the frame's checksum does.
  if ((mutations == 0 && !mutate_table) || !encoded.params.count(xsilo::kCodecParam)) return 0;
  Message bad = encoded;
  auto it = bad.tensors.find("w");
  if (it != bad.tensors.end() && it->second.nbytes() > 0) {
    Buffer copy = Buffer::CopyFrom(it->second.data.data(), it->second.nbytes());
    for (size_t k = 0; k < mutations; ++k, at += 3) {
      const size_t offset = (data[at] | (data[at + 1] << 8)) % copy.size();
      copy.mutable_data()[offset] ^= data[at + 2];
    }
    it->second.data = copy;
  }
  if (mutate_table && bad.params.count(xsilo::kCodecParam)) {
    auto table = bad.GetString(xsilo::kCodecParam);
    const uint8_t* tm = data + 2 + 3 * mutations;
    if (table.ok() && !table->empty()) {
      std::string t = *table;
      t[(tm[0] | (tm[1] << 8)) % t.size()] = static_cast<char>(tm[2]);
      bad.params[xsilo::kCodecParam] = t;
    }
  }
  auto r = xsilo::DecompressMessage(&bad, lookup, options);
  if (r.ok() && !mutate_table) {
    // The chunk checksums cover what the decoder produces.
    Check(SameBytes(bad, clean));
  } else if (r.ok()) {
    // The table is covered by the frame's own checksum, not by the codec:
    // an edit of it (a dtype of the same size, say) may decode, but only
    // to tensors whose bytes match their shape.
    for (const auto& [name, t] : bad.tensors) {
      auto n = xsilo::ElementCount(t.shape);
      Check(n && *n * xsilo::DTypeSize(t.dtype) == t.nbytes());
    }
  } else {
    Check(Refusal(r.code()));
  }
  return 0;
}
