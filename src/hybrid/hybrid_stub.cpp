// The hybrid stub format: what a message that went to the store carries
// instead of its tensors (docs/wire-format.md, "Hybrid stubs").
#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <system_error>

#include "hybrid/hybrid_internal.h"

namespace xsilo::hybrid_detail {

namespace {

// kHybridBlocksParam: "<block bytes>:" then 16 hex digits per block.
std::string BlocksParam(uint64_t block_bytes, const std::vector<uint64_t>& sums) {
  std::string out = std::to_string(block_bytes) + ":";
  out.reserve(out.size() + 16 * sums.size());
  char hex[17];
  for (uint64_t v : sums) {
    std::snprintf(hex, sizeof hex, "%016" PRIx64, v);
    out.append(hex, 16);
  }
  return out;
}

}  // namespace

// Hashes p->payload (on up to `threads` threads; 0: by the hardware).
void HashPrepared(Prepared* p, int threads) {
  const uint64_t block = BlockBytesFor(p->payload.bytes.size);
  const std::vector<uint64_t> sums = BlockChecksums(p->payload.bytes, block, threads);
  p->payload.checksum = BlockDigest(sums);
  p->blocks = BlocksParam(block, sums);
}

Prepared Prepare(const TensorMap& tensors) {
  Prepared p;
  p.payload = EncodeSafetensors(tensors, {}, /*checksum=*/false);
  HashPrepared(&p);
  return p;
}

// What names an object's content: its digest and size.
std::string ContentOf(const EncodedPayload& payload) {
  return std::to_string(payload.checksum) + ":" + std::to_string(payload.bytes.size);
}

std::string IdentityOf(const GatherList& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.segments.size(); ++i) {
    const Buffer& seg = bytes.segments[i];
    if (i == 0) {
      out.append(reinterpret_cast<const char*>(seg.data()), seg.size());
    } else {
      out += ";" + std::to_string(reinterpret_cast<uintptr_t>(seg.data())) + "+" +
             std::to_string(seg.size());
    }
  }
  return out;
}

// Parses kHybridBlocksParam for an object of `size` bytes whose stub names
// `digest`; Corrupt unless it is well formed and matches both.
Status ParseBlocksParam(const std::string& text, uint64_t size, uint64_t digest,
                        uint64_t* block_bytes, std::vector<uint64_t>* sums) {
  const auto colon = text.find(':');
  uint64_t block = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + std::min(colon, text.size()), block);
  if (colon == std::string::npos || ec != std::errc() || end != text.data() + colon ||
      block < (1ull << 20) || block > (1ull << 40) || (block & (block - 1)) != 0) {
    return Corrupt("hybrid stub with a malformed block size");
  }
  const std::string_view hex = std::string_view(text).substr(colon + 1);
  const uint64_t n = (size + block - 1) / block;
  if (hex.size() != 16 * n) {
    return Corrupt("hybrid stub with " + std::to_string(hex.size() / 16) +
                   " block checksums for an object of " + std::to_string(n) + " blocks");
  }
  sums->resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    auto [e, c] = std::from_chars(hex.data() + 16 * i, hex.data() + 16 * (i + 1), (*sums)[i], 16);
    if (c != std::errc() || e != hex.data() + 16 * (i + 1)) {
      return Corrupt("hybrid stub with a malformed block checksum");
    }
  }
  if (BlockDigest(*sums) != digest) {
    return Corrupt("hybrid stub whose block checksums do not match its checksum");
  }
  *block_bytes = block;
  return Status::OK();
}

void HybridTransport::MakeStub(Message* m, const Key& key, uint64_t checksum,
                               const std::string& blocks, const std::string& url) {
  m->params[kHybridKeyParam] = key.ToJson();
  m->params[kHybridChecksumParam] = static_cast<int64_t>(checksum);
  m->params[kHybridBlocksParam] = blocks;
  if (!url.empty()) m->params[kHybridUrlParam] = url;
}

}  // namespace xsilo::hybrid_detail
