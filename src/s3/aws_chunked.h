// Private: the framing of an aws-chunked request body (SigV4 "payload in
// multiple chunks"): each chunk is
//   <hex size>;chunk-signature=<64 hex>\r\n<size bytes>\r\n
// and the last one has size 0. The body comes from whoever reached the
// server, so every length is checked before it is used (fuzzed:
// fuzz/fuzz_s3_chunked.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

#include "xsilo/core/status.h"

namespace xsilo::s3 {

// Called for each chunk in order (the last one with no bytes) with its bytes
// and its signature (64 characters); an error stops the decoding with it.
using ChunkVerifier =
    std::function<Status(std::span<const uint8_t> bytes, std::string_view signature)>;

// Decodes the `size` bytes at `data` in place: the chunks' bytes end up at
// the front of `data`, and their count is returned. It must equal
// `decoded_length` (the request's x-amz-decoded-content-length). Framing
// errors are IncompleteBody S3 errors; the verifier's errors pass through.
Result<uint64_t> DecodeAwsChunks(uint8_t* data, uint64_t size, uint64_t decoded_length,
                                 const ChunkVerifier& verify);

}  // namespace xsilo::s3
