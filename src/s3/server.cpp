#include "xsilo/s3/server.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "s3/crypto.h"
#include "s3/errors.h"
#include "s3/http_server.h"
#include "s3/object_store.h"
#include "s3/sigv4.h"
#include "s3/xml.h"
#include "s3/xml_bodies.h"
#include "xsilo/core/base64.h"
#include "xsilo/s3/errors.h"

namespace xsilo {

using s3::BodyReader;
using s3::HttpRequest;
using s3::HttpResponse;
using s3::Params;
using s3::S3Error;
using s3::StoredObject;

namespace {

constexpr std::string_view kXmlHeader = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
constexpr std::string_view kXmlns = " xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"";
constexpr uint64_t kMaxXmlBody = 4ull << 20;

struct Part {
  Buffer data;
  std::string etag;  // quoted
};

struct Upload {
  std::string bucket;
  std::string key;
  std::string content_type;
  Params user_metadata;
  std::map<int, Part> parts;
};

// One request being served.
struct Ctx {
  const HttpRequest& req;
  BodyReader& body;
  HttpResponse* resp;
  Params query;
  std::string bucket;
  std::string key;
  std::string payload_hash;  // hex or UNSIGNED-PAYLOAD
  std::string request_id;
  bool head = false;

  const std::string* Query(std::string_view name) const {
    for (const auto& [k, v] : query) {
      if (k == name) return &v;
    }
    return nullptr;
  }
  bool HasQuery(std::string_view name) const { return Query(name) != nullptr; }
};

std::string QuotedHex128(const void* data, size_t n, XXH3_state_t* state = nullptr) {
  XXH128_hash_t h = state ? XXH3_128bits_digest(state) : XXH3_128bits(data, n);
  return s3::FormatEtag(h.high64, h.low64);
}

std::string StripQuotes(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

bool ValidBucketName(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) return false;
  }
  return std::isalnum(static_cast<unsigned char>(b.front())) &&
         std::isalnum(static_cast<unsigned char>(b.back()));
}

bool IsLowerHex64(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// Range header -> [start, start+len). 0: no (usable) range, serve all;
// 1: satisfiable; -1: unsatisfiable (416).
int ParseRange(std::string_view h, uint64_t size, uint64_t* start, uint64_t* len) {
  if (h.substr(0, 6) != "bytes=") return 0;
  h.remove_prefix(6);
  if (h.find(',') != std::string_view::npos) return 0;  // multiple ranges: whole object
  size_t dash = h.find('-');
  if (dash == std::string_view::npos) return 0;
  std::string_view a = h.substr(0, dash), b = h.substr(dash + 1);
  auto digits = [](std::string_view s) {
    return !s.empty() && s.size() <= 19 &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (a.empty()) {
    if (!digits(b)) return 0;
    uint64_t n = std::stoull(std::string(b));
    if (n == 0 || size == 0) return -1;
    n = std::min(n, size);
    *start = size - n;
    *len = n;
    return 1;
  }
  if (!digits(a) || (!b.empty() && !digits(b))) return 0;
  uint64_t first = std::stoull(std::string(a));
  uint64_t last = b.empty() ? UINT64_MAX : std::stoull(std::string(b));
  if (last < first) return 0;
  if (first >= size) return -1;
  last = std::min(last, size - 1);
  *start = first;
  *len = last - first + 1;
  return 1;
}

std::vector<Buffer> SliceSegments(const std::vector<Buffer>& segs, uint64_t offset, uint64_t len) {
  std::vector<Buffer> out;
  for (const Buffer& s : segs) {
    if (len == 0) break;
    if (offset >= s.size()) {
      offset -= s.size();
      continue;
    }
    uint64_t n = std::min(len, s.size() - offset);
    out.push_back(s.SliceUnchecked(offset, n));
    len -= n;
    offset = 0;
  }
  return out;
}

}  // namespace

struct S3Server::Impl {
  S3ServerOptions opts;
  std::unique_ptr<s3::ObjectStore> store;
  std::unique_ptr<s3::HttpServer> http;
  std::mutex uploads_mu;
  std::map<std::string, Upload> uploads;
  std::atomic<uint64_t> next_id{1};
  uint64_t id_salt = std::random_device{}();

  void Handle(const HttpRequest& req, BodyReader& body, HttpResponse* resp);
  Status Authenticate(Ctx& c);
  Status Route(Ctx& c);
  void SendError(Ctx& c, const Status& st);
  void SendXml(Ctx& c, int status, std::string xml);

  Result<Buffer> ReadBody(Ctx& c, uint64_t limit, std::string* checksum_b64);

  Status ListBuckets(Ctx& c);
  Status CreateBucket(Ctx& c);
  Status ListObjects(Ctx& c);
  Status DeleteObjects(Ctx& c);
  Status PutObject(Ctx& c);
  Status GetObject(Ctx& c);
  Status CreateUpload(Ctx& c);
  Status UploadPart(Ctx& c);
  Status CompleteUpload(Ctx& c);
  Status AbortUpload(Ctx& c);
};

void S3Server::Impl::SendXml(Ctx& c, int status, std::string xml) {
  c.resp->status = status;
  c.resp->headers.emplace_back("Content-Type", "application/xml");
  c.resp->SetBody(std::string(kXmlHeader) + xml);
}

void S3Server::Impl::SendError(Ctx& c, const Status& st) {
  std::string code = S3ErrorCode(st);
  if (code.empty()) code = "InternalError";
  s3::S3ErrorKind kind = s3::LookupS3Error(code);
  std::string message = st.message();
  if (message.compare(0, code.size() + 2, code + ": ") == 0)
    message = message.substr(code.size() + 2);
  HttpResponse* r = c.resp;
  r->status = kind.http_status;
  // Headers of the failed operation go, except Content-Range (416 keeps "bytes */size").
  Params kept;
  for (auto& kv : r->headers) {
    if (kv.first == "Content-Range") kept.push_back(std::move(kv));
  }
  r->headers = std::move(kept);
  r->headers.emplace_back("x-amz-request-id", c.request_id);
  r->headers.emplace_back("Content-Type", "application/xml");
  std::string xml = std::string(kXmlHeader) + "<Error><Code>" + s3::XmlEscape(code) +
                    "</Code><Message>" + s3::XmlEscape(message) + "</Message>";
  if (!c.bucket.empty()) xml += "<BucketName>" + s3::XmlEscape(c.bucket) + "</BucketName>";
  if (!c.key.empty()) xml += "<Key>" + s3::XmlEscape(c.key) + "</Key>";
  xml += "<Resource>" + s3::XmlEscape(c.req.raw_path) + "</Resource><RequestId>" + c.request_id +
         "</RequestId></Error>";
  if (c.head) {
    r->body.clear();
    r->omit_body = true;
    r->content_length = 0;
  } else {
    r->SetBody(std::move(xml));
  }
}

void S3Server::Impl::Handle(const HttpRequest& req, BodyReader& body, HttpResponse* resp) {
  if (opts.on_request) {
    S3FaultRequest f{req.method, req.raw_path, {}, req.raw_query};
    if (const std::string* r = req.Header("range")) f.range = *r;
    opts.on_request(f);
  }
  char id[32];
  std::snprintf(id, sizeof(id), "%016" PRIX64, next_id.fetch_add(1) ^ id_salt);
  Ctx c{req, body, resp, {}, {}, {}, {}, id, req.method == "HEAD"};
  resp->headers.emplace_back("x-amz-request-id", c.request_id);
  resp->headers.emplace_back("Server", "xsilo-s3d");
  Status st = Route(c);
  if (!st.ok()) SendError(c, st);
}

Status S3Server::Impl::Route(Ctx& c) {
  const HttpRequest& req = c.req;
  if (!s3::ParseQuery(req.raw_query, &c.query)) {
    return S3Error("InvalidURI", "Couldn't parse the specified URI (query).");
  }
  std::string path;
  if (!s3::UriDecode(req.raw_path, &path) || path.empty() || path[0] != '/') {
    return S3Error("InvalidURI", "Couldn't parse the specified URI.");
  }
  // Virtual-hosted style: the bucket is the first label of the Host header.
  bool virtual_host = false;
  if (!opts.virtual_host_domain.empty()) {
    if (const std::string* host = req.Header("host")) {
      std::string h =
          host->substr(0, host->rfind(':') == std::string::npos ? host->size() : host->rfind(':'));
      std::string suffix = "." + opts.virtual_host_domain;
      if (h.size() > suffix.size() &&
          h.compare(h.size() - suffix.size(), suffix.size(), suffix) == 0) {
        c.bucket = h.substr(0, h.size() - suffix.size());
        c.key = path.substr(1);
        virtual_host = true;
      }
    }
  }
  if (!virtual_host) {
    size_t slash = path.find('/', 1);
    c.bucket = path.substr(1, slash == std::string::npos ? std::string::npos : slash - 1);
    c.key = slash == std::string::npos ? std::string() : path.substr(slash + 1);
  }
  if (c.key.size() > 1024) return S3Error("KeyTooLongError", "Your key is too long.");

  XSILO_RETURN_IF_ERROR(Authenticate(c));

  const std::string& m = req.method;
  if (c.bucket.empty()) {
    if (m == "GET") return ListBuckets(c);
    return S3Error("MethodNotAllowed",
                   "The specified method is not allowed against this resource.");
  }
  if (c.key.empty()) {
    if (m == "PUT") return CreateBucket(c);
    if (m == "HEAD") return store->HeadBucket(c.bucket);
    if (m == "DELETE") {
      XSILO_RETURN_IF_ERROR(store->DeleteBucket(c.bucket));
      c.resp->status = 204;
      return Status::OK();
    }
    if (m == "GET" && c.HasQuery("location")) {
      XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
      std::string region = opts.region == "us-east-1" ? "" : s3::XmlEscape(opts.region);
      SendXml(c, 200,
              "<LocationConstraint" + std::string(kXmlns) + ">" + region + "</LocationConstraint>");
      return Status::OK();
    }
    if (m == "GET" && (c.HasQuery("uploads") || c.HasQuery("versioning") || c.HasQuery("acl") ||
                       c.HasQuery("policy") || c.HasQuery("lifecycle"))) {
      return S3Error("NotImplemented", "This bucket subresource is not implemented.");
    }
    if (m == "GET") return ListObjects(c);
    if (m == "POST" && c.HasQuery("delete")) return DeleteObjects(c);
    return S3Error("MethodNotAllowed",
                   "The specified method is not allowed against this resource.");
  }
  if (m == "PUT") {
    if (c.req.Header("x-amz-copy-source"))
      return S3Error("NotImplemented", "CopyObject is not implemented.");
    if (c.HasQuery("uploadId") || c.HasQuery("partNumber")) return UploadPart(c);
    if (c.HasQuery("acl") || c.HasQuery("tagging")) {
      return S3Error("NotImplemented", "This object subresource is not implemented.");
    }
    return PutObject(c);
  }
  if (m == "GET" || m == "HEAD") {
    if (c.HasQuery("uploadId") || c.HasQuery("acl") || c.HasQuery("tagging")) {
      return S3Error("NotImplemented", "This object subresource is not implemented.");
    }
    return GetObject(c);
  }
  if (m == "POST") {
    if (c.HasQuery("uploads")) return CreateUpload(c);
    if (c.HasQuery("uploadId")) return CompleteUpload(c);
    return S3Error("NotImplemented", "This POST request is not implemented.");
  }
  if (m == "DELETE") {
    if (c.HasQuery("uploadId")) return AbortUpload(c);
    XSILO_RETURN_IF_ERROR(store->Delete(c.bucket, c.key));
    c.resp->status = 204;
    return Status::OK();
  }
  return S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.");
}

Status S3Server::Impl::Authenticate(Ctx& c) {
  const HttpRequest& req = c.req;
  const std::string* authz = req.Header("authorization");
  bool presigned = false;
  for (const auto& [k, v] : c.query) presigned |= (k == "X-Amz-Signature");
  if (!authz && !presigned) {
    if (opts.allow_anonymous) {
      c.payload_hash = std::string(s3::kUnsignedPayload);
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
    static const std::string kEmptyHash(s3::kEmptySha256Hex);
    if (!sha && req.content_length == 0) sha = &kEmptyHash;
    if (!sha) {
      return S3Error("InvalidRequest",
                     "Missing required header for this request: x-amz-content-sha256");
    }
    if (sha->rfind("STREAMING-", 0) == 0) {
      return S3Error("NotImplemented",
                     "aws-chunked streaming uploads are not supported; "
                     "send a plain body with x-amz-content-sha256");
    }
    if (*sha != s3::kUnsignedPayload && !IsLowerHex64(*sha)) {
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
    if (auth.expires_seconds < 1 || auth.expires_seconds > opts.max_presign_expiry.count()) {
      return S3Error("AuthorizationQueryParametersError",
                     "X-Amz-Expires must be between 1 and " +
                         std::to_string(opts.max_presign_expiry.count()) + " seconds");
    }
    if (now > signed_at + auth.expires_seconds) {
      return S3Error("AccessDenied", "Request has expired");
    }
    if (signed_at > now + opts.max_clock_skew.count()) {
      return S3Error("AccessDenied", "Request is not valid yet");
    }
    c.payload_hash = std::string(s3::kUnsignedPayload);
    if (const std::string* q = c.Query("X-Amz-Content-Sha256")) c.payload_hash = *q;
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
  if (!s3::SecureEquals(expected, auth.signature)) {
    return S3Error("SignatureDoesNotMatch",
                   "The request signature we calculated does not match the signature you provided. "
                   "Check your key and signing method.");
  }
  return Status::OK();
}

Result<Buffer> S3Server::Impl::ReadBody(Ctx& c, uint64_t limit, std::string* checksum_b64) {
  const HttpRequest& req = c.req;
  if (!req.has_content_length) {
    return S3Error("MissingContentLength", "You must provide the Content-Length HTTP header.");
  }
  if (req.content_length > limit) {
    c.resp->close = true;
    return S3Error("EntityTooLarge", "Your proposed upload exceeds the maximum allowed size (" +
                                         std::to_string(limit) + " bytes).");
  }
  const std::string* md5_b64 = req.Header("content-md5");
  const std::string* sha_b64 = req.Header("x-amz-checksum-sha256");
  std::optional<std::vector<uint8_t>> md5_want, sha_want;
  if (md5_b64) {
    md5_want = Base64Decode(*md5_b64);
    if (!md5_want || md5_want->size() != 16) {
      c.resp->close = true;
      return S3Error("InvalidDigest", "The Content-MD5 you specified is not valid.");
    }
  }
  if (sha_b64) {
    sha_want = Base64Decode(*sha_b64);
    if (!sha_want || sha_want->size() != 32) {
      c.resp->close = true;
      return S3Error("InvalidDigest", "The x-amz-checksum-sha256 you specified is not valid.");
    }
  }
  auto body = c.body.ReadAll();
  if (!body.ok()) {
    c.resp->close = true;
    return S3Error("IncompleteBody",
                   "You did not provide the number of bytes specified by the "
                   "Content-Length HTTP header: " +
                       body.status().message());
  }
  bool check_payload = c.payload_hash != s3::kUnsignedPayload;
  if (check_payload || sha_want) {
    s3::Sha256Digest d = s3::Sha256(body->span());
    if (check_payload && s3::Hex(d) != c.payload_hash) {
      return S3Error(
          "XAmzContentSHA256Mismatch",
          "The provided 'x-amz-content-sha256' header does not match what was computed.");
    }
    if (sha_want && !std::equal(d.begin(), d.end(), sha_want->begin())) {
      return S3Error("BadDigest",
                     "The x-amz-checksum-sha256 you specified did not match the "
                     "calculated checksum.");
    }
    if (sha_b64 && checksum_b64) *checksum_b64 = *sha_b64;
  }
  if (md5_want) {
    s3::Md5Digest d = s3::Md5(body->span());
    if (!std::equal(d.begin(), d.end(), md5_want->begin())) {
      return S3Error("BadDigest", "The Content-MD5 you specified did not match what we received.");
    }
  }
  return body;
}

Status S3Server::Impl::ListBuckets(Ctx& c) {
  XSILO_ASSIGN_OR_RETURN(auto buckets, store->ListBuckets());
  std::string xml = "<ListAllMyBucketsResult" + std::string(kXmlns) +
                    "><Owner><ID>xsilo</ID><DisplayName>xsilo</DisplayName></Owner><Buckets>";
  for (const auto& b : buckets) {
    xml += "<Bucket><Name>" + s3::XmlEscape(b.name) + "</Name><CreationDate>" +
           s3::FormatIsoDate(b.created) + "</CreationDate></Bucket>";
  }
  xml += "</Buckets></ListAllMyBucketsResult>";
  SendXml(c, 200, std::move(xml));
  return Status::OK();
}

Status S3Server::Impl::CreateBucket(Ctx& c) {
  if (!ValidBucketName(c.bucket)) {
    return S3Error("InvalidBucketName", "The specified bucket is not valid.");
  }
  if (c.req.content_length > 0) {
    // An optional CreateBucketConfiguration; its location must be ours.
    XSILO_ASSIGN_OR_RETURN(Buffer body, ReadBody(c, kMaxXmlBody, nullptr));
    auto loc = s3::XmlText(body.view(), "LocationConstraint");
    if (loc && !loc->empty() && *loc != opts.region) {
      return S3Error("InvalidLocationConstraint",
                     "The specified location-constraint is not valid for this server.");
    }
  }
  XSILO_RETURN_IF_ERROR(store->CreateBucket(c.bucket));
  c.resp->headers.emplace_back("Location", "/" + c.bucket);
  return Status::OK();
}

Status S3Server::Impl::ListObjects(Ctx& c) {
  bool v2 = c.Query("list-type") && *c.Query("list-type") == "2";
  auto q = [&](std::string_view n) {
    const std::string* v = c.Query(n);
    return v ? *v : std::string();
  };
  std::string prefix = q("prefix"), delimiter = q("delimiter");
  bool url_encode = q("encoding-type") == "url";
  int64_t max_keys = 1000;
  if (c.HasQuery("max-keys")) {
    std::string mk = q("max-keys");
    if (mk.empty() || mk.size() > 9 ||
        !std::all_of(mk.begin(), mk.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      return S3Error("InvalidArgument", "max-keys must be a non-negative integer");
    }
    max_keys = std::min<int64_t>(std::stoll(mk), 1000);
  }
  std::string after;
  std::string token = q("continuation-token");
  if (v2 && !token.empty()) {
    auto dec = Base64Decode(token);
    if (!dec) return S3Error("InvalidArgument", "The continuation token provided is incorrect");
    after.assign(dec->begin(), dec->end());
  } else if (v2) {
    after = q("start-after");
  } else {
    after = q("marker");
  }
  XSILO_ASSIGN_OR_RETURN(auto entries, store->List(c.bucket, prefix));
  auto enc = [&](const std::string& s) {
    return s3::XmlEscape(url_encode ? s3::UriEncode(s, false) : s);
  };
  std::string contents, prefixes, last;
  int64_t count = 0;
  bool truncated = false;
  std::string last_prefix;
  for (const auto& e : entries) {
    if (!after.empty() && e.key <= after) continue;
    std::string cp;
    if (!delimiter.empty()) {
      size_t pos = e.key.find(delimiter, prefix.size());
      if (pos != std::string::npos) cp = e.key.substr(0, pos + delimiter.size());
    }
    if (!cp.empty() && (cp == last_prefix || (!after.empty() && cp <= after))) continue;
    if (count >= max_keys) {
      truncated = true;
      break;
    }
    ++count;
    if (!cp.empty()) {
      last_prefix = cp;
      last = cp;
      prefixes += "<CommonPrefixes><Prefix>" + enc(cp) + "</Prefix></CommonPrefixes>";
    } else {
      last = e.key;
      contents += "<Contents><Key>" + enc(e.key) + "</Key><LastModified>" +
                  s3::FormatIsoDate(e.mtime) + "</LastModified><ETag>" + s3::XmlEscape(e.etag) +
                  "</ETag><Size>" + std::to_string(e.size) +
                  "</Size><StorageClass>STANDARD</StorageClass></Contents>";
    }
  }
  std::string xml = "<ListBucketResult" + std::string(kXmlns) + "><Name>" +
                    s3::XmlEscape(c.bucket) + "</Name><Prefix>" + enc(prefix) + "</Prefix>";
  if (v2) {
    xml += "<KeyCount>" + std::to_string(count) + "</KeyCount>";
    if (!token.empty())
      xml += "<ContinuationToken>" + s3::XmlEscape(token) + "</ContinuationToken>";
    if (c.HasQuery("start-after")) xml += "<StartAfter>" + enc(q("start-after")) + "</StartAfter>";
  } else {
    xml += "<Marker>" + enc(q("marker")) + "</Marker>";
  }
  xml += "<MaxKeys>" + std::to_string(max_keys) + "</MaxKeys>";
  if (!delimiter.empty()) xml += "<Delimiter>" + enc(delimiter) + "</Delimiter>";
  if (url_encode) xml += "<EncodingType>url</EncodingType>";
  xml += std::string("<IsTruncated>") + (truncated ? "true" : "false") + "</IsTruncated>";
  if (truncated) {
    if (v2) {
      xml += "<NextContinuationToken>" +
             Base64Encode({reinterpret_cast<const uint8_t*>(last.data()), last.size()}) +
             "</NextContinuationToken>";
    } else {
      xml += "<NextMarker>" + enc(last) + "</NextMarker>";
    }
  }
  xml += contents + prefixes + "</ListBucketResult>";
  SendXml(c, 200, std::move(xml));
  return Status::OK();
}

Status S3Server::Impl::DeleteObjects(Ctx& c) {
  XSILO_ASSIGN_OR_RETURN(Buffer body, ReadBody(c, kMaxXmlBody, nullptr));
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  std::string_view doc = body.view();
  bool quiet = s3::XmlText(doc, "Quiet").value_or("") == "true";
  std::string xml = "<DeleteResult" + std::string(kXmlns) + ">";
  bool any = false;
  Status failure;
  s3::XmlForEach(doc, "Object", [&](std::string_view obj) {
    auto key = s3::XmlText(obj, "Key");
    if (!key) return;
    any = true;
    Status st = store->Delete(c.bucket, *key);
    if (st.ok()) {
      if (!quiet) xml += "<Deleted><Key>" + s3::XmlEscape(*key) + "</Key></Deleted>";
    } else {
      xml += "<Error><Key>" + s3::XmlEscape(*key) + "</Key><Code>" + S3ErrorCode(st) +
             "</Code><Message>" + s3::XmlEscape(st.message()) + "</Message></Error>";
    }
  });
  if (!any) return S3Error("MalformedXML", "The XML you provided was not well-formed.");
  xml += "</DeleteResult>";
  SendXml(c, 200, std::move(xml));
  return Status::OK();
}

namespace {
Params UserMetadata(const HttpRequest& req) {
  Params out;
  for (const auto& [k, v] : req.headers) {
    if (k.rfind("x-amz-meta-", 0) == 0) out.emplace_back(k, v);
  }
  return out;
}
}  // namespace

Status S3Server::Impl::PutObject(Ctx& c) {
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  StoredObject obj;
  XSILO_ASSIGN_OR_RETURN(Buffer body, ReadBody(c, opts.max_object_bytes, &obj.checksum_sha256));
  obj.size = body.size();
  obj.etag = QuotedHex128(body.data(), body.size());
  obj.mtime = std::time(nullptr);
  if (const std::string* ct = c.req.Header("content-type")) obj.content_type = *ct;
  obj.user_metadata = UserMetadata(c.req);
  if (!body.empty()) obj.segments.push_back(std::move(body));
  std::string etag = obj.etag, checksum = obj.checksum_sha256;
  XSILO_RETURN_IF_ERROR(store->Put(c.bucket, c.key, std::move(obj)));
  c.resp->headers.emplace_back("ETag", etag);
  if (!checksum.empty()) c.resp->headers.emplace_back("x-amz-checksum-sha256", checksum);
  return Status::OK();
}

Status S3Server::Impl::GetObject(Ctx& c) {
  XSILO_ASSIGN_OR_RETURN(StoredObject obj, store->Get(c.bucket, c.key));
  HttpResponse* r = c.resp;
  r->headers.emplace_back("Content-Type", obj.content_type);
  r->headers.emplace_back("ETag", obj.etag);
  r->headers.emplace_back("Last-Modified", s3::FormatHttpDate(obj.mtime));
  r->headers.emplace_back("Accept-Ranges", "bytes");
  for (const auto& kv : obj.user_metadata) r->headers.push_back(kv);
  const std::string* range = c.req.Header("range");
  uint64_t start = 0, len = obj.size;
  int rr = range ? ParseRange(*range, obj.size, &start, &len) : 0;
  if (rr < 0) {
    c.resp->headers.emplace_back("Content-Range", "bytes */" + std::to_string(obj.size));
    return S3Error("InvalidRange", "The requested range is not satisfiable");
  }
  if (rr > 0) {
    r->status = 206;
    r->headers.emplace_back("Content-Range", "bytes " + std::to_string(start) + "-" +
                                                 std::to_string(start + len - 1) + "/" +
                                                 std::to_string(obj.size));
  } else if (!obj.checksum_sha256.empty()) {
    // A whole-object checksum describes only the whole object.
    r->headers.emplace_back("x-amz-checksum-sha256", obj.checksum_sha256);
  }
  if (c.head) {
    r->omit_body = true;
    r->content_length = len;
  } else {
    r->SetBody(rr > 0 ? SliceSegments(obj.segments, start, len) : std::move(obj.segments));
  }
  return Status::OK();
}

Status S3Server::Impl::CreateUpload(Ctx& c) {
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  Upload u;
  u.bucket = c.bucket;
  u.key = c.key;
  if (const std::string* ct = c.req.Header("content-type")) u.content_type = *ct;
  u.user_metadata = UserMetadata(c.req);
  std::mt19937_64 rng(std::random_device{}());
  char id[64];
  std::snprintf(id, sizeof(id), "%016" PRIx64 "%016" PRIx64, rng(), next_id.fetch_add(1));
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    uploads.emplace(id, std::move(u));
  }
  SendXml(c, 200,
          "<InitiateMultipartUploadResult" + std::string(kXmlns) + "><Bucket>" +
              s3::XmlEscape(c.bucket) + "</Bucket><Key>" + s3::XmlEscape(c.key) +
              "</Key><UploadId>" + id + "</UploadId></InitiateMultipartUploadResult>");
  return Status::OK();
}

Status S3Server::Impl::UploadPart(Ctx& c) {
  const std::string* id = c.Query("uploadId");
  const std::string* pn = c.Query("partNumber");
  if (!id || !pn) return S3Error("InvalidRequest", "uploadId and partNumber are both required");
  int part = 0;
  if (pn->empty() || pn->size() > 5 ||
      !std::all_of(pn->begin(), pn->end(), [](char ch) { return ch >= '0' && ch <= '9'; }) ||
      (part = std::stoi(*pn)) < 1 || part > 10000) {
    return S3Error("InvalidArgument",
                   "Part number must be an integer between 1 and 10000, inclusive");
  }
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(*id);
    if (it == uploads.end() || it->second.bucket != c.bucket || it->second.key != c.key) {
      c.resp->close = c.req.content_length > 0;
      return S3Error("NoSuchUpload", "The specified upload does not exist.");
    }
  }
  XSILO_ASSIGN_OR_RETURN(Buffer body, ReadBody(c, opts.max_part_bytes, nullptr));
  std::string etag = QuotedHex128(body.data(), body.size());
  std::lock_guard<std::mutex> lock(uploads_mu);
  auto it = uploads.find(*id);
  if (it == uploads.end()) return S3Error("NoSuchUpload", "The specified upload was aborted.");
  it->second.parts[part] = Part{std::move(body), etag};
  c.resp->headers.emplace_back("ETag", etag);
  return Status::OK();
}

Status S3Server::Impl::CompleteUpload(Ctx& c) {
  const std::string& id = *c.Query("uploadId");
  XSILO_ASSIGN_OR_RETURN(Buffer body, ReadBody(c, kMaxXmlBody, nullptr));
  auto parsed = s3::ParseCompleteMultipartUpload(body.view());
  if (!parsed.ok()) {
    return S3Error("MalformedXML", "The XML you provided was not well-formed or did not validate.");
  }
  std::vector<std::pair<int, std::string>> listed;
  for (auto& p : *parsed) listed.emplace_back(p.number, std::move(p.etag));
  StoredObject obj;
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(id);
    if (it == uploads.end() || it->second.bucket != c.bucket || it->second.key != c.key) {
      return S3Error("NoSuchUpload", "The specified upload does not exist.");
    }
    Upload& u = it->second;
    std::string etags;
    for (size_t i = 0; i < listed.size(); ++i) {
      auto [num, etag] = listed[i];
      if (i > 0 && num <= listed[i - 1].first) {
        return S3Error("InvalidPartOrder", "The list of parts was not in ascending order.");
      }
      auto p = u.parts.find(num);
      if (p == u.parts.end() || StripQuotes(p->second.etag) != etag) {
        return S3Error("InvalidPart", "Part " + std::to_string(num) +
                                          " was not uploaded or its ETag does not match.");
      }
      if (i + 1 < listed.size() && p->second.data.size() < opts.min_part_bytes) {
        return S3Error("EntityTooSmall", "Part " + std::to_string(num) +
                                             " is smaller than the minimum allowed size.");
      }
      obj.size += p->second.data.size();
      etags += StripQuotes(p->second.etag);
    }
    if (obj.size > opts.max_object_bytes) {
      return S3Error("EntityTooLarge", "The completed object exceeds the maximum allowed size.");
    }
    for (const auto& [num, etag] : listed) {
      Buffer& data = u.parts[num].data;
      if (!data.empty()) obj.segments.push_back(std::move(data));
    }
    std::string e = QuotedHex128(etags.data(), etags.size());
    obj.etag = e.substr(0, e.size() - 1) + "-" + std::to_string(listed.size()) + "\"";
    obj.content_type = u.content_type.empty() ? obj.content_type : u.content_type;
    obj.user_metadata = std::move(u.user_metadata);
    uploads.erase(it);
  }
  obj.mtime = std::time(nullptr);
  std::string etag = obj.etag;
  XSILO_RETURN_IF_ERROR(store->Put(c.bucket, c.key, std::move(obj)));
  SendXml(c, 200,
          "<CompleteMultipartUploadResult" + std::string(kXmlns) + "><Location>/" +
              s3::XmlEscape(c.bucket) + "/" + s3::XmlEscape(c.key) + "</Location><Bucket>" +
              s3::XmlEscape(c.bucket) + "</Bucket><Key>" + s3::XmlEscape(c.key) + "</Key><ETag>" +
              s3::XmlEscape(etag) + "</ETag></CompleteMultipartUploadResult>");
  return Status::OK();
}

Status S3Server::Impl::AbortUpload(Ctx& c) {
  const std::string& id = *c.Query("uploadId");
  Upload dead;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(id);
    if (it == uploads.end() || it->second.bucket != c.bucket || it->second.key != c.key) {
      return S3Error("NoSuchUpload", "The specified upload does not exist.");
    }
    dead = std::move(it->second);
    uploads.erase(it);
  }
  c.resp->status = 204;
  return Status::OK();
}

Result<std::unique_ptr<S3Server>> S3Server::Start(S3ServerOptions options) {
  if (!options.allow_anonymous && (options.access_key.empty() || options.secret_key.empty())) {
    return InvalidArgument("S3Server: access_key and secret_key are required (or allow_anonymous)");
  }
  if (options.region.empty()) return InvalidArgument("S3Server: region must not be empty");
  if (options.max_connections < 1) return InvalidArgument("S3Server: max_connections must be >= 1");
  auto impl = std::make_unique<Impl>();
  impl->opts = std::move(options);
  if (impl->opts.directory.empty()) {
    impl->store = s3::NewMemoryObjectStore();
  } else {
    XSILO_ASSIGN_OR_RETURN(impl->store, s3::NewDirectoryObjectStore(impl->opts.directory));
  }
  for (const std::string& b : impl->opts.buckets) {
    if (!ValidBucketName(b)) return InvalidArgument("S3Server: invalid bucket name " + b);
    Status st = impl->store->CreateBucket(b);
    if (!st.ok() && S3ErrorCode(st) != "BucketAlreadyOwnedByYou") return st;
  }
  s3::HttpServerOptions ho;
  ho.host = impl->opts.host;
  ho.port = impl->opts.port;
  ho.max_header_bytes = impl->opts.max_header_bytes;
  ho.max_connections = impl->opts.max_connections;
  ho.idle_timeout = impl->opts.idle_timeout;
  ho.io_timeout = impl->opts.io_timeout;
  if (impl->opts.fault_drop_after_body_bytes) {
    auto hook = impl->opts.fault_drop_after_body_bytes;
    ho.drop_after_body_bytes = [hook](const HttpRequest& req) {
      S3FaultRequest f{req.method, req.raw_path, {}};
      if (const std::string* r = req.Header("range")) f.range = *r;
      return hook(f);
    };
  }
  ho.format_error = [](int status, std::string_view message) {
    std::string code = status == 431   ? "RequestHeaderSectionTooLarge"
                       : status == 501 ? "NotImplemented"
                                       : "BadRequest";
    return std::pair<std::string, std::string>(
        "application/xml", std::string(kXmlHeader) + "<Error><Code>" + code + "</Code><Message>" +
                               s3::XmlEscape(message) + "</Message></Error>");
  };
  Impl* raw = impl.get();
  impl->http = std::make_unique<s3::HttpServer>(
      std::move(ho), [raw](const HttpRequest& req, BodyReader& body, HttpResponse* resp) {
        raw->Handle(req, body, resp);
      });
  XSILO_RETURN_IF_ERROR(impl->http->Start());
  return std::unique_ptr<S3Server>(new S3Server(std::move(impl)));
}

S3Server::S3Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
S3Server::~S3Server() { Stop(); }
int S3Server::port() const { return impl_->http->port(); }
std::string S3Server::endpoint() const {
  std::string host = impl_->opts.host == "0.0.0.0" ? "127.0.0.1" : impl_->opts.host;
  return "http://" + host + ":" + std::to_string(port());
}
void S3Server::Stop() { impl_->http->Stop(); }

Status PutObjectInDirectory(const std::string& directory, const std::string& bucket,
                            const std::string& key, const GatherList& body) {
  if (directory.empty()) return InvalidArgument("PutObjectInDirectory: empty directory");
  if (key.empty() || key.size() > 1024) return InvalidArgument("invalid object key");
  XSILO_ASSIGN_OR_RETURN(auto store, s3::NewDirectoryObjectStore(directory));
  StoredObject obj;  // the ETag is computed while the bytes are written
  obj.size = body.size;
  for (const Buffer& b : body.segments) {
    if (!b.empty()) obj.segments.push_back(b);
  }
  obj.mtime = std::time(nullptr);
  return store->Put(bucket, key, std::move(obj));
}

Result<Buffer> GetObjectFromDirectory(const std::string& directory, const std::string& bucket,
                                      const std::string& key) {
  if (directory.empty()) return InvalidArgument("GetObjectFromDirectory: empty directory");
  if (key.empty() || key.size() > 1024) return InvalidArgument("invalid object key");
  XSILO_ASSIGN_OR_RETURN(auto store, s3::NewDirectoryObjectStore(directory));
  XSILO_ASSIGN_OR_RETURN(StoredObject obj, store->Get(bucket, key));
  if (obj.segments.empty()) return Buffer();
  return obj.segments.front();  // the directory store maps the whole file
}

}  // namespace xsilo
