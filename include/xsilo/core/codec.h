// The xsilo wire format (specified in docs/wire-format.md).
//
// A frame is a 40-byte fixed prefix, a JSON message header padded to 64
// bytes, and a payload laid out exactly as a safetensors file. Encoding is a
// gather list of Buffers (the small prefix, then the tensors' own Buffers):
// no payload byte is copied. Decoding is zero-copy: decoded tensors are
// views into the input Buffer. Every decode failure is a Status.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "xsilo/core/buffer.h"
#include "xsilo/core/message.h"
#include "xsilo/core/status.h"

namespace xsilo {

inline constexpr uint32_t kFrameMagic = 0x4c495358;  // "XSIL" little-endian
// 2: the prefix's payload checksum is the PayloadChecksum (block digest);
// 1 had the XXH3-64 of the whole payload.
inline constexpr uint16_t kWireVersion = 2;
inline constexpr uint64_t kFramePrefixSize = 40;

// Bytes as a gather list: segments concatenated in order.
struct GatherList {
  std::vector<Buffer> segments;
  uint64_t size = 0;

  void Append(Buffer b);
  // Copies the segments into one new contiguous aligned Buffer.
  Result<Buffer> Flatten() const;
  // Copies [offset, offset + length) of the concatenation into `out`.
  void CopyRange(uint64_t offset, uint64_t length, uint8_t* out) const;
};

// A safetensors payload.
struct EncodedPayload {
  GatherList bytes;
  uint64_t checksum = 0;  // XXH3-64 of all payload bytes
};

// A whole frame; `payload_offset` is where the safetensors payload begins.
struct EncodedFrame {
  GatherList bytes;
  uint64_t payload_offset = 0;
  uint64_t payload_checksum = 0;
};

struct DecodeLimits {
  // Largest accepted JSON header (message header or safetensors header).
  uint64_t max_header_bytes = 64ull << 20;
  // Largest accepted payload; frames announcing more are rejected before any allocation.
  uint64_t max_payload_bytes = 1ull << 42;
  uint64_t max_tensors = 1u << 20;
  bool verify_checksum = true;
  // The payload's XXH3-64 if the caller computed it already (a receiver
  // hashing chunks as they arrive): compared with the prefix's instead of
  // hashing the payload a second time.
  std::optional<uint64_t> payload_checksum;
};

// Tensors in payload order: by element size (largest first), then by name,
// so every tensor starts at a multiple of its element size.
std::vector<const std::pair<const std::string, Tensor>*> PayloadOrder(const TensorMap& tensors);

// `checksum` false leaves EncodedPayload::checksum 0 (for a caller that
// checksums the bytes its own way, e.g. by BlockChecksums).
EncodedPayload EncodeSafetensors(const TensorMap& tensors,
                                 const std::map<std::string, std::string>& metadata = {},
                                 bool checksum = true);
Result<TensorMap> DecodeSafetensors(const Buffer& payload, const DecodeLimits& limits = {},
                                    std::map<std::string, std::string>* metadata = nullptr);

// XXH3-64 over a gather list / a contiguous span.
uint64_t Checksum(const GatherList& bytes);
uint64_t Checksum(std::span<const uint8_t> bytes);

// XXH3-64 of each consecutive block of `block_bytes` (> 0; the last block
// may be shorter; none for empty bytes). Blocks are independent: they are
// hashed on up to `threads` threads (0: up to 4, by the hardware; a thread
// only for 8 blocks or more), and a receiver can check each range of them
// as it arrives instead of a second pass over the whole.
std::vector<uint64_t> BlockChecksums(const GatherList& bytes, uint64_t block_bytes,
                                     int threads = 0);
std::vector<uint64_t> BlockChecksums(std::span<const uint8_t> bytes, uint64_t block_bytes,
                                     int threads = 0);
// One figure for a list of block checksums: XXH3-64 of them as
// little-endian u64s.
uint64_t BlockDigest(std::span<const uint64_t> sums);
// The block size for `size` bytes: the smallest power of two of at least
// 1 MiB that makes at most 1024 blocks.
uint64_t BlockBytesFor(uint64_t size);
// A frame's payload checksum (docs/wire-format.md): the BlockDigest of the
// payload's BlockChecksums at BlockBytesFor(size), on up to `threads`
// threads (0: up to 4, by the hardware).
uint64_t PayloadChecksum(const GatherList& payload, int threads = 0);
uint64_t PayloadChecksum(std::span<const uint8_t> payload, int threads = 0);

// A PayloadChecksum computed block by block, in any order, for a sender
// that hashes each part of a payload right before it sends it (while the
// part is in cache). Hash(i) for every block i < blocks(), each once, then
// Digest(). Calls for different blocks may run on different threads; the
// caller orders the last of them before Digest().
class PayloadBlockHasher {
 public:
  explicit PayloadBlockHasher(GatherList payload);
  uint64_t size() const { return payload_.size; }
  uint64_t block_bytes() const { return block_bytes_; }
  uint64_t blocks() const { return sums_.size(); }
  void Hash(uint64_t i);
  uint64_t Digest() const;

 private:
  GatherList payload_;
  std::vector<uint64_t> starts_;
  uint64_t block_bytes_ = 0;
  std::vector<uint64_t> sums_;
};

// A PayloadChecksum of bytes fed in order, in pieces of any size (a
// receiver hashing chunks as they arrive).
class PayloadChecksumStream {
 public:
  explicit PayloadChecksumStream(uint64_t payload_bytes);
  ~PayloadChecksumStream();
  PayloadChecksumStream(PayloadChecksumStream&&) noexcept;
  PayloadChecksumStream& operator=(PayloadChecksumStream&&) noexcept;
  void Update(std::span<const uint8_t> bytes);
  // After all payload_bytes were fed.
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// XXH3-64 of bytes fed in pieces; equals Checksum() over their concatenation.
class ChecksumStream {
 public:
  ChecksumStream();
  ~ChecksumStream();
  ChecksumStream(ChecksumStream&&) noexcept;
  ChecksumStream& operator=(ChecksumStream&&) noexcept;
  void Update(std::span<const uint8_t> bytes);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// `checksum` false leaves the prefix's payload checksum (and
// EncodedFrame::payload_checksum) 0, for a sender that hashes the payload
// while it is on its way and writes the sum with SetFramePayloadChecksum
// before the prefix goes out (the grpc transport, docs/transport-grpc.md).
EncodedFrame EncodeMessage(const Message& message, bool checksum = true);
// The frame's payload, [payload_offset, size) of its bytes, as views.
GatherList FramePayload(const EncodedFrame& frame);
// Writes `sum` into the prefix: the 8 bytes of its payload-checksum field,
// which no chunk of the payload shares, so the payload may already be on
// its way. Nothing else of the frame changes.
void SetFramePayloadChecksum(const EncodedFrame& frame, uint64_t sum);
Result<Message> DecodeMessage(const Buffer& frame, const DecodeLimits& limits = {});

// The fixed prefix, parsed. Lets a streaming receiver learn the frame size
// from the first 40 bytes and preallocate once.
struct FramePrefix {
  uint16_t version = 0;
  uint16_t flags = 0;
  uint64_t header_len = 0;
  uint64_t payload_len = 0;
  uint64_t payload_checksum = 0;
  uint64_t header_checksum = 0;  // XXH3-64 of the header JSON
  uint64_t payload_offset() const;
  uint64_t frame_size() const { return payload_offset() + payload_len; }
};
Result<FramePrefix> ParseFramePrefix(std::span<const uint8_t> bytes,
                                     const DecodeLimits& limits = {});

// Is this a frame (magic match) rather than a bare safetensors file?
bool LooksLikeFrame(std::span<const uint8_t> bytes);

}  // namespace xsilo
