// Private: AWS Signature Version 4 for S3, shared by the client (signing)
// and the embedded server (verification).
//
// S3 differs from other AWS services in two ways that matter here: the
// canonical URI is the path encoded once (no double encoding, no dot
// segment normalisation), and the payload hash may be UNSIGNED-PAYLOAD.
#pragma once

#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "net/crypto.h"
#include "xsilo/core/status.h"

namespace xsilo::s3 {

inline constexpr std::string_view kSigV4Algorithm = "AWS4-HMAC-SHA256";
inline constexpr std::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";

// Ordered (name, value) pairs, decoded.
using Params = std::vector<std::pair<std::string, std::string>>;

// RFC 3986 percent-encoding as SigV4 wants it: everything but A-Z a-z 0-9
// - . _ ~ is encoded (uppercase hex); '/' is kept when !encode_slash.
std::string UriEncode(std::string_view s, bool encode_slash = true);
// Decodes %XX escapes; false on a malformed escape. '+' stays '+'.
bool UriDecode(std::string_view s, std::string* out);
// "/bucket/a b/c" -> "/bucket/a%20b/c".
inline std::string CanonicalUri(std::string_view decoded_path) {
  return decoded_path.empty() ? std::string("/") : UriEncode(decoded_path, false);
}
// Sorted by encoded name then value, joined "n=v&n2=v2"; `skip` is left out.
std::string CanonicalQuery(const Params& query, std::string_view skip = {});
// Parses "a=1&b&c=%20" into decoded pairs; false on a malformed escape.
bool ParseQuery(std::string_view raw, Params* out);

// "20130524T000000Z" / "20130524".
std::string FormatAmzDate(std::time_t t);
std::string FormatDateStamp(std::time_t t);
// Parses "YYYYMMDDTHHMMSSZ"; false when malformed.
bool ParseAmzDate(std::string_view s, std::time_t* out);
// RFC 7231 date, "Fri, 24 May 2013 00:00:00 GMT".
std::string FormatHttpDate(std::time_t t);
// Parses an RFC 7231 IMF-fixdate ("Fri, 24 May 2013 00:00:00 GMT"), the
// obsolete RFC 850 and asctime forms, and ISO 8601 ("2013-05-24T00:00:00Z",
// fraction allowed); false when malformed.
bool ParseHttpDate(std::string_view s, std::time_t* out);
// ISO 8601 with milliseconds, "2013-05-24T00:00:00.000Z".
std::string FormatIsoDate(std::time_t t);

// Trims and collapses runs of spaces, as canonical header values require.
std::string CanonicalHeaderValue(std::string_view v);

struct CanonicalRequestParts {
  std::string_view method;
  std::string canonical_uri;    // already encoded
  std::string canonical_query;  // already canonical
  // Signed headers: lowercase names, any order (they are sorted here).
  Params headers;
  std::string payload_hash;  // hex SHA-256 or UNSIGNED-PAYLOAD
};
// Returns the canonical request; `signed_headers` receives "a;b;c".
std::string CanonicalRequest(const CanonicalRequestParts& parts, std::string* signed_headers);

// "20130524/us-east-1/s3/aws4_request".
std::string CredentialScope(std::string_view date_stamp, std::string_view region,
                            std::string_view service);
std::string StringToSign(std::string_view amz_date, std::string_view scope,
                         std::string_view canonical_request);
net::Sha256Digest SigningKey(std::string_view secret_key, std::string_view date_stamp,
                             std::string_view region, std::string_view service);
// Hex signature of `string_to_sign`.
std::string Signature(std::string_view secret_key, std::string_view date_stamp,
                      std::string_view region, std::string_view service,
                      std::string_view string_to_sign);

// A presigned URL is a bearer token until it expires: what may be shown of
// one in a Status or a log line is its scheme, host and path. The query
// (signature, credential, security token) becomes "?<signed query
// redacted>".
std::string RedactUrl(std::string_view url);
// `text` with the value of every X-Amz-Signature, X-Amz-Credential and
// X-Amz-Security-Token parameter (any case) replaced by "REDACTED": for
// text that may quote a URL (a library's error message).
std::string RedactSignedQuery(std::string_view text);

// What a parsed Authorization header or presigned query says.
struct SigV4Auth {
  std::string access_key;
  std::string date_stamp;  // from the credential scope
  std::string region;
  std::string service;
  std::vector<std::string> signed_headers;  // lowercase
  std::string signature;
  std::string amz_date;          // X-Amz-Date (header or query)
  int64_t expires_seconds = -1;  // presigned only
  bool presigned = false;
};
// Parses "AWS4-HMAC-SHA256 Credential=AK/2013.../s3/aws4_request,
// SignedHeaders=a;b, Signature=hex".
Status ParseAuthorizationHeader(std::string_view value, SigV4Auth* out);
// Parses the X-Amz-* presigned query parameters.
Status ParsePresignedQuery(const Params& query, SigV4Auth* out);

}  // namespace xsilo::s3
