#include "s3/request_body.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "net/crypto.h"
#include "s3/aws_chunked.h"
#include "s3/errors.h"
#include "s3/sigv4.h"
#include "xsilo/core/base64.h"
#include "xsilo/core/secret.h"

namespace xsilo::s3 {

namespace {

Status Refuse(bool* close, Status st) {
  *close = true;
  return st;
}

// A decimal header value, or nullopt.
std::optional<uint64_t> ParseLength(const std::string* v) {
  if (v == nullptr || v->empty() || v->size() > 19) return std::nullopt;
  uint64_t n = 0;
  for (char ch : *v) {
    if (ch < '0' || ch > '9') return std::nullopt;
    n = n * 10 + static_cast<uint64_t>(ch - '0');
  }
  return n;
}

// The algorithm an x-amz-checksum-<name> header or trailer names, if any.
std::optional<ChecksumAlgorithm> ChecksumOfHeader(std::string_view lower_name) {
  constexpr std::string_view kPrefix = "x-amz-checksum-";
  if (lower_name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  return ParseChecksumAlgorithm(lower_name.substr(kPrefix.size()));
}

std::string InvalidValue(ChecksumAlgorithm a) {
  return "Value for " + ChecksumHeader(a) + " header is invalid.";
}

// The flexible checksum the request announces: in a header (value known
// now) or as an aws-chunked trailer (value after the body).
struct ChecksumClaim {
  ChecksumAlgorithm algorithm;
  std::optional<std::vector<uint8_t>> value;  // nullopt: in the trailer
  std::string trailer_name;
};

Result<std::optional<ChecksumClaim>> FindChecksumClaim(const net::HttpRequest& req,
                                                       bool trailer_mode) {
  std::optional<ChecksumClaim> claim;
  for (const auto& [name, value] : req.headers) {
    auto a = ChecksumOfHeader(name);
    if (!a) continue;  // x-amz-checksum-mode, -algorithm, -type are not values
    if (claim) {
      return S3Error("InvalidRequest",
                     "Expecting a single x-amz-checksum- header. Multiple checksum Types are not "
                     "allowed.");
    }
    auto raw = Base64Decode(value);
    if (!raw || raw->size() != ChecksumSize(*a)) return S3Error("InvalidRequest", InvalidValue(*a));
    claim = ChecksumClaim{*a, std::move(*raw), {}};
  }
  if (const std::string* t = req.Header("x-amz-trailer")) {
    std::string name = *t;
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    auto a = ChecksumOfHeader(name);
    if (!trailer_mode || !a) {
      return S3Error("InvalidRequest",
                     "x-amz-trailer names an x-amz-checksum-* trailer of a "
                     "STREAMING-UNSIGNED-PAYLOAD-TRAILER upload only (got '" +
                         *t + "')");
    }
    if (claim) {
      return S3Error("InvalidRequest",
                     "Expecting a single x-amz-checksum- header. Multiple checksum Types are not "
                     "allowed.");
    }
    claim = ChecksumClaim{*a, std::nullopt, name};
  }
  if (const std::string* sdk = req.Header("x-amz-sdk-checksum-algorithm")) {
    auto a = ParseChecksumAlgorithm(*sdk);
    if (!a) return S3Error("InvalidRequest", "Checksum algorithm provided is unsupported: " + *sdk);
    if (!claim) {
      return S3Error("InvalidRequest",
                     "x-amz-sdk-checksum-algorithm specified, but no corresponding "
                     "x-amz-checksum-* or x-amz-trailer headers were found.");
    }
    if (*a != claim->algorithm) {
      return S3Error("InvalidRequest",
                     "Value for x-amz-sdk-checksum-algorithm header is invalid: it names " + *sdk +
                         " and the checksum sent is " +
                         std::string(ChecksumName(claim->algorithm)));
    }
  }
  return claim;
}

}  // namespace

Result<RequestBody> ReadRequestBody(const net::HttpRequest& req, net::BodyReader& reader,
                                    const BodyAuth& auth, const BodyOptions& options, bool* close) {
  if (!req.has_content_length && !req.chunked) {
    return Refuse(
        close, S3Error("MissingContentLength", "You must provide the Content-Length HTTP header."));
  }
  const bool signed_chunks = auth.payload_hash == kStreamingSigned;
  const bool trailer_mode = auth.payload_hash == kStreamingUnsignedTrailer;
  const bool aws_chunked = signed_chunks || trailer_mode;
  uint64_t decoded_length = req.content_length;
  uint64_t raw_limit = options.limit;
  if (aws_chunked) {
    auto n = ParseLength(req.Header("x-amz-decoded-content-length"));
    if (!n || (req.has_content_length && *n > req.content_length)) {
      return Refuse(close, S3Error("MissingContentLength",
                                   "An aws-chunked upload needs a valid "
                                   "x-amz-decoded-content-length header."));
    }
    decoded_length = *n;
    // Chunk framing adds about 86 bytes per signed chunk, fewer unsigned.
    raw_limit = decoded_length + decoded_length / 8 + (1 << 20);
  }
  if ((req.has_content_length || aws_chunked) && decoded_length > options.limit) {
    return Refuse(
        close, S3Error("EntityTooLarge", "Your proposed upload exceeds the maximum allowed size (" +
                                             std::to_string(options.limit) + " bytes)."));
  }
  if (req.has_content_length && req.content_length > raw_limit) {
    return Refuse(
        close, S3Error("EntityTooLarge", "Your proposed upload exceeds the maximum allowed size (" +
                                             std::to_string(options.limit) + " bytes)."));
  }

  std::optional<std::vector<uint8_t>> md5_want;
  if (const std::string* v = req.Header("content-md5")) {
    md5_want = Base64Decode(*v);
    if (!md5_want || md5_want->size() != 16) {
      return Refuse(close, S3Error("InvalidDigest", "The Content-MD5 you specified is not valid."));
    }
  }
  std::optional<ChecksumClaim> claim;
  if (options.header_checksums) {
    auto found = FindChecksumClaim(req, trailer_mode);
    if (!found.ok()) return Refuse(close, found.status());
    claim = std::move(found).value();
  }

  // Every hash the body needs, fed in one pass as the bytes arrive (or, for
  // aws-chunked bodies, as each chunk is decoded).
  const bool check_payload = !aws_chunked && auth.payload_hash != kUnsignedPayload;
  std::optional<net::Sha256Stream> payload_sha;
  if (check_payload) payload_sha.emplace();
  std::optional<net::Md5Stream> md5;
  if (md5_want) md5.emplace();
  std::optional<EtagHasher> etag;
  if (options.etag) etag.emplace(*options.etag);
  std::optional<ChecksumStream> checksum;
  if (claim) {
    checksum.emplace(claim->algorithm);
  } else if (options.checksum_default) {
    checksum.emplace(*options.checksum_default);
  }
  auto feed = [&](const uint8_t* p, size_t n) {
    if (payload_sha) payload_sha->Update(p, n);
    if (md5) md5->Update(p, n);
    if (etag) etag->Update(p, n);
    if (checksum) checksum->Update(p, n);
  };

  auto raw = reader.ReadAll(raw_limit, aws_chunked ? net::BodyReader::Observer() : feed);
  if (!raw.ok()) {
    *close = true;
    if (raw.status().code() == StatusCode::kResourceExhausted) {
      return S3Error("EntityTooLarge", "Your proposed upload exceeds the maximum allowed size (" +
                                           std::to_string(options.limit) + " bytes).");
    }
    return S3Error("IncompleteBody",
                   "You did not provide the number of bytes specified by the "
                   "Content-Length HTTP header: " +
                       raw.status().message());
  }
  RequestBody out;
  out.bytes = std::move(raw).value();
  std::vector<std::pair<std::string, std::string>> trailers;
  if (aws_chunked) {
    std::string previous = auth.chunk_seed;
    uint64_t at = 0;
    auto verify = [&](std::span<const uint8_t> bytes, std::string_view given) -> Status {
      if (signed_chunks) {
        const std::string to_sign =
            "AWS4-HMAC-SHA256-PAYLOAD\n" + auth.amz_date + "\n" + auth.scope + "\n" + previous +
            "\n" + std::string(net::kEmptySha256Hex) + "\n" + net::Hex(net::Sha256(bytes));
        std::string expected =
            Signature(auth.secret_key, auth.date_stamp, auth.region, "s3", to_sign);
        if (!SecretEquals(expected, given)) {
          return S3Error("SignatureDoesNotMatch",
                         "The chunk signature we calculated does not match the signature you "
                         "provided (chunk at byte " +
                             std::to_string(at) + ").");
        }
        previous = std::move(expected);
      }
      feed(bytes.data(), bytes.size());
      at += bytes.size();
      return Status::OK();
    };
    AwsChunkedFormat format{.signed_chunks = signed_chunks, .trailers_allowed = trailer_mode};
    XSILO_ASSIGN_OR_RETURN(AwsChunkedBody decoded,
                           DecodeAwsChunks(out.bytes.mutable_data(), out.bytes.size(),
                                           decoded_length, format, verify));
    out.bytes = out.bytes.SliceUnchecked(0, decoded.length);
    trailers = std::move(decoded.trailers);
  }

  if (payload_sha && net::Hex(payload_sha->Finish()) != auth.payload_hash) {
    return S3Error("XAmzContentSHA256Mismatch",
                   "The provided 'x-amz-content-sha256' header does not match what was computed.");
  }
  if (md5) {
    net::Md5Digest d = md5->Finish();
    if (!std::equal(d.begin(), d.end(), md5_want->begin())) {
      return S3Error("BadDigest", "The Content-MD5 you specified did not match what we received.");
    }
  }
  if (checksum) {
    std::vector<uint8_t> got = checksum->Finish();
    const ChecksumAlgorithm a = checksum->algorithm();
    std::optional<std::vector<uint8_t>> want;
    if (claim && claim->value) {
      want = claim->value;
    } else if (claim) {
      for (const auto& [name, value] : trailers) {
        if (name != claim->trailer_name) continue;
        want = Base64Decode(value);
        if (!want || want->size() != ChecksumSize(a)) {
          return S3Error("InvalidRequest", InvalidValue(a));
        }
      }
      if (!want) {
        return S3Error("InvalidRequest", "The upload declared the trailer " + claim->trailer_name +
                                             " (x-amz-trailer) and did not send it.");
      }
    }
    if (want && *want != got) {
      return S3Error("BadDigest", "The " + std::string(ChecksumName(a)) +
                                      " you specified did not match the calculated checksum.");
    }
    out.checksum_algorithm = std::string(ChecksumName(a));
    out.checksum = net::Base64Of(got);
  }
  if (etag) out.etag = etag->Finish();
  return out;
}

}  // namespace xsilo::s3
