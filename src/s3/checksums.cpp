#include "s3/checksums.h"

#include <openssl/evp.h>
#include <zlib.h>

#include <array>
#include <cctype>
#include <cstring>

namespace xsilo::s3 {

namespace {

// Slicing-by-8 tables of a reflected CRC with polynomial `poly` (reversed
// form): t[0] is the classic byte table, t[k][b] the CRC of byte b followed
// by k zero bytes.
template <typename T>
struct CrcTables {
  std::array<std::array<T, 256>, 8> t{};
  explicit constexpr CrcTables(T poly) {
    for (unsigned b = 0; b < 256; ++b) {
      T c = static_cast<T>(b);
      for (int i = 0; i < 8; ++i) c = (c & 1) ? (c >> 1) ^ poly : c >> 1;
      t[0][b] = c;
    }
    for (unsigned b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
    }
  }
};

// The raw (not pre/post-inverted) reflected update, 8 bytes at a time.
template <typename T>
T CrcUpdate(const CrcTables<T>& tab, T crc, const uint8_t* p, size_t n) {
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // x86: little-endian, as the reflected CRC reads bytes
    word ^= static_cast<uint64_t>(crc);
    crc = tab.t[7][word & 0xff] ^ tab.t[6][(word >> 8) & 0xff] ^ tab.t[5][(word >> 16) & 0xff] ^
          tab.t[4][(word >> 24) & 0xff] ^ tab.t[3][(word >> 32) & 0xff] ^
          tab.t[2][(word >> 40) & 0xff] ^ tab.t[1][(word >> 48) & 0xff] ^ tab.t[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ tab.t[0][(crc ^ *p++) & 0xff];
  return crc;
}

const CrcTables<uint32_t>& Crc32cTables() {
  static const CrcTables<uint32_t> t(0x82f63b78u);
  return t;
}

const CrcTables<uint64_t>& Crc64NvmeTables() {
  static const CrcTables<uint64_t> t(0x9a6c9329ac4bc9b5ull);
  return t;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(uint32_t crc, const uint8_t* p,
                                                          size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
#endif

void PutBigEndian(uint64_t v, size_t bytes, std::vector<uint8_t>* out) {
  for (size_t i = 0; i < bytes; ++i)
    out->push_back(static_cast<uint8_t>(v >> (8 * (bytes - 1 - i))));
}

}  // namespace

uint32_t Crc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  static const bool hw = __builtin_cpu_supports("sse4.2");
  if (hw) return ~Crc32cHardware(crc, p, n);
#endif
  return ~CrcUpdate(Crc32cTables(), crc, p, n);
}

uint64_t Crc64Nvme(uint64_t crc, const void* data, size_t n) {
  return ~CrcUpdate(Crc64NvmeTables(), ~crc, static_cast<const uint8_t*>(data), n);
}

std::optional<ChecksumAlgorithm> ParseChecksumAlgorithm(std::string_view name) {
  std::string upper(name);
  for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  for (ChecksumAlgorithm a : kAllChecksumAlgorithms) {
    if (ChecksumName(a) == upper) return a;
  }
  return std::nullopt;
}

std::string_view ChecksumName(ChecksumAlgorithm a) {
  switch (a) {
    case ChecksumAlgorithm::kCrc32:
      return "CRC32";
    case ChecksumAlgorithm::kCrc32c:
      return "CRC32C";
    case ChecksumAlgorithm::kCrc64Nvme:
      return "CRC64NVME";
    case ChecksumAlgorithm::kSha1:
      return "SHA1";
    case ChecksumAlgorithm::kSha256:
      return "SHA256";
  }
  return "";
}

std::string ChecksumHeader(ChecksumAlgorithm a) {
  std::string h = "x-amz-checksum-";
  for (char ch : ChecksumName(a))
    h += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return h;
}

size_t ChecksumSize(ChecksumAlgorithm a) {
  switch (a) {
    case ChecksumAlgorithm::kCrc32:
    case ChecksumAlgorithm::kCrc32c:
      return 4;
    case ChecksumAlgorithm::kCrc64Nvme:
      return 8;
    case ChecksumAlgorithm::kSha1:
      return 20;
    case ChecksumAlgorithm::kSha256:
      return 32;
  }
  return 0;
}

struct ChecksumStream::Impl {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  explicit Impl(const EVP_MD* md) { EVP_DigestInit_ex(ctx, md, nullptr); }
  ~Impl() { EVP_MD_CTX_free(ctx); }
};

ChecksumStream::ChecksumStream(ChecksumAlgorithm a) : algorithm_(a) {
  if (a == ChecksumAlgorithm::kSha1) digest_ = std::make_unique<Impl>(EVP_sha1());
  if (a == ChecksumAlgorithm::kSha256) digest_ = std::make_unique<Impl>(EVP_sha256());
}

ChecksumStream::~ChecksumStream() = default;

void ChecksumStream::Update(const void* data, size_t n) {
  // Nothing to add. (zlib reads crc32_z(crc, NULL, 0) as "give me the
  // initial value" and answers 0: an empty last chunk with no storage would
  // reset a running CRC32.)
  if (n == 0) return;
  switch (algorithm_) {
    case ChecksumAlgorithm::kCrc32:
      crc_ = crc32_z(static_cast<uLong>(crc_), static_cast<const Bytef*>(data), n);
      break;
    case ChecksumAlgorithm::kCrc32c:
      crc_ = Crc32c(static_cast<uint32_t>(crc_), data, n);
      break;
    case ChecksumAlgorithm::kCrc64Nvme:
      crc_ = Crc64Nvme(crc_, data, n);
      break;
    case ChecksumAlgorithm::kSha1:
    case ChecksumAlgorithm::kSha256:
      EVP_DigestUpdate(digest_->ctx, data, n);
      break;
  }
}

std::vector<uint8_t> ChecksumStream::Finish() {
  std::vector<uint8_t> out;
  if (digest_ != nullptr) {
    out.resize(EVP_MAX_MD_SIZE);
    unsigned int len = 0;
    EVP_DigestFinal_ex(digest_->ctx, out.data(), &len);
    out.resize(len);
    return out;
  }
  PutBigEndian(crc_, ChecksumSize(algorithm_), &out);
  return out;
}

std::vector<uint8_t> ComputeChecksum(ChecksumAlgorithm a, std::span<const uint8_t> bytes) {
  ChecksumStream s(a);
  s.Update(bytes.data(), bytes.size());
  return s.Finish();
}

}  // namespace xsilo::s3
