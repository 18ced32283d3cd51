// Payload checksums (docs/wire-format.md, "Checksums"): XXH3-64 of bytes
// and of gather lists, block checksums hashed in parallel and their digest,
// and the streaming forms.
#include "xsilo/core/codec.h"

#include <algorithm>
#include <thread>

#include "core/codec_internal.h"
#include "core/xxh3.h"
#include "xsilo/core/cpus.h"

namespace xsilo {

using codec_detail::PutU64;

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
  if (threads <= 0) threads = DefaultPoolThreads();
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

}  // namespace xsilo
