// Private: reading and verifying the body of an S3 request.
//
// A body arrives framed one of four ways: Content-Length bytes,
// Transfer-Encoding: chunked, or aws-chunked inside either (signed chunks,
// STREAMING-AWS4-HMAC-SHA256-PAYLOAD; unsigned chunks with a trailer,
// STREAMING-UNSIGNED-PAYLOAD-TRAILER). Whatever the framing, everything the
// request claims about its bytes is verified before the handler sees them,
// and a mismatch stores nothing: the signed payload SHA-256
// (x-amz-content-sha256), each chunk's signature, Content-MD5, and one
// flexible checksum (x-amz-checksum-crc32 / -crc32c / -crc64nvme / -sha1 /
// -sha256, in a header or an aws-chunked trailer). The ETag and the
// checksums are computed in the pass that receives the bytes: each piece is
// hashed as it lands, while the rest is still in flight.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "net/http_server.h"
#include "s3/checksums.h"
#include "s3/etag.h"
#include "xsilo/core/buffer.h"
#include "xsilo/core/status.h"

namespace xsilo::s3 {

// x-amz-content-sha256 of an aws-chunked upload with signed chunks, and of
// one with unsigned chunks and a trailer.
inline constexpr std::string_view kStreamingSigned = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
inline constexpr std::string_view kStreamingUnsignedTrailer = "STREAMING-UNSIGNED-PAYLOAD-TRAILER";

// What authentication established about the body.
struct BodyAuth {
  // Hex SHA-256, UNSIGNED-PAYLOAD, kStreamingSigned or kStreamingUnsignedTrailer.
  std::string payload_hash;
  // kStreamingSigned: the signature the first chunk's chains from (the
  // request's), and what the chunk signatures are computed with.
  std::string chunk_seed, amz_date, date_stamp, scope, secret_key, region;
};

struct BodyOptions {
  uint64_t limit = 0;  // decoded bytes at most (else EntityTooLarge)
  // Compute the object ETag of the bytes.
  std::optional<EtagHash> etag;
  // Compute this checksum when the request sends none (a multipart upload
  // created with x-amz-checksum-algorithm).
  std::optional<ChecksumAlgorithm> checksum_default;
  // false: x-amz-checksum-* headers describe something else than the body
  // (CompleteMultipartUpload: the object's composite checksum) and are left
  // to the caller.
  bool header_checksums = true;
};

struct RequestBody {
  Buffer bytes;
  std::string etag;  // quoted, when BodyOptions::etag was set
  // The flexible checksum sent (and verified) or computed, base64; "" when none.
  std::string checksum_algorithm;  // "CRC32", ...
  std::string checksum;
};

// Reads and verifies the body. On an error, *close is set when the
// connection must close (the body was not, or not wholly, read).
Result<RequestBody> ReadRequestBody(const net::HttpRequest& req, net::BodyReader& reader,
                                    const BodyAuth& auth, const BodyOptions& options, bool* close);

}  // namespace xsilo::s3
