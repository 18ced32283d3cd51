// libFuzzer target: the SigV4 parsers the embedded S3 server runs on every
// request before it checks a signature: the Authorization header
// (ParseAuthorizationHeader) and the presigned query (ParseQuery, then
// ParsePresignedQuery). The input is "header\nquery". Whatever parses
// must be written back in the canonical form and parse to the same fields;
// a query that parses must re-encode to the same parameters.
#include <cstdint>
#include <string>
#include <string_view>

#include "s3/sigv4.h"

namespace s3 = xsilo::s3;

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

bool Same(const s3::SigV4Auth& a, const s3::SigV4Auth& b) {
  return a.access_key == b.access_key && a.date_stamp == b.date_stamp && a.region == b.region &&
         a.service == b.service && a.signed_headers == b.signed_headers &&
         a.signature == b.signature && a.amz_date == b.amz_date &&
         a.expires_seconds == b.expires_seconds && a.presigned == b.presigned;
}

std::string Credential(const s3::SigV4Auth& a) {
  return a.access_key + "/" + a.date_stamp + "/" + a.region + "/" + a.service + "/aws4_request";
}

std::string Joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& h : v) s += (s.empty() ? "" : ";") + h;
  return s;
}

std::string Encode(const s3::Params& params) {
  std::string s;
  for (const auto& [k, v] : params) {
    if (!s.empty()) s += '&';
    s += s3::UriEncode(k) + "=" + s3::UriEncode(v);
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  std::string_view header = in.substr(0, nl);
  std::string_view query = nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);

  s3::SigV4Auth a, b;
  if (s3::ParseAuthorizationHeader(header, &a).ok()) {
    Check(!a.access_key.empty() && a.access_key.find('/') == std::string::npos);
    Check(a.date_stamp.size() == 8 && !a.presigned);
    std::string written = std::string(s3::kSigV4Algorithm) + " Credential=" + Credential(a) +
                          ", SignedHeaders=" + Joined(a.signed_headers) +
                          ", Signature=" + a.signature;
    Check(s3::ParseAuthorizationHeader(written, &b).ok());
    Check(Same(a, b));
  }

  s3::Params params, again;
  if (!s3::ParseQuery(query, &params)) return 0;
  Check(s3::ParseQuery(Encode(params), &again) && again == params);
  if (s3::ParsePresignedQuery(params, &a).ok()) {
    Check(a.presigned && a.expires_seconds >= 0 && !a.signed_headers.empty());
    s3::Params canonical = {{"X-Amz-Algorithm", std::string(s3::kSigV4Algorithm)},
                            {"X-Amz-Credential", Credential(a)},
                            {"X-Amz-Date", a.amz_date},
                            {"X-Amz-Expires", std::to_string(a.expires_seconds)},
                            {"X-Amz-SignedHeaders", Joined(a.signed_headers)},
                            {"X-Amz-Signature", a.signature}};
    Check(s3::ParseQuery(Encode(canonical), &again));
    Check(s3::ParsePresignedQuery(again, &b).ok());
    Check(Same(a, b));
  }
  return 0;
}
