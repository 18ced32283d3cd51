#include "s3/aws_chunked.h"

#include <cstring>
#include <string>

#include "net/crypto.h"
#include "s3/errors.h"

namespace xsilo::s3 {

namespace {
constexpr std::string_view kSignatureKey = "chunk-signature=";
constexpr size_t kSignatureChars = 64;
constexpr size_t kMaxSizeDigits = 16;  // 64 bits
constexpr size_t kMaxTrailerLine = 256;
constexpr size_t kMaxTrailers = 8;

Status Bad(const std::string& why) { return S3Error("IncompleteBody", "aws-chunked body: " + why); }

}  // namespace

Result<AwsChunkedBody> DecodeAwsChunks(uint8_t* data, uint64_t size, uint64_t decoded_length,
                                       AwsChunkedFormat format, const ChunkVerifier& verify) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const size_t max_header = format.signed_chunks
                                ? kMaxSizeDigits + 1 + kSignatureKey.size() + kSignatureChars
                                : kMaxSizeDigits;
  AwsChunkedBody out;
  uint64_t pos = 0;
  for (;;) {
    const size_t eol = text.find("\r\n", pos);
    if (eol == std::string_view::npos || eol - pos > max_header) return Bad("no chunk header");
    const std::string_view header = text.substr(pos, eol - pos);
    std::string_view digits = header, signature;
    if (format.signed_chunks) {
      const size_t semi = header.find(';');
      if (semi == std::string_view::npos || semi == 0 || semi > kMaxSizeDigits ||
          header.substr(semi + 1, kSignatureKey.size()) != kSignatureKey ||
          header.size() != semi + 1 + kSignatureKey.size() + kSignatureChars) {
        return Bad("malformed chunk header");
      }
      digits = header.substr(0, semi);
      signature = header.substr(semi + 1 + kSignatureKey.size());
    } else if (header.empty()) {
      return Bad("malformed chunk header");
    }
    uint64_t n = 0;
    for (char ch : digits) {
      const int v = net::HexValue(ch);
      if (v < 0) return Bad("chunk size is not hex");
      n = n * 16 + static_cast<uint64_t>(v);
    }
    pos = eol + 2;
    if (n == 0) {
      XSILO_RETURN_IF_ERROR(verify({}, signature));
      break;
    }
    if (n > size - pos || size - pos - n < 2 || text.substr(pos + n, 2) != "\r\n") {
      return Bad("a chunk is shorter than its size");
    }
    if (n > decoded_length - out.length) {
      return Bad("more bytes than x-amz-decoded-content-length");
    }
    XSILO_RETURN_IF_ERROR(verify(std::span<const uint8_t>(data + pos, n), signature));
    std::memmove(data + out.length, data + pos, n);  // length <= pos: moves backwards
    out.length += n;
    pos += n + 2;
  }
  // Trailer lines, then the empty line that ends the body.
  for (;;) {
    const size_t eol = text.find("\r\n", pos);
    if (eol == std::string_view::npos || eol - pos > kMaxTrailerLine) {
      return Bad("no end after the final chunk");
    }
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 2;
    if (line.empty()) break;
    if (!format.trailers_allowed) {
      return S3Error("InvalidRequest", "aws-chunked body: a trailer this upload did not declare");
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0 || out.trailers.size() == kMaxTrailers) {
      return Bad("malformed trailer");
    }
    std::string name(net::TrimOws(line.substr(0, colon)));
    if (name.empty()) return Bad("malformed trailer");
    for (char& ch : name) {
      if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
      const bool token = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                         ch == '_' || ch == '.';
      if (!token) return Bad("malformed trailer name");
    }
    out.trailers.emplace_back(std::move(name), std::string(net::TrimOws(line.substr(colon + 1))));
  }
  if (pos != size) return Bad("bytes after the final chunk");
  if (out.length != decoded_length) return Bad("fewer bytes than x-amz-decoded-content-length");
  return out;
}

}  // namespace xsilo::s3
