// SigV4: the headers of every request, and the query string of presigned
// URLs.
#include "s3/client_internal.h"

namespace xsilo {

using s3::Params;
using namespace s3client;

Result<SignedRequest> S3Client::Impl::Sign(const Call& call) const {
  XSILO_ASSIGN_OR_RETURN(S3Credentials creds, opts.credentials->Get());
  std::string host, path;
  Locate(call.bucket, call.key, &host, &path);
  std::string query = s3::CanonicalQuery(call.query);
  SignedRequest out;
  out.url = endpoint.scheme + "://" + host + path + (query.empty() ? "" : "?" + query);

  std::string payload_hash;
  if (call.body == nullptr && !call.has_text_body) {
    payload_hash = std::string(net::kEmptySha256Hex);
  } else if (opts.sign_payload || call.has_text_body) {
    payload_hash =
        call.body ? net::Hex(Sha256Of(*call.body)) : net::Hex(net::Sha256(call.text_body));
  } else {
    payload_hash = std::string(s3::kUnsignedPayload);
  }
  std::time_t now = std::time(nullptr);
  std::string amz_date = s3::FormatAmzDate(now);
  std::string date = amz_date.substr(0, 8);
  s3::CanonicalRequestParts parts;
  parts.method = call.method;
  parts.canonical_uri = path;
  parts.canonical_query = query;
  parts.headers = {
      {"host", host}, {"x-amz-date", amz_date}, {"x-amz-content-sha256", payload_hash}};
  if (!creds.session_token.empty())
    parts.headers.emplace_back("x-amz-security-token", creds.session_token);
  for (const auto& kv : call.headers) parts.headers.push_back(kv);
  parts.payload_hash = payload_hash;
  std::string signed_headers;
  std::string creq = s3::CanonicalRequest(parts, &signed_headers);
  std::string scope = s3::CredentialScope(date, opts.region, "s3");
  std::string sig = s3::Signature(creds.secret_access_key, date, opts.region, "s3",
                                  s3::StringToSign(amz_date, scope, creq));
  out.headers = std::move(parts.headers);
  out.headers.emplace_back("Authorization", "AWS4-HMAC-SHA256 Credential=" + creds.access_key_id +
                                                "/" + scope + ", SignedHeaders=" + signed_headers +
                                                ", Signature=" + sig);
  return out;
}

Result<std::string> S3Client::PresignUrl(const PresignArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  XSILO_ASSIGN_OR_RETURN(S3Credentials creds, impl_->opts.credentials->Get());
  std::string host, path;
  impl_->Locate(args.bucket, args.key, &host, &path);
  std::time_t at = args.signing_time ? args.signing_time : std::time(nullptr);
  std::string amz_date = s3::FormatAmzDate(at);
  std::string date = amz_date.substr(0, 8);
  std::string scope = s3::CredentialScope(date, impl_->opts.region, "s3");
  Params q = {{"X-Amz-Algorithm", std::string(s3::kSigV4Algorithm)},
              {"X-Amz-Credential", creds.access_key_id + "/" + scope},
              {"X-Amz-Date", amz_date},
              {"X-Amz-Expires", std::to_string(args.expires.count())},
              {"X-Amz-SignedHeaders", "host"}};
  if (!creds.session_token.empty()) q.emplace_back("X-Amz-Security-Token", creds.session_token);
  for (const auto& kv : args.query) q.push_back(kv);
  s3::CanonicalRequestParts parts;
  parts.method = args.method;
  parts.canonical_uri = path;
  parts.canonical_query = s3::CanonicalQuery(q);
  parts.headers = {{"host", host}};
  parts.payload_hash = std::string(s3::kUnsignedPayload);
  std::string creq = s3::CanonicalRequest(parts, nullptr);
  std::string sig = s3::Signature(creds.secret_access_key, date, impl_->opts.region, "s3",
                                  s3::StringToSign(amz_date, scope, creq));
  return impl_->endpoint.scheme + "://" + host + path + "?" + parts.canonical_query +
         "&X-Amz-Signature=" + sig;
}

}  // namespace xsilo
