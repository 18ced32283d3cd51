// Private: the object checksums S3 defines beside the ETag ("flexible
// checksums": x-amz-checksum-crc32, -crc32c, -crc64nvme, -sha1, -sha256),
// computed incrementally so that a body is hashed as it arrives.
//
// Values travel base64-encoded, big-endian for the CRCs, as S3 sends them.
// A multipart object's checksum is "composite": the checksum of the
// concatenated raw part checksums, base64, then "-<parts>".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xsilo::s3 {

enum class ChecksumAlgorithm { kCrc32, kCrc32c, kCrc64Nvme, kSha1, kSha256 };

inline constexpr ChecksumAlgorithm kAllChecksumAlgorithms[] = {
    ChecksumAlgorithm::kCrc32, ChecksumAlgorithm::kCrc32c, ChecksumAlgorithm::kCrc64Nvme,
    ChecksumAlgorithm::kSha1, ChecksumAlgorithm::kSha256};

// "CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256" (as in
// x-amz-sdk-checksum-algorithm; any case) -> the algorithm.
std::optional<ChecksumAlgorithm> ParseChecksumAlgorithm(std::string_view name);
// "CRC32", ...: the name S3 uses in XML (<ChecksumCRC32>) and headers.
std::string_view ChecksumName(ChecksumAlgorithm a);
// "x-amz-checksum-crc32", ... (lowercase, as HttpRequest stores names).
std::string ChecksumHeader(ChecksumAlgorithm a);
// Raw digest bytes: 4, 4, 8, 20, 32.
size_t ChecksumSize(ChecksumAlgorithm a);

class ChecksumStream {
 public:
  explicit ChecksumStream(ChecksumAlgorithm a);
  ~ChecksumStream();
  ChecksumStream(const ChecksumStream&) = delete;
  ChecksumStream& operator=(const ChecksumStream&) = delete;
  ChecksumAlgorithm algorithm() const { return algorithm_; }
  void Update(const void* data, size_t n);
  // The raw digest (big-endian for the CRCs). Call once.
  std::vector<uint8_t> Finish();

 private:
  struct Impl;
  ChecksumAlgorithm algorithm_;
  uint64_t crc_ = 0;
  std::unique_ptr<Impl> digest_;  // SHA-1 / SHA-256
};

std::vector<uint8_t> ComputeChecksum(ChecksumAlgorithm a, std::span<const uint8_t> bytes);

// CRC-32C (Castagnoli), continuing from `crc` (0 to start): SSE 4.2 where
// the CPU has it, else a table. Exposed for its tests.
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);
// CRC-64/NVME (reflected 0x9a6c9329ac4bc9b5, init and xorout all ones),
// continuing from `crc` (0 to start).
uint64_t Crc64Nvme(uint64_t crc, const void* data, size_t n);

}  // namespace xsilo::s3
