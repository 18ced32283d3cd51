// Private: the framing of an aws-chunked request body (SigV4 "payload in
// multiple chunks"). Each chunk is
//   <hex size>;chunk-signature=<64 hex>\r\n<size bytes>\r\n   (signed)
//   <hex size>\r\n<size bytes>\r\n                            (unsigned)
// and the last one has size 0. After it come trailer lines
// ("x-amz-checksum-crc32:<base64>\r\n", in the *-TRAILER variants only) and
// an empty line. The body comes from whoever reached the server, so every
// length is checked before it is used (fuzzed: fuzz/fuzz_s3_chunked.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "xsilo/core/status.h"

namespace xsilo::s3 {

// Called for each chunk in order (the last one with no bytes) with its bytes
// and its signature (64 characters; empty for unsigned chunks); an error
// stops the decoding with it.
using ChunkVerifier =
    std::function<Status(std::span<const uint8_t> bytes, std::string_view signature)>;

struct AwsChunkedFormat {
  bool signed_chunks = true;      // chunk-signature= on every chunk header
  bool trailers_allowed = false;  // *-TRAILER: header lines after the last chunk
};

struct AwsChunkedBody {
  uint64_t length = 0;  // decoded bytes, now at the front of the buffer
  // Trailer lines, names lowercased, values trimmed, in order.
  std::vector<std::pair<std::string, std::string>> trailers;
};

// Decodes the `size` bytes at `data` in place: the chunks' bytes end up at
// the front of `data`. Their count must equal `decoded_length` (the
// request's x-amz-decoded-content-length). Framing errors are IncompleteBody
// S3 errors (a trailer where none is allowed: InvalidRequest); the
// verifier's errors pass through.
Result<AwsChunkedBody> DecodeAwsChunks(uint8_t* data, uint64_t size, uint64_t decoded_length,
                                       AwsChunkedFormat format, const ChunkVerifier& verify);

}  // namespace xsilo::s3
