// Authentication (SigV4 in the Authorization header or a presigned query;
// SigV2 refused) and reading a request's body, aws-chunked included.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>

#include "s3/server_internal.h"
#include "s3/sigv4.h"
#include "xsilo/core/secret.h"

namespace xsilo {

using namespace s3server;

namespace {

bool IsLowerHex64(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace

Status S3Server::Impl::Authenticate(Ctx& c) {
  const HttpRequest& req = c.req;
  const std::string* authz = req.Header("authorization");
  bool presigned = false, sigv2_query = false;
  for (const auto& [k, v] : c.query) {
    presigned |= (k == "X-Amz-Signature");
    sigv2_query |= (k == "AWSAccessKeyId" || k == "Signature");
  }
  // Signature Version 2 (boto3's presign default without
  // Config(signature_version="s3v4")) is refused the way S3 regions that
  // only take SigV4 refuse it.
  if ((authz && authz->rfind("AWS ", 0) == 0) || (!presigned && sigv2_query)) {
    return S3Error("InvalidRequest",
                   "The authorization mechanism you have provided is not supported. "
                   "Please use AWS4-HMAC-SHA256.");
  }
  if (!authz) {  // presigned or anonymous: the body is taken as it comes
    const std::string* sha = req.Header("x-amz-content-sha256");
    if (sha != nullptr && sha->rfind("STREAMING-", 0) == 0) {
      return S3Error("NotImplemented", "aws-chunked uploads must be signed in the header");
    }
  }
  if (!authz && !presigned) {
    if (opts.allow_anonymous) {
      c.payload_hash = std::string(s3::kUnsignedPayload);
      c.anonymous = true;
      return Status::OK();
    }
    return S3Error("AccessDenied", "Access Denied (the request is not signed)");
  }
  if (authz && presigned) {
    return S3Error("InvalidArgument", "Only one auth mechanism allowed");
  }
  s3::SigV4Auth auth;
  std::time_t now = std::time(nullptr);
  std::time_t signed_at = 0;
  if (authz) {
    XSILO_RETURN_IF_ERROR(s3::ParseAuthorizationHeader(*authz, &auth));
    const std::string* date = req.Header("x-amz-date");
    if (!date || !s3::ParseAmzDate(*date, &signed_at)) {
      return S3Error("AccessDenied", "AWS authentication requires a valid x-amz-date header");
    }
    auth.amz_date = *date;
    const std::string* sha = req.Header("x-amz-content-sha256");
    // S3 requires the header; signers that omit it (curl --aws-sigv4 before
    // 8.x) hash the empty body of a bodyless request.
    static const std::string kEmptyHash(net::kEmptySha256Hex);
    if (!sha && req.content_length == 0) sha = &kEmptyHash;
    if (!sha) {
      return S3Error("InvalidRequest",
                     "Missing required header for this request: x-amz-content-sha256");
    }
    const bool streaming = *sha == s3::kStreamingSigned || *sha == s3::kStreamingUnsignedTrailer;
    if (sha->rfind("STREAMING-", 0) == 0 && !streaming) {
      return S3Error("NotImplemented",
                     "aws-chunked uploads are supported with signed chunks "
                     "(STREAMING-AWS4-HMAC-SHA256-PAYLOAD) or unsigned chunks and a trailer "
                     "(STREAMING-UNSIGNED-PAYLOAD-TRAILER), not " +
                         *sha);
    }
    if (*sha != s3::kUnsignedPayload && !streaming && !IsLowerHex64(*sha)) {
      return S3Error("InvalidArgument",
                     "x-amz-content-sha256 must be UNSIGNED-PAYLOAD or a valid sha256 value.");
    }
    c.payload_hash = *sha;
    auto skew = std::chrono::seconds(std::llabs(static_cast<long long>(now - signed_at)));
    if (skew > opts.max_clock_skew) {
      return S3Error("RequestTimeTooSkewed",
                     "The difference between the request time and the current time is too large.");
    }
  } else {
    XSILO_RETURN_IF_ERROR(s3::ParsePresignedQuery(c.query, &auth));
    if (!s3::ParseAmzDate(auth.amz_date, &signed_at)) {
      return S3Error("AuthorizationQueryParametersError",
                     "X-Amz-Date must be YYYYMMDD'T'HHMMSS'Z'");
    }
    if (auth.expires_seconds > opts.max_presign_expiry.count()) {
      return S3Error("AuthorizationQueryParametersError",
                     "X-Amz-Expires must be less than a week (in seconds); that is, the given "
                     "X-Amz-Expires must be less than " +
                         std::to_string(opts.max_presign_expiry.count()) + " seconds");
    }
    // X-Amz-Expires=0 is valid syntax and expired on arrival.
    if (auth.expires_seconds == 0 || now > signed_at + auth.expires_seconds) {
      return S3Error("AccessDenied", "Request has expired");
    }
    if (signed_at > now + opts.max_clock_skew.count()) {
      return S3Error("AccessDenied", "Request is not valid yet");
    }
    c.payload_hash = std::string(s3::kUnsignedPayload);
    if (const std::string* q = c.Query("X-Amz-Content-Sha256")) c.payload_hash = *q;
    if (c.payload_hash.rfind("STREAMING-", 0) == 0) {
      return S3Error("NotImplemented", "aws-chunked uploads must be signed in the header");
    }
  }
  if (auth.access_key != opts.access_key) {
    return S3Error("InvalidAccessKeyId",
                   "The AWS Access Key Id you provided does not exist in our records.");
  }
  if (auth.service != "s3" || auth.region != opts.region) {
    return S3Error(presigned ? "AuthorizationQueryParametersError" : "AuthorizationHeaderMalformed",
                   "the credential scope must be <date>/" + opts.region + "/s3/aws4_request");
  }
  if (auth.date_stamp != auth.amz_date.substr(0, 8)) {
    return S3Error("SignatureDoesNotMatch", "credential scope date differs from X-Amz-Date");
  }
  s3::CanonicalRequestParts parts;
  parts.method = req.method;
  std::string path;
  s3::UriDecode(req.raw_path, &path);
  parts.canonical_uri = s3::CanonicalUri(path);
  parts.canonical_query = s3::CanonicalQuery(c.query, presigned ? "X-Amz-Signature" : "");
  // SigV4 requires host among the signed headers: without it a signature
  // is not bound to the server it was made for, and a request (or a
  // presigned URL) captured on its way to one server replays at another
  // that shares the credentials.
  if (std::find(auth.signed_headers.begin(), auth.signed_headers.end(), "host") ==
      auth.signed_headers.end()) {
    return S3Error(presigned ? "AuthorizationQueryParametersError" : "AuthorizationHeaderMalformed",
                   "SignedHeaders must include host");
  }
  for (const std::string& name : auth.signed_headers) {
    bool found = false;
    for (const auto& [k, v] : req.headers) {
      if (k == name) {
        parts.headers.emplace_back(k, v);
        found = true;
      }
    }
    if (!found) {
      return S3Error("SignatureDoesNotMatch",
                     "signed header '" + name + "' is missing from the request");
    }
  }
  parts.payload_hash = c.payload_hash;
  std::string canonical = s3::CanonicalRequest(parts, nullptr);
  std::string scope = s3::CredentialScope(auth.date_stamp, auth.region, auth.service);
  std::string expected = s3::Signature(opts.secret_key, auth.date_stamp, auth.region, auth.service,
                                       s3::StringToSign(auth.amz_date, scope, canonical));
  if (!SecretEquals(expected, auth.signature)) {
    return S3Error("SignatureDoesNotMatch",
                   "The request signature we calculated does not match the signature you provided. "
                   "Check your key and signing method.");
  }
  if (c.payload_hash == s3::kStreamingSigned) {
    c.chunk_seed = auth.signature;
    c.amz_date = auth.amz_date;
    c.date_stamp = auth.date_stamp;
    c.scope = scope;
  }
  return Status::OK();
}

Result<s3::RequestBody> S3Server::Impl::ReadBody(Ctx& c, s3::BodyOptions options) {
  s3::BodyAuth auth;
  auth.payload_hash = c.payload_hash;
  if (c.payload_hash == s3::kStreamingSigned) {
    auth.chunk_seed = c.chunk_seed;
    auth.amz_date = c.amz_date;
    auth.date_stamp = c.date_stamp;
    auth.scope = c.scope;
    auth.secret_key = opts.secret_key;
    auth.region = opts.region;
  }
  bool close = false;
  auto body = s3::ReadRequestBody(c.req, c.body, auth, options, &close);
  if (close) c.resp->close = true;
  return body;
}

Result<Buffer> S3Server::Impl::ReadXmlBody(Ctx& c, bool header_checksums) {
  XSILO_ASSIGN_OR_RETURN(s3::RequestBody body,
                         ReadBody(c, {.limit = kMaxXmlBody, .header_checksums = header_checksums}));
  return std::move(body.bytes);
}

}  // namespace xsilo
