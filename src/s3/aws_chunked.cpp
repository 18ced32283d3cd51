#include "s3/aws_chunked.h"

#include <cstring>
#include <string>

#include "s3/crypto.h"
#include "s3/errors.h"

namespace xsilo::s3 {

namespace {
constexpr std::string_view kSignatureKey = "chunk-signature=";
constexpr size_t kSignatureChars = 64;
constexpr size_t kMaxSizeDigits = 16;  // 64 bits

Status Bad(const std::string& why) { return S3Error("IncompleteBody", "aws-chunked body: " + why); }

}  // namespace

Result<uint64_t> DecodeAwsChunks(uint8_t* data, uint64_t size, uint64_t decoded_length,
                                 const ChunkVerifier& verify) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  constexpr size_t kMaxHeader = kMaxSizeDigits + 1 + kSignatureKey.size() + kSignatureChars;
  uint64_t pos = 0, written = 0;
  for (;;) {
    const size_t eol = text.find("\r\n", pos);
    if (eol == std::string_view::npos || eol - pos > kMaxHeader) return Bad("no chunk header");
    const std::string_view header = text.substr(pos, eol - pos);
    const size_t semi = header.find(';');
    if (semi == std::string_view::npos || semi == 0 || semi > kMaxSizeDigits ||
        header.substr(semi + 1, kSignatureKey.size()) != kSignatureKey ||
        header.size() != semi + 1 + kSignatureKey.size() + kSignatureChars) {
      return Bad("malformed chunk header");
    }
    uint64_t n = 0;
    for (char ch : header.substr(0, semi)) {
      const int v = HexValue(ch);
      if (v < 0) return Bad("chunk size is not hex");
      n = n * 16 + static_cast<uint64_t>(v);
    }
    pos = eol + 2;
    if (n > size - pos || size - pos - n < 2 || text.substr(pos + n, 2) != "\r\n") {
      return Bad("a chunk is shorter than its size");
    }
    if (n > decoded_length - written) return Bad("more bytes than x-amz-decoded-content-length");
    XSILO_RETURN_IF_ERROR(verify(std::span<const uint8_t>(data + pos, n),
                                 header.substr(semi + 1 + kSignatureKey.size())));
    std::memmove(data + written, data + pos, n);  // written <= pos: moves backwards
    written += n;
    pos += n + 2;
    if (n == 0) break;
  }
  if (pos != size) return Bad("bytes after the final chunk");
  if (written != decoded_length) return Bad("fewer bytes than x-amz-decoded-content-length");
  return written;
}

}  // namespace xsilo::s3
