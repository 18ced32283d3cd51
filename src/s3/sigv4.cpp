#include "s3/sigv4.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace xsilo::s3 {

namespace {
bool Unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}
std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
}  // namespace

std::string UriEncode(std::string_view s, bool encode_slash) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() + s.size() / 2);
  for (unsigned char c : s) {
    if (Unreserved(c) || (c == '/' && !encode_slash)) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kDigits[c >> 4]);
      out.push_back(kDigits[c & 15]);
    }
  }
  return out;
}

bool UriDecode(std::string_view s, std::string* out) {
  out->clear();
  out->reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out->push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) return false;
    int hi = net::HexValue(s[i + 1]), lo = net::HexValue(s[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

std::string CanonicalQuery(const Params& query, std::string_view skip) {
  std::vector<std::pair<std::string, std::string>> enc;
  enc.reserve(query.size());
  for (const auto& [k, v] : query) {
    if (!skip.empty() && k == skip) continue;
    enc.emplace_back(UriEncode(k), UriEncode(v));
  }
  std::sort(enc.begin(), enc.end());
  std::string out;
  for (const auto& [k, v] : enc) {
    if (!out.empty()) out.push_back('&');
    out += k;
    out.push_back('=');
    out += v;
  }
  return out;
}

bool ParseQuery(std::string_view raw, Params* out) {
  out->clear();
  while (!raw.empty()) {
    size_t amp = raw.find('&');
    std::string_view item = raw.substr(0, amp);
    raw = amp == std::string_view::npos ? std::string_view() : raw.substr(amp + 1);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    std::string k, v;
    if (!UriDecode(item.substr(0, eq), &k)) return false;
    if (eq != std::string_view::npos && !UriDecode(item.substr(eq + 1), &v)) return false;
    out->emplace_back(std::move(k), std::move(v));
  }
  return true;
}

std::string FormatAmzDate(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string FormatDateStamp(std::time_t t) { return FormatAmzDate(t).substr(0, 8); }

bool ParseAmzDate(std::string_view s, std::time_t* out) {
  if (s.size() != 16 || s[8] != 'T' || s[15] != 'Z') return false;
  for (size_t i = 0; i < 15; ++i) {
    if (i == 8) continue;
    if (s[i] < '0' || s[i] > '9') return false;
  }
  auto num = [&](size_t pos, size_t len) {
    int v = 0;
    for (size_t i = 0; i < len; ++i) v = v * 10 + (s[pos + i] - '0');
    return v;
  };
  std::tm tm{};
  tm.tm_year = num(0, 4) - 1900;
  tm.tm_mon = num(4, 2) - 1;
  tm.tm_mday = num(6, 2);
  tm.tm_hour = num(9, 2);
  tm.tm_min = num(11, 2);
  tm.tm_sec = num(13, 2);
  if (tm.tm_mon > 11 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 || tm.tm_min > 59 ||
      tm.tm_sec > 60) {
    return false;
  }
  *out = timegm(&tm);
  return true;
}

bool ParseHttpDate(std::string_view s, std::time_t* out) {
  std::string text(s);
  for (const char* format : {"%a, %d %b %Y %H:%M:%S GMT", "%A, %d-%b-%y %H:%M:%S GMT",
                             "%a %b %e %H:%M:%S %Y", "%Y-%m-%dT%H:%M:%S"}) {
    std::tm tm{};
    const char* end = strptime(text.c_str(), format, &tm);
    if (end == nullptr) continue;
    std::string_view rest(end);
    if (format[1] == 'Y') {  // ISO 8601: optional fraction, then Z
      if (!rest.empty() && rest[0] == '.') {
        rest.remove_prefix(1);
        while (!rest.empty() && rest[0] >= '0' && rest[0] <= '9') rest.remove_prefix(1);
      }
      if (rest != "Z" && rest != "+00:00") continue;
    } else if (!rest.empty()) {
      continue;
    }
    *out = timegm(&tm);
    return true;
  }
  return false;
}

std::string FormatHttpDate(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[tm.tm_wday],
                tm.tm_mday, kMonths[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min,
                tm.tm_sec);
  return buf;
}

std::string FormatIsoDate(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S.000Z", &tm);
  return buf;
}

std::string CanonicalHeaderValue(std::string_view v) {
  v = net::TrimOws(v);
  std::string out;
  out.reserve(v.size());
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = true;
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

std::string CanonicalRequest(const CanonicalRequestParts& parts, std::string* signed_headers) {
  Params headers = parts.headers;
  for (auto& [k, v] : headers) {
    std::transform(k.begin(), k.end(), k.begin(), [](unsigned char c) { return std::tolower(c); });
    v = CanonicalHeaderValue(v);
  }
  std::stable_sort(headers.begin(), headers.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  out.reserve(256);
  out += parts.method;
  out += '\n';
  out += parts.canonical_uri;
  out += '\n';
  out += parts.canonical_query;
  out += '\n';
  std::string names;
  for (size_t i = 0; i < headers.size(); ++i) {
    // Repeated headers join their values with commas.
    if (i > 0 && headers[i].first == headers[i - 1].first) {
      out.pop_back();
      out += ',';
      out += headers[i].second;
      out += '\n';
      continue;
    }
    out += headers[i].first;
    out += ':';
    out += headers[i].second;
    out += '\n';
    if (!names.empty()) names += ';';
    names += headers[i].first;
  }
  out += '\n';
  out += names;
  out += '\n';
  out += parts.payload_hash;
  if (signed_headers) *signed_headers = std::move(names);
  return out;
}

std::string CredentialScope(std::string_view date_stamp, std::string_view region,
                            std::string_view service) {
  std::string s;
  s += date_stamp;
  s += '/';
  s += region;
  s += '/';
  s += service;
  s += "/aws4_request";
  return s;
}

std::string StringToSign(std::string_view amz_date, std::string_view scope,
                         std::string_view canonical_request) {
  std::string s;
  s += kSigV4Algorithm;
  s += '\n';
  s += amz_date;
  s += '\n';
  s += scope;
  s += '\n';
  s += net::Hex(net::Sha256(canonical_request));
  return s;
}

net::Sha256Digest SigningKey(std::string_view secret_key, std::string_view date_stamp,
                             std::string_view region, std::string_view service) {
  std::string k0 = "AWS4";
  k0 += secret_key;
  net::Sha256Digest k = net::HmacSha256(Bytes(k0), date_stamp);
  k = net::HmacSha256(k, region);
  k = net::HmacSha256(k, service);
  return net::HmacSha256(k, "aws4_request");
}

std::string Signature(std::string_view secret_key, std::string_view date_stamp,
                      std::string_view region, std::string_view service,
                      std::string_view string_to_sign) {
  return net::Hex(
      net::HmacSha256(SigningKey(secret_key, date_stamp, region, service), string_to_sign));
}

std::string RedactUrl(std::string_view url) {
  const size_t q = url.find_first_of("?#");
  if (q == std::string_view::npos) return std::string(url);
  return std::string(url.substr(0, q)) + "?<signed query redacted>";
}

std::string RedactSignedQuery(std::string_view text) {
  static constexpr std::string_view kNames[] = {
      "x-amz-signature=", "x-amz-credential=", "x-amz-security-token="};
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    size_t next = std::string::npos;
    size_t name_len = 0;
    for (std::string_view name : kNames) {
      const size_t f = lower.find(name, at);
      if (f < next) {
        next = f;
        name_len = name.size();
      }
    }
    if (next == std::string::npos) break;
    const size_t value = next + name_len;
    size_t end = value;
    while (end < text.size() &&
           std::string_view("&# \t\r\n\"'<>)").find(text[end]) == std::string_view::npos) {
      ++end;
    }
    out.append(text.substr(at, value - at));
    out += "REDACTED";
    at = end;
  }
  out.append(text.substr(std::min(at, text.size())));
  return out;
}

namespace {
Status ParseCredential(std::string_view cred, SigV4Auth* out) {
  // AK/date/region/service/aws4_request; the access key itself has no '/'.
  std::vector<std::string_view> parts;
  while (true) {
    size_t slash = cred.find('/');
    parts.push_back(cred.substr(0, slash));
    if (slash == std::string_view::npos) break;
    cred.remove_prefix(slash + 1);
  }
  if (parts.size() != 5 || parts[4] != "aws4_request" || parts[0].empty() || parts[1].size() != 8) {
    return InvalidArgument("AuthorizationHeaderMalformed: bad Credential");
  }
  out->access_key = parts[0];
  out->date_stamp = parts[1];
  out->region = parts[2];
  out->service = parts[3];
  return Status::OK();
}
std::vector<std::string> SplitSemicolons(std::string_view s) {
  std::vector<std::string> v;
  while (!s.empty()) {
    size_t p = s.find(';');
    std::string name(net::TrimOws(s.substr(0, p)));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (!name.empty()) v.push_back(std::move(name));
    if (p == std::string_view::npos) break;
    s.remove_prefix(p + 1);
  }
  return v;
}
}  // namespace

Status ParseAuthorizationHeader(std::string_view value, SigV4Auth* out) {
  *out = SigV4Auth{};
  value = net::TrimOws(value);
  if (value.substr(0, kSigV4Algorithm.size()) != kSigV4Algorithm) {
    return InvalidArgument("AuthorizationHeaderMalformed: only AWS4-HMAC-SHA256 is supported");
  }
  value.remove_prefix(kSigV4Algorithm.size());
  bool have_cred = false, have_signed = false, have_sig = false;
  while (!value.empty()) {
    size_t comma = value.find(',');
    std::string_view item = net::TrimOws(value.substr(0, comma));
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) continue;
    std::string_view k = net::TrimOws(item.substr(0, eq)), v = net::TrimOws(item.substr(eq + 1));
    if (k == "Credential") {
      XSILO_RETURN_IF_ERROR(ParseCredential(v, out));
      have_cred = true;
    } else if (k == "SignedHeaders") {
      out->signed_headers = SplitSemicolons(v);
      have_signed = true;
    } else if (k == "Signature") {
      out->signature = std::string(v);
      have_sig = true;
    }
  }
  if (!have_cred || !have_signed || !have_sig) {
    return InvalidArgument(
        "AuthorizationHeaderMalformed: missing Credential/SignedHeaders/Signature");
  }
  return Status::OK();
}

Status ParsePresignedQuery(const Params& query, SigV4Auth* out) {
  *out = SigV4Auth{};
  out->presigned = true;
  std::string algorithm;
  bool have_cred = false, have_expires = false;
  for (const auto& [k, v] : query) {
    if (k == "X-Amz-Algorithm") {
      algorithm = v;
    } else if (k == "X-Amz-Credential") {
      XSILO_RETURN_IF_ERROR(ParseCredential(v, out));
      have_cred = true;
    } else if (k == "X-Amz-SignedHeaders") {
      out->signed_headers = SplitSemicolons(v);
    } else if (k == "X-Amz-Signature") {
      out->signature = v;
    } else if (k == "X-Amz-Date") {
      out->amz_date = v;
    } else if (k == "X-Amz-Expires") {
      auto digits = [](std::string_view d) {
        return !d.empty() &&
               std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
      };
      if (v.size() > 1 && v[0] == '-' && digits(v.substr(1))) {
        return InvalidArgument(
            "AuthorizationQueryParametersError: X-Amz-Expires must be non-negative");
      }
      if (!digits(v)) {
        return InvalidArgument(
            "AuthorizationQueryParametersError: X-Amz-Expires should be a number");
      }
      if (v.size() > 9) {  // beyond any maximum; keeps the conversion in range
        return InvalidArgument(
            "AuthorizationQueryParametersError: X-Amz-Expires must be less than a week (in "
            "seconds); that is, the given X-Amz-Expires must be less than 604800 seconds");
      }
      out->expires_seconds = std::stoll(v);
      have_expires = true;
    }
  }
  if (algorithm != kSigV4Algorithm || !have_cred || !have_expires || out->signature.empty() ||
      out->amz_date.empty() || out->signed_headers.empty()) {
    return InvalidArgument(
        "AuthorizationQueryParametersError: X-Amz-Algorithm, X-Amz-Credential, X-Amz-Date, "
        "X-Amz-Expires, X-Amz-SignedHeaders and X-Amz-Signature are required");
  }
  return Status::OK();
}

}  // namespace xsilo::s3
