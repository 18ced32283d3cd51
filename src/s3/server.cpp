#include "xsilo/s3/server.h"

#include "core/xxh3.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "s3/crypto.h"
#include "s3/errors.h"
#include "s3/http_server.h"
#include "s3/object_store.h"
#include "s3/request_body.h"
#include "s3/sigv4.h"
#include "s3/tls.h"
#include "s3/xml.h"
#include "s3/xml_bodies.h"
#include "xsilo/core/base64.h"
#include "xsilo/s3/errors.h"

namespace xsilo {

using s3::BodyReader;
using s3::HttpRequest;
using s3::HttpResponse;
using s3::ObjectEntry;
using s3::Params;
using s3::PutCondition;
using s3::S3Error;
using s3::StoredObject;

namespace {

constexpr std::string_view kXmlHeader = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
constexpr std::string_view kXmlns = " xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"";
constexpr uint64_t kMaxXmlBody = 4ull << 20;

struct Part {
  std::vector<Buffer> segments;  // one Buffer for UploadPart, slices for UploadPartCopy
  uint64_t size = 0;
  std::string etag;  // quoted
  std::time_t mtime = 0;
  std::string checksum_algorithm, checksum;  // as UploadPart verified or computed them
};

struct Upload {
  std::string bucket;
  std::string key;
  std::string content_type;
  Params user_metadata;
  Params headers;  // the standard headers to store with the object (see StoredHeaders)
  std::time_t initiated = 0;
  uint64_t seq = 0;  // orders uploads of one key by initiation, for ListMultipartUploads
  std::map<int, Part> parts;
  // x-amz-checksum-algorithm of CreateMultipartUpload: every part carries
  // that checksum, and the object a composite one.
  std::optional<s3::ChecksumAlgorithm> checksum_algorithm;
};

// One request being served.
struct Ctx {
  const HttpRequest& req;
  BodyReader& body;
  HttpResponse* resp;
  Params query;
  std::string bucket;
  std::string key;
  std::string payload_hash;  // hex, UNSIGNED-PAYLOAD, kStreamingSigned or kStreamingUnsignedTrailer
  std::string request_id;
  bool head = false;
  bool anonymous = false;  // unsigned, accepted because of allow_anonymous
  // kStreamingSigned: what each chunk's signature chains from (the request's
  // signature, then each chunk's) and the scope it is signed in.
  std::string chunk_seed, amz_date, date_stamp, scope;

  const std::string* Query(std::string_view name) const {
    for (const auto& [k, v] : query) {
      if (k == name) return &v;
    }
    return nullptr;
  }
  bool HasQuery(std::string_view name) const { return Query(name) != nullptr; }
};

std::string SegmentsEtag(s3::EtagHash kind, const std::vector<Buffer>& segments) {
  s3::EtagHasher h(kind);
  for (const Buffer& b : segments) h.Update(b.data(), b.size());
  return h.Finish();
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

// The response headers of a stored checksum: x-amz-checksum-<algorithm>.
Params ChecksumHeaders(const std::string& algorithm, const std::string& value) {
  Params out;
  auto a = s3::ParseChecksumAlgorithm(algorithm);
  if (a && !value.empty()) out.emplace_back(s3::ChecksumHeader(*a), value);
  return out;
}

// <ChecksumCRC32>v</ChecksumCRC32>, or "" without a checksum.
std::string ChecksumXml(const std::string& algorithm, const std::string& value) {
  if (algorithm.empty() || value.empty()) return "";
  return "<Checksum" + algorithm + ">" + s3::XmlEscape(value) + "</Checksum" + algorithm + ">";
}

bool AllDigits(std::string_view s, size_t max_len) {
  return !s.empty() && s.size() <= max_len &&
         std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

// The standard headers S3 keeps with an object (as S3 spells them) and the
// GET query parameter that overrides each in the response.
struct StoredHeaderName {
  std::string_view name;
  std::string_view lower;
  std::string_view response_param;
};
constexpr StoredHeaderName kStoredHeaders[] = {
    {"Cache-Control", "cache-control", "response-cache-control"},
    {"Content-Disposition", "content-disposition", "response-content-disposition"},
    {"Content-Encoding", "content-encoding", "response-content-encoding"},
    {"Content-Language", "content-language", "response-content-language"},
    {"Expires", "expires", "response-expires"},
};

// Content-Encoding without "aws-chunked", which describes the upload's
// framing and not the object (S3 does not store it either).
std::string StorableContentEncoding(std::string_view value) {
  std::string out;
  while (!value.empty()) {
    size_t comma = value.find(',');
    std::string_view token = s3::TrimOws(value.substr(0, comma));
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
    if (token.empty() || token == "aws-chunked") continue;
    if (!out.empty()) out += ", ";
    out += token;
  }
  return out;
}

Params StoredHeaders(const HttpRequest& req) {
  Params out;
  for (const auto& h : kStoredHeaders) {
    const std::string* v = req.Header(h.lower);
    if (!v) continue;
    std::string value = h.lower == "content-encoding" ? StorableContentEncoding(*v) : *v;
    if (!value.empty() || h.lower != "content-encoding") {
      out.emplace_back(std::string(h.name), std::move(value));
    }
  }
  return out;
}

Params UserMetadata(const HttpRequest& req) {
  Params out;
  for (const auto& [k, v] : req.headers) {
    if (k.rfind("x-amz-meta-", 0) == 0) out.emplace_back(k, v);
  }
  return out;
}

// An If-Match / If-None-Match value ("*" or a list of ETags) against an ETag.
bool EtagListMatches(std::string_view list, const std::string& etag) {
  std::string_view want = etag;
  if (want.size() >= 2 && want.front() == '"') want = want.substr(1, want.size() - 2);
  while (!list.empty()) {
    size_t comma = list.find(',');
    std::string_view item = s3::TrimOws(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (item == "*") return true;
    if (item.substr(0, 2) == "W/") item.remove_prefix(2);
    if (item.size() >= 2 && item.front() == '"' && item.back() == '"') {
      item = item.substr(1, item.size() - 2);
    }
    if (item == want) return true;
  }
  return false;
}

enum class Precondition { kProceed, kNotModified, kFailed };

// The conditional headers (prefix "" for GET/HEAD, "x-amz-copy-source-" for
// a copy's source) in the order of RFC 7232 section 6, which S3 follows:
// If-Match, else If-Unmodified-Since; then If-None-Match, else
// If-Modified-Since. Dates that do not parse are ignored, as S3 does.
Precondition EvaluatePreconditions(const HttpRequest& req, const StoredObject& obj,
                                   std::string_view prefix) {
  auto header = [&](std::string_view name) {
    return req.Header(std::string(prefix) + std::string(name));
  };
  std::time_t t = 0;
  if (const std::string* v = header("if-match")) {
    if (!EtagListMatches(*v, obj.etag)) return Precondition::kFailed;
  } else if (const std::string* d = header("if-unmodified-since")) {
    if (s3::ParseHttpDate(*d, &t) && obj.mtime > t) return Precondition::kFailed;
  }
  if (const std::string* v = header("if-none-match")) {
    if (EtagListMatches(*v, obj.etag)) return Precondition::kNotModified;
  } else if (const std::string* d = header("if-modified-since")) {
    if (s3::ParseHttpDate(*d, &t) && obj.mtime <= t) return Precondition::kNotModified;
  }
  return Precondition::kProceed;
}

Status PreconditionFailed() {
  return S3Error("PreconditionFailed",
                 "At least one of the pre-conditions you specified did not hold");
}

// The conditions of a write (PutObject, CopyObject, CompleteMultipartUpload)
// as S3 has them: If-None-Match "*" writes only a key that holds no object;
// If-Match <ETag> only over an object with that ETag (404 NoSuchKey when
// there is none). Both fail with 412 PreconditionFailed. Null without them.
Result<PutCondition> WriteCondition(const HttpRequest& req) {
  const std::string* none = req.Header("if-none-match");
  const std::string* match = req.Header("if-match");
  if (none == nullptr && match == nullptr) return PutCondition();
  if (none != nullptr && s3::TrimOws(*none) != "*") {
    return S3Error("NotImplemented",
                   "A header you provided implies functionality that is not implemented: "
                   "If-None-Match on a write takes only *");
  }
  const bool absent = none != nullptr;
  std::optional<std::string> etag;
  if (match != nullptr) etag = *match;
  return PutCondition([absent, etag](const ObjectEntry* current) -> Status {
    if (absent && current != nullptr) return PreconditionFailed();
    if (etag) {
      if (current == nullptr) return S3Error("NoSuchKey", "The specified key does not exist.");
      if (!EtagListMatches(*etag, current->etag)) return PreconditionFailed();
    }
    return Status::OK();
  });
}

// One page of a sorted listing: entries past the marker, keys sharing a
// common prefix (up to the delimiter) rolled into one, at most max_items.
struct PageItem {
  size_t index;        // into the listed entries
  std::string prefix;  // a common prefix, or "" for the entry itself
};
struct Page {
  std::vector<PageItem> items;
  bool truncated = false;
};
Page Paginate(size_t n, const std::function<const std::string&(size_t)>& key_of,
              const std::function<bool(size_t)>& past_marker, const std::string& marker,
              const std::string& prefix, const std::string& delimiter, int64_t max_items) {
  Page page;
  std::string last_prefix;
  for (size_t i = 0; i < n; ++i) {
    if (!past_marker(i)) continue;
    const std::string& key = key_of(i);
    std::string cp;
    if (!delimiter.empty()) {
      size_t pos = key.find(delimiter, prefix.size());
      if (pos != std::string::npos) cp = key.substr(0, pos + delimiter.size());
    }
    if (!cp.empty() && (cp == last_prefix || (!marker.empty() && cp <= marker))) continue;
    if (static_cast<int64_t>(page.items.size()) >= max_items) {
      page.truncated = max_items > 0;
      break;
    }
    if (!cp.empty()) last_prefix = cp;
    page.items.push_back({i, std::move(cp)});
  }
  return page;
}

Status ParseMaxItems(const std::string* v, std::string_view name, int64_t* out) {
  if (!v) return Status::OK();
  if (!AllDigits(*v, 9)) {
    return S3Error("InvalidArgument", std::string(name) + " must be a non-negative integer");
  }
  *out = std::min<int64_t>(std::stoll(*v), 1000);
  return Status::OK();
}

// S3 subresources (query parameters naming an API other than the plain
// object or bucket one) this server does not implement. A request naming
// one is refused rather than served as the plain operation: PUT ?retention
// must not overwrite the object, DELETE ?cors must not delete the bucket.
constexpr std::string_view kUnimplementedSubresources[] = {
    "accelerate",
    "acl",
    "analytics",
    "attributes",
    "cors",
    "encryption",
    "intelligent-tiering",
    "inventory",
    "legal-hold",
    "lifecycle",
    "logging",
    "metrics",
    "notification",
    "object-lock",
    "ownershipControls",
    "policy",
    "policyStatus",
    "publicAccessBlock",
    "replication",
    "requestPayment",
    "restore",
    "retention",
    "select",
    "tagging",
    "torrent",
    "versioning",
    "website",
    "session",
    "renameObject",
};

constexpr std::string_view kOwnerXml =
    "<Owner><ID>xsilo</ID><DisplayName>xsilo</DisplayName></Owner>";

}  // namespace

struct S3Server::Impl {
  S3ServerOptions opts;
  std::unique_ptr<s3::ObjectStore> store;
  std::unique_ptr<s3::HttpServer> http;
  std::mutex uploads_mu;
  std::map<std::string, Upload> uploads;
  // Recently completed uploads, so that a retried Complete (its response
  // lost) gets the same answer, as in S3, instead of NoSuchUpload. A
  // retry must name the same bucket, key and parts; they are kept as one
  // 128-bit digest (CompletionDigest), so the 1024 entries stay near
  // 100 KB however many parts each upload had.
  struct Completed {
    XXH128_hash_t request;
    std::string etag;
    std::string checksum_xml;
  };
  static constexpr size_t kRememberedCompletions = 1024;
  std::map<std::string, Completed> completed;
  std::deque<std::string> completed_order;  // oldest first
  std::atomic<uint64_t> next_id{1};
  uint64_t id_salt = std::random_device{}();
  // Directory mode with recycling: drops free files past their age.
  std::thread trimmer;
  std::mutex trim_mu;
  std::condition_variable trim_cv;
  bool trim_stop = false;

  ~Impl() { StopTrimmer(); }
  void StopTrimmer() {
    {
      std::lock_guard<std::mutex> lock(trim_mu);
      trim_stop = true;
    }
    trim_cv.notify_all();
    if (trimmer.joinable()) trimmer.join();
  }

  void Handle(const HttpRequest& req, BodyReader& body, HttpResponse* resp);
  Status Authenticate(Ctx& c);
  Status Route(Ctx& c);
  void SendError(Ctx& c, const Status& st);
  void SendXml(Ctx& c, int status, std::string xml);

  // Reads and verifies the body (s3/request_body.h); limit in decoded bytes.
  Result<s3::RequestBody> ReadBody(Ctx& c, s3::BodyOptions options);
  Result<Buffer> ReadXmlBody(Ctx& c, bool header_checksums = true);
  s3::EtagHash etag_hash() const {
    return opts.md5_etags ? s3::EtagHash::kMd5 : s3::EtagHash::kXxh3;
  }

  Status ListBuckets(Ctx& c);
  Status CreateBucket(Ctx& c);
  Status ListObjects(Ctx& c);
  Status DeleteObjects(Ctx& c);
  Status ListObjectVersions(Ctx& c);
  Status ListMultipartUploads(Ctx& c);
  Status PutObject(Ctx& c);
  Status GetObject(Ctx& c);
  Result<StoredObject> ReadCopySource(Ctx& c, std::string* bucket, std::string* key);
  Status CopyObject(Ctx& c);
  Status UploadPartCopy(Ctx& c, int part);
  Status ListParts(Ctx& c);
  Status CreateUpload(Ctx& c);
  Status UploadPart(Ctx& c);
  Status CompleteUpload(Ctx& c);
  static std::string CompleteResultXml(const Ctx& c, const std::string& etag,
                                       const std::string& checksum_xml);
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
  Ctx c{req, body, resp, {}, {}, {}, {}, id, req.method == "HEAD", false};
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

  // A CORS preflight is answered before authentication, as S3 does: this
  // server has no CORS configuration, so a complete one is refused (403)
  // and one without Origin is malformed (400).
  if (req.method == "OPTIONS") {
    if (!req.Header("origin") || !req.Header("access-control-request-method")) {
      return S3Error("BadRequest", "Insufficient information. Origin request header needed.");
    }
    return S3Error("CORSResponse", "CORS is not enabled for this bucket.");
  }
  Status auth = Authenticate(c);
  if (!auth.ok()) {
    // An unsigned request to a bucket that does not exist learns that it
    // does not (bucket names are public in S3 too), not AccessDenied.
    if (S3ErrorCode(auth) == "AccessDenied" && !req.Header("authorization") &&
        !c.HasQuery("X-Amz-Signature") && !c.bucket.empty()) {
      Status bucket = store->HeadBucket(c.bucket);
      if (S3ErrorCode(bucket) == "NoSuchBucket") return bucket;
    }
    return auth;
  }

  const std::string& m = req.method;
  for (std::string_view sub : kUnimplementedSubresources) {
    if (c.HasQuery(sub)) {
      return S3Error("NotImplemented",
                     "The " + std::string(sub) + " subresource is not implemented by xsilo s3d.");
    }
  }
  // Buckets here are unversioned: "null" names the one version of an object.
  if (const std::string* v = c.Query("versionId"); v && *v != "null") {
    return S3Error("InvalidArgument", "Invalid version id specified");
  }
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
      // Uploads in progress go with the bucket; their parts are freed outside the lock.
      std::vector<Upload> dead;
      {
        std::lock_guard<std::mutex> lock(uploads_mu);
        for (auto it = uploads.begin(); it != uploads.end();) {
          if (it->second.bucket != c.bucket) {
            ++it;
            continue;
          }
          dead.push_back(std::move(it->second));
          it = uploads.erase(it);
        }
      }
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
    if (m == "GET" && c.HasQuery("uploads")) return ListMultipartUploads(c);
    if (m == "GET" && c.HasQuery("versions")) return ListObjectVersions(c);
    if (m == "GET") return ListObjects(c);
    if (m == "POST" && c.HasQuery("delete")) return DeleteObjects(c);
    return S3Error("MethodNotAllowed",
                   "The specified method is not allowed against this resource.");
  }
  if (m == "PUT") {
    if (c.HasQuery("uploadId") || c.HasQuery("partNumber")) return UploadPart(c);
    if (c.req.Header("x-amz-copy-source")) return CopyObject(c);
    return PutObject(c);
  }
  if (m == "GET" && c.HasQuery("uploadId")) return ListParts(c);
  if (m == "GET" || m == "HEAD") {
    if (c.HasQuery("uploadId") || c.HasQuery("partNumber")) {
      return S3Error("NotImplemented", "GetObject by partNumber is not implemented.");
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
    static const std::string kEmptyHash(s3::kEmptySha256Hex);
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
    XSILO_ASSIGN_OR_RETURN(Buffer body, ReadXmlBody(c));
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
  const std::string* encoding = c.Query("encoding-type");
  if (encoding && *encoding != "url") {
    return S3Error("InvalidArgument", "Invalid Encoding Method specified in Request");
  }
  bool url_encode = encoding != nullptr;
  int64_t max_keys = 1000;
  XSILO_RETURN_IF_ERROR(ParseMaxItems(c.Query("max-keys"), "max-keys", &max_keys));
  std::string after;
  std::string token = q("continuation-token");
  if (v2 && !token.empty()) {  // an empty token starts from the beginning, as in S3
    auto dec = Base64Decode(token);
    if (!dec) {
      return S3Error("InvalidArgument", "The continuation token provided is incorrect");
    }
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
  Page page = Paginate(
      entries.size(), [&](size_t i) -> const std::string& { return entries[i].key; },
      [&](size_t i) { return after.empty() || entries[i].key > after; }, after, prefix, delimiter,
      max_keys);
  std::string contents, prefixes, last;
  bool fetch_owner = v2 ? q("fetch-owner") == "true" : true;
  for (const PageItem& item : page.items) {
    if (!item.prefix.empty()) {
      last = item.prefix;
      prefixes += "<CommonPrefixes><Prefix>" + enc(item.prefix) + "</Prefix></CommonPrefixes>";
      continue;
    }
    const s3::ObjectEntry& e = entries[item.index];
    last = e.key;
    contents += "<Contents><Key>" + enc(e.key) + "</Key><LastModified>" +
                s3::FormatIsoDate(e.mtime) + "</LastModified><ETag>" + s3::XmlEscape(e.etag) +
                "</ETag><Size>" + std::to_string(e.size) + "</Size>" +
                (fetch_owner ? std::string(kOwnerXml) : std::string()) +
                "<StorageClass>STANDARD</StorageClass></Contents>";
  }
  // V1 returns its Prefix as sent even with encoding-type=url (S3 does; boto3
  // decodes V1's Delimiter, Marker, NextMarker and keys, not Prefix).
  std::string xml = "<ListBucketResult" + std::string(kXmlns) + "><Name>" +
                    s3::XmlEscape(c.bucket) + "</Name><Prefix>" +
                    (v2 ? enc(prefix) : s3::XmlEscape(prefix)) + "</Prefix>";
  if (v2) {
    xml += "<KeyCount>" + std::to_string(page.items.size()) + "</KeyCount>";
    if (c.HasQuery("continuation-token"))
      xml += "<ContinuationToken>" + s3::XmlEscape(token) + "</ContinuationToken>";
    if (c.HasQuery("start-after")) xml += "<StartAfter>" + enc(q("start-after")) + "</StartAfter>";
  } else {
    xml += "<Marker>" + enc(q("marker")) + "</Marker>";
  }
  xml += "<MaxKeys>" + std::to_string(max_keys) + "</MaxKeys>";
  if (!delimiter.empty()) xml += "<Delimiter>" + enc(delimiter) + "</Delimiter>";
  if (url_encode) xml += "<EncodingType>url</EncodingType>";
  xml += std::string("<IsTruncated>") + (page.truncated ? "true" : "false") + "</IsTruncated>";
  if (page.truncated) {
    if (v2) {
      xml += "<NextContinuationToken>" +
             Base64Encode({reinterpret_cast<const uint8_t*>(last.data()), last.size()}) +
             "</NextContinuationToken>";
    } else if (!delimiter.empty()) {
      // As S3: V1 names the next marker only with a delimiter; without one
      // the client continues from the last key it received.
      xml += "<NextMarker>" + enc(last) + "</NextMarker>";
    }
  }
  xml += contents + prefixes + "</ListBucketResult>";
  SendXml(c, 200, std::move(xml));
  return Status::OK();
}

// Buckets are never versioned here: every object is its one version, "null".
Status S3Server::Impl::ListObjectVersions(Ctx& c) {
  auto q = [&](std::string_view n) {
    const std::string* v = c.Query(n);
    return v ? *v : std::string();
  };
  std::string prefix = q("prefix"), delimiter = q("delimiter"), marker = q("key-marker");
  const std::string* encoding = c.Query("encoding-type");
  if (encoding && *encoding != "url") {
    return S3Error("InvalidArgument", "Invalid Encoding Method specified in Request");
  }
  auto enc = [&](const std::string& s) {
    return s3::XmlEscape(encoding ? s3::UriEncode(s, false) : s);
  };
  int64_t max_keys = 1000;
  XSILO_RETURN_IF_ERROR(ParseMaxItems(c.Query("max-keys"), "max-keys", &max_keys));
  XSILO_ASSIGN_OR_RETURN(auto entries, store->List(c.bucket, prefix));
  Page page = Paginate(
      entries.size(), [&](size_t i) -> const std::string& { return entries[i].key; },
      [&](size_t i) { return marker.empty() || entries[i].key > marker; }, marker, prefix,
      delimiter, max_keys);
  std::string xml = "<ListVersionsResult" + std::string(kXmlns) + "><Name>" +
                    s3::XmlEscape(c.bucket) + "</Name><Prefix>" + enc(prefix) +
                    "</Prefix><KeyMarker>" + enc(marker) + "</KeyMarker><VersionIdMarker>" +
                    s3::XmlEscape(q("version-id-marker")) + "</VersionIdMarker><MaxKeys>" +
                    std::to_string(max_keys) + "</MaxKeys>";
  if (!delimiter.empty()) xml += "<Delimiter>" + enc(delimiter) + "</Delimiter>";
  if (encoding) xml += "<EncodingType>url</EncodingType>";
  xml += std::string("<IsTruncated>") + (page.truncated ? "true" : "false") + "</IsTruncated>";
  std::string last;
  std::string body;
  for (const PageItem& item : page.items) {
    if (!item.prefix.empty()) {
      last = item.prefix;
      body += "<CommonPrefixes><Prefix>" + enc(item.prefix) + "</Prefix></CommonPrefixes>";
      continue;
    }
    const s3::ObjectEntry& e = entries[item.index];
    last = e.key;
    body += "<Version><Key>" + enc(e.key) +
            "</Key><VersionId>null</VersionId><IsLatest>true</IsLatest><LastModified>" +
            s3::FormatIsoDate(e.mtime) + "</LastModified><ETag>" + s3::XmlEscape(e.etag) +
            "</ETag><Size>" + std::to_string(e.size) + "</Size>" + std::string(kOwnerXml) +
            "<StorageClass>STANDARD</StorageClass></Version>";
  }
  if (page.truncated) {
    xml += "<NextKeyMarker>" + enc(last) + "</NextKeyMarker><NextVersionIdMarker>null" +
           "</NextVersionIdMarker>";
  }
  xml += body + "</ListVersionsResult>";
  SendXml(c, 200, std::move(xml));
  return Status::OK();
}

Status S3Server::Impl::DeleteObjects(Ctx& c) {
  XSILO_ASSIGN_OR_RETURN(Buffer body, ReadXmlBody(c));
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  std::string_view doc = body.view();
  bool quiet = s3::XmlText(doc, "Quiet").value_or("") == "true";
  std::string xml = "<DeleteResult" + std::string(kXmlns) + ">";
  bool any = false;
  size_t objects = 0;
  s3::XmlForEach(doc, "Object", [&](std::string_view) { ++objects; });
  if (objects > 1000) {
    return S3Error("MalformedXML", "DeleteObjects takes at most 1000 keys per request.");
  }
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

Status S3Server::Impl::PutObject(Ctx& c) {
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  XSILO_ASSIGN_OR_RETURN(PutCondition condition, WriteCondition(c.req));
  StoredObject obj;
  XSILO_ASSIGN_OR_RETURN(s3::RequestBody received,
                         ReadBody(c, {.limit = opts.max_object_bytes, .etag = etag_hash()}));
  Buffer body = std::move(received.bytes);
  obj.size = body.size();
  obj.etag = std::move(received.etag);
  obj.checksum_algorithm = std::move(received.checksum_algorithm);
  obj.checksum = std::move(received.checksum);
  obj.mtime = std::time(nullptr);
  if (const std::string* ct = c.req.Header("content-type")) obj.content_type = *ct;
  obj.user_metadata = UserMetadata(c.req);
  obj.headers = StoredHeaders(c.req);
  if (!body.empty()) obj.segments.push_back(std::move(body));
  std::string etag = obj.etag;
  Params checksum_header = ChecksumHeaders(obj.checksum_algorithm, obj.checksum);
  XSILO_RETURN_IF_ERROR(store->Put(c.bucket, c.key, std::move(obj), condition));
  c.resp->headers.emplace_back("ETag", etag);
  for (auto& h : checksum_header) c.resp->headers.push_back(std::move(h));
  return Status::OK();
}

Status S3Server::Impl::GetObject(Ctx& c) {
  // response-* parameters replace stored headers in this one response.
  Params overrides;
  for (const auto& [k, v] : c.query) {
    if (k.rfind("response-", 0) != 0) continue;
    std::string_view name;
    if (k == "response-content-type") name = "Content-Type";
    for (const auto& h : kStoredHeaders) {
      if (k == h.response_param) name = h.name;
    }
    if (name.empty()) {
      return S3Error("InvalidArgument", "Unknown response header override: " + k);
    }
    overrides.emplace_back(std::string(name), v);
  }
  if (!overrides.empty() && c.anonymous) {
    return S3Error("InvalidRequest",
                   "Request specific response headers cannot be used for anonymous GET requests.");
  }
  XSILO_ASSIGN_OR_RETURN(StoredObject obj, store->Get(c.bucket, c.key));
  HttpResponse* r = c.resp;
  r->headers.emplace_back("ETag", obj.etag);
  r->headers.emplace_back("Last-Modified", s3::FormatHttpDate(obj.mtime));
  switch (EvaluatePreconditions(c.req, obj, "")) {
    case Precondition::kFailed:
      return PreconditionFailed();
    case Precondition::kNotModified:
      r->status = 304;
      r->omit_body = true;
      r->content_length = 0;
      return Status::OK();
    case Precondition::kProceed:
      break;
  }
  auto overridden = [&](std::string_view name) {
    for (const auto& kv : overrides) {
      if (kv.first == name) return true;
    }
    return false;
  };
  if (!overridden("Content-Type")) r->headers.emplace_back("Content-Type", obj.content_type);
  for (const auto& kv : obj.headers) {
    if (!overridden(kv.first)) r->headers.push_back(kv);
  }
  for (auto& kv : overrides) r->headers.push_back(std::move(kv));
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
  } else if (const std::string* mode = c.req.Header("x-amz-checksum-mode");
             mode != nullptr && (*mode == "ENABLED" || *mode == "enabled")) {
    // Asked for, as S3 wants it; a whole-object checksum describes only
    // the whole object.
    for (auto& h : ChecksumHeaders(obj.checksum_algorithm, obj.checksum)) {
      r->headers.push_back(std::move(h));
    }
  }
  if (c.head) {
    r->omit_body = true;
    r->content_length = len;
  } else if (obj.file && obj.segments.size() == 1) {
    // A stored file goes by sendfile: no copy through this process.
    r->body.clear();
    r->file_fd = obj.file->fd;
    r->file_offset = start;
    r->file_length = len;
    r->file_owner = std::move(obj.file);
  } else {
    r->SetBody(rr > 0 ? SliceSegments(obj.segments, start, len) : std::move(obj.segments));
  }
  return Status::OK();
}

// x-amz-copy-source ("[/]bucket/key[?versionId=v]", percent-encoded) read,
// and its x-amz-copy-source-if-* conditions checked.
Result<StoredObject> S3Server::Impl::ReadCopySource(Ctx& c, std::string* bucket, std::string* key) {
  std::string_view raw = *c.req.Header("x-amz-copy-source");
  std::string version;
  if (size_t q = raw.find('?'); q != std::string_view::npos) {
    Params params;
    if (!s3::ParseQuery(raw.substr(q + 1), &params)) {
      return S3Error("InvalidArgument", "Invalid copy source encoding.");
    }
    for (const auto& [k, v] : params) {
      if (k == "versionId") version = v;
    }
    raw = raw.substr(0, q);
  }
  std::string source;
  if (!s3::UriDecode(raw, &source)) {
    return S3Error("InvalidArgument", "Invalid copy source encoding.");
  }
  if (!source.empty() && source[0] == '/') source.erase(0, 1);
  size_t slash = source.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == source.size()) {
    return S3Error("InvalidArgument",
                   "Copy Source must mention the source bucket and key: sourcebucket/sourcekey");
  }
  *bucket = source.substr(0, slash);
  *key = source.substr(slash + 1);
  if (key->size() > 1024) return S3Error("KeyTooLongError", "Your key is too long.");
  if (!version.empty() && version != "null") {
    return S3Error("NoSuchVersion",
                   "The specified version does not exist (buckets here are not versioned).");
  }
  XSILO_ASSIGN_OR_RETURN(StoredObject obj, store->Get(*bucket, *key));
  if (EvaluatePreconditions(c.req, obj, "x-amz-copy-source-") != Precondition::kProceed) {
    return PreconditionFailed();
  }
  return obj;
}

Status S3Server::Impl::CopyObject(Ctx& c) {
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  std::string directive = "COPY";
  if (const std::string* d = c.req.Header("x-amz-metadata-directive")) directive = *d;
  if (directive != "COPY" && directive != "REPLACE") {
    return S3Error("InvalidArgument", "Unknown metadata directive.");
  }
  std::string src_bucket, src_key;
  XSILO_ASSIGN_OR_RETURN(StoredObject src, ReadCopySource(c, &src_bucket, &src_key));
  if (src_bucket == c.bucket && src_key == c.key && directive == "COPY") {
    return S3Error("InvalidRequest",
                   "This copy request is illegal because it is trying to copy an object to itself "
                   "without changing the object's metadata, storage class, website redirect "
                   "location or encryption attributes.");
  }
  StoredObject obj;
  obj.segments = std::move(src.segments);  // shared, not copied, by the memory store
  obj.size = src.size;
  // A single-PUT ETag is the hash of the bytes, still right; a multipart
  // one is not: the copy is one object, hashed as a PUT would be. So is a
  // composite checksum.
  // Both in one pass over the bytes.
  obj.etag = src.etag;
  obj.checksum_algorithm = src.checksum_algorithm;
  obj.checksum = src.checksum;
  if (src.etag.find('-') != std::string::npos) {
    s3::EtagHasher etag(etag_hash());
    std::optional<s3::ChecksumStream> whole;
    if (auto a = s3::ParseChecksumAlgorithm(src.checksum_algorithm);
        a && src.checksum.find('-') != std::string::npos) {
      whole.emplace(*a);
    }
    for (const Buffer& b : obj.segments) {
      etag.Update(b.data(), b.size());
      if (whole) whole->Update(b.data(), b.size());
    }
    obj.etag = etag.Finish();
    if (whole) obj.checksum = s3::Base64Of(whole->Finish());
  }
  if (directive == "COPY") {
    obj.content_type = std::move(src.content_type);
    obj.user_metadata = std::move(src.user_metadata);
    obj.headers = std::move(src.headers);
  } else {
    if (const std::string* ct = c.req.Header("content-type")) obj.content_type = *ct;
    obj.user_metadata = UserMetadata(c.req);
    obj.headers = StoredHeaders(c.req);
  }
  obj.mtime = std::time(nullptr);
  std::time_t mtime = obj.mtime;
  std::string etag = obj.etag;
  XSILO_ASSIGN_OR_RETURN(PutCondition condition, WriteCondition(c.req));
  XSILO_RETURN_IF_ERROR(store->Put(c.bucket, c.key, std::move(obj), condition));
  SendXml(c, 200,
          "<CopyObjectResult" + std::string(kXmlns) + "><LastModified>" + s3::FormatIsoDate(mtime) +
              "</LastModified><ETag>" + s3::XmlEscape(etag) + "</ETag></CopyObjectResult>");
  return Status::OK();
}

Status S3Server::Impl::CreateUpload(Ctx& c) {
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  Upload u;
  u.bucket = c.bucket;
  u.key = c.key;
  if (const std::string* ct = c.req.Header("content-type")) u.content_type = *ct;
  u.user_metadata = UserMetadata(c.req);
  u.headers = StoredHeaders(c.req);
  if (const std::string* a = c.req.Header("x-amz-checksum-algorithm")) {
    u.checksum_algorithm = s3::ParseChecksumAlgorithm(*a);
    if (!u.checksum_algorithm) {
      return S3Error("InvalidRequest", "Checksum algorithm provided is unsupported: " + *a);
    }
  }
  u.initiated = std::time(nullptr);
  u.seq = next_id.fetch_add(1);
  std::mt19937_64 rng(std::random_device{}());
  char id[64];
  std::snprintf(id, sizeof(id), "%016" PRIx64 "%016" PRIx64, rng(), u.seq);
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    uploads.emplace(id, std::move(u));
  }
  if (const std::string* a = c.req.Header("x-amz-checksum-algorithm")) {
    c.resp->headers.emplace_back("x-amz-checksum-algorithm", *a);
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
  if (!AllDigits(*pn, 5) || (part = std::stoi(*pn)) < 1 || part > 10000) {
    return S3Error("InvalidArgument",
                   "Part number must be an integer between 1 and 10000, inclusive");
  }
  if (c.req.Header("x-amz-copy-source")) return UploadPartCopy(c, part);
  std::optional<s3::ChecksumAlgorithm> declared;
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(*id);
    if (it == uploads.end() || it->second.bucket != c.bucket || it->second.key != c.key) {
      c.resp->close = c.req.content_length > 0 || c.req.chunked;
      return S3Error("NoSuchUpload", "The specified upload does not exist.");
    }
    declared = it->second.checksum_algorithm;
  }
  XSILO_ASSIGN_OR_RETURN(s3::RequestBody received, ReadBody(c, {.limit = opts.max_part_bytes,
                                                                .etag = etag_hash(),
                                                                .checksum_default = declared}));
  if (declared && received.checksum_algorithm != s3::ChecksumName(*declared)) {
    return S3Error("InvalidRequest", "The upload was created with x-amz-checksum-algorithm " +
                                         std::string(s3::ChecksumName(*declared)) +
                                         " and this part sent a " + received.checksum_algorithm +
                                         " checksum.");
  }
  Buffer body = std::move(received.bytes);
  std::string etag = std::move(received.etag);
  Params checksum_header = ChecksumHeaders(received.checksum_algorithm, received.checksum);
  std::lock_guard<std::mutex> lock(uploads_mu);
  auto it = uploads.find(*id);
  if (it == uploads.end()) return S3Error("NoSuchUpload", "The specified upload was aborted.");
  uint64_t size = body.size();
  std::vector<Buffer> segments;
  if (!body.empty()) segments.push_back(std::move(body));
  Part old = std::move(it->second.parts[part]);  // a re-sent part replaces the first
  it->second.parts[part] = Part{std::move(segments),
                                size,
                                etag,
                                std::time(nullptr),
                                std::move(received.checksum_algorithm),
                                std::move(received.checksum)};
  c.resp->headers.emplace_back("ETag", etag);
  for (auto& h : checksum_header) c.resp->headers.push_back(std::move(h));
  return Status::OK();
}

std::string S3Server::Impl::CompleteResultXml(const Ctx& c, const std::string& etag,
                                              const std::string& checksum_xml) {
  return "<CompleteMultipartUploadResult" + std::string(kXmlns) + "><Location>/" +
         s3::XmlEscape(c.bucket) + "/" + s3::XmlEscape(c.key) + "</Location><Bucket>" +
         s3::XmlEscape(c.bucket) + "</Bucket><Key>" + s3::XmlEscape(c.key) + "</Key><ETag>" +
         s3::XmlEscape(etag) + "</ETag>" + checksum_xml + "</CompleteMultipartUploadResult>";
}

namespace {

// Bucket, key and the listed parts of a Complete request, as one digest.
XXH128_hash_t CompletionDigest(const std::string& bucket, const std::string& key,
                               const std::vector<std::pair<int, std::string>>& parts) {
  // Lengths before contents, so that no two requests spell the same bytes.
  std::string bytes;
  auto add_u64 = [&bytes](uint64_t v) { bytes.append(reinterpret_cast<const char*>(&v), 8); };
  add_u64(bucket.size());
  bytes += bucket;
  add_u64(key.size());
  bytes += key;
  for (const auto& [number, etag] : parts) {
    add_u64(static_cast<uint64_t>(number));
    add_u64(etag.size());
    bytes += etag;
  }
  return XXH3_128bits(bytes.data(), bytes.size());
}

}  // namespace

Status S3Server::Impl::CompleteUpload(Ctx& c) {
  const std::string& id = *c.Query("uploadId");
  XSILO_ASSIGN_OR_RETURN(Buffer body, ReadXmlBody(c, /*header_checksums=*/false));
  auto parsed = s3::ParseCompleteMultipartUpload(body.view());
  if (!parsed.ok()) {
    return S3Error("MalformedXML", "The XML you provided was not well-formed or did not validate.");
  }
  // A part number listed twice in a row (its part was re-sent while the
  // list was made) counts once, with its last ETag, as RGW takes it.
  std::vector<std::pair<int, std::string>> listed;
  for (auto& p : *parsed) {
    if (!listed.empty() && listed.back().first == p.number) {
      listed.back().second = std::move(p.etag);
    } else {
      listed.emplace_back(p.number, std::move(p.etag));
    }
  }
  // A write condition that fails already fails before the upload is
  // consumed, so that its parts stay for a retry or an abort (Put tests it
  // again). A retry of a completion that succeeded gets its answer below.
  XSILO_ASSIGN_OR_RETURN(PutCondition condition, WriteCondition(c.req));
  if (condition) {
    bool open;
    {
      std::lock_guard<std::mutex> lock(uploads_mu);
      open = uploads.count(id) > 0;
    }
    if (open) {
      auto current = store->Get(c.bucket, c.key);
      if (current.ok()) {
        ObjectEntry entry{c.key, current->size, current->etag, current->mtime};
        XSILO_RETURN_IF_ERROR(condition(&entry));
      } else if (S3ErrorCode(current.status()) == "NoSuchKey") {
        XSILO_RETURN_IF_ERROR(condition(nullptr));
      } else {
        return current.status();
      }
    }
  }
  StoredObject obj;
  std::optional<Upload> taken;
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(id);
    if (it == uploads.end() || it->second.bucket != c.bucket || it->second.key != c.key) {
      auto done = completed.find(id);
      if (done != completed.end() &&
          XXH128_isEqual(done->second.request, CompletionDigest(c.bucket, c.key, listed))) {
        SendXml(c, 200, CompleteResultXml(c, done->second.etag, done->second.checksum_xml));
        return Status::OK();
      }
      return S3Error("NoSuchUpload", "The specified upload does not exist.");
    }
    Upload& u = it->second;
    std::vector<std::string> part_etags;
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
    }
    // Sizes only once every listed part is known to exist, as S3 checks.
    for (size_t i = 0; i < listed.size(); ++i) {
      int num = listed[i].first;
      auto p = u.parts.find(num);
      if (i + 1 < listed.size() && p->second.size < opts.min_part_bytes) {
        return S3Error("EntityTooSmall", "Part " + std::to_string(num) +
                                             " is smaller than the minimum allowed size.");
      }
      obj.size += p->second.size;
      part_etags.push_back(p->second.etag);
    }
    if (obj.size > opts.max_object_bytes) {
      return S3Error("EntityTooLarge", "The completed object exceeds the maximum allowed size.");
    }
    // Views of the parts' Buffers: the upload is kept (out of the table)
    // until the object is stored, and put back if that fails.
    for (const auto& [num, etag] : listed) {
      for (const Buffer& b : u.parts[num].segments) obj.segments.push_back(b);
    }
    XSILO_ASSIGN_OR_RETURN(obj.etag, s3::MultipartEtag(etag_hash(), part_etags));
    if (u.checksum_algorithm) {
      // Composite: the checksum of the parts' raw checksums, then -<parts>.
      s3::ChecksumStream composite(*u.checksum_algorithm);
      for (const auto& [num, etag] : listed) {
        auto raw = Base64Decode(u.parts[num].checksum);
        if (u.parts[num].checksum_algorithm != s3::ChecksumName(*u.checksum_algorithm) || !raw) {
          return S3Error("InvalidPart", "Part " + std::to_string(num) + " has no " +
                                            std::string(s3::ChecksumName(*u.checksum_algorithm)) +
                                            " checksum.");
        }
        composite.Update(raw->data(), raw->size());
      }
      obj.checksum_algorithm = std::string(s3::ChecksumName(*u.checksum_algorithm));
      obj.checksum = s3::Base64Of(composite.Finish()) + "-" + std::to_string(listed.size());
    }
    // The object's checksum as the client computed it: must be the composite.
    for (s3::ChecksumAlgorithm a : s3::kAllChecksumAlgorithms) {
      const std::string* claimed = c.req.Header(s3::ChecksumHeader(a));
      if (claimed == nullptr) continue;
      const std::string bare = obj.checksum.substr(0, obj.checksum.rfind('-'));
      if (obj.checksum_algorithm != s3::ChecksumName(a) ||
          (*claimed != obj.checksum && *claimed != bare)) {
        return S3Error("BadDigest", "The " + std::string(s3::ChecksumName(a)) +
                                        " you specified did not match the calculated checksum.");
      }
    }
    obj.content_type = u.content_type.empty() ? obj.content_type : u.content_type;
    obj.user_metadata = u.user_metadata;
    obj.headers = u.headers;
    taken.emplace(std::move(it->second));
    uploads.erase(it);
  }
  obj.mtime = std::time(nullptr);
  std::string etag = obj.etag;
  std::string checksum_xml = ChecksumXml(obj.checksum_algorithm, obj.checksum);
  Status stored = store->Put(c.bucket, c.key, std::move(obj), condition);
  if (!stored.ok()) {
    // A refused condition (another writer came first) or a failed write:
    // the upload stays, for a retry or an abort.
    std::lock_guard<std::mutex> lock(uploads_mu);
    uploads.emplace(id, std::move(*taken));
    return stored;
  }
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    completed[id] = Completed{CompletionDigest(c.bucket, c.key, listed), etag, checksum_xml};
    completed_order.push_back(id);
    if (completed_order.size() > kRememberedCompletions) {
      completed.erase(completed_order.front());
      completed_order.pop_front();
    }
  }
  SendXml(c, 200, CompleteResultXml(c, etag, checksum_xml));
  return Status::OK();
}

Status S3Server::Impl::UploadPartCopy(Ctx& c, int part) {
  const std::string& id = *c.Query("uploadId");
  auto upload_exists = [&] {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(id);
    return it != uploads.end() && it->second.bucket == c.bucket && it->second.key == c.key;
  };
  if (!upload_exists()) return S3Error("NoSuchUpload", "The specified upload does not exist.");
  std::string src_bucket, src_key;
  XSILO_ASSIGN_OR_RETURN(StoredObject src, ReadCopySource(c, &src_bucket, &src_key));
  uint64_t start = 0, len = src.size;
  if (const std::string* range = c.req.Header("x-amz-copy-source-range")) {
    // Only "bytes=first-last", both given, as S3 requires here.
    std::string_view r = *range;
    size_t dash = r.find('-');
    if (r.substr(0, 6) != "bytes=" || dash == std::string_view::npos ||
        !AllDigits(r.substr(6, dash - 6), 19) || !AllDigits(r.substr(dash + 1), 19)) {
      return S3Error("InvalidArgument",
                     "The x-amz-copy-source-range value must be of the form bytes=first-last "
                     "where first and last are the zero-based offsets of the first and last "
                     "bytes to copy");
    }
    uint64_t first = std::stoull(std::string(r.substr(6, dash - 6)));
    uint64_t last = std::stoull(std::string(r.substr(dash + 1)));
    if (last < first) {
      return S3Error("InvalidArgument", "The x-amz-copy-source-range value is not valid: " +
                                            std::string(r) + " (last byte before the first)");
    }
    if (last >= src.size) {
      return S3Error("InvalidRange", "The requested range is not satisfiable: " + std::string(r) +
                                         " of an object of " + std::to_string(src.size) + " bytes");
    }
    start = first;
    len = last - first + 1;
  }
  if (len > opts.max_part_bytes) {
    return S3Error("EntityTooLarge", "The part exceeds the maximum allowed size (" +
                                         std::to_string(opts.max_part_bytes) + " bytes).");
  }
  std::vector<Buffer> segments = SliceSegments(src.segments, start, len);
  std::string etag = SegmentsEtag(etag_hash(), segments);
  std::optional<s3::ChecksumAlgorithm> declared;
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(id);
    if (it != uploads.end()) declared = it->second.checksum_algorithm;
  }
  std::string checksum;
  if (declared) {
    s3::ChecksumStream sum(*declared);
    for (const Buffer& b : segments) sum.Update(b.data(), b.size());
    checksum = s3::Base64Of(sum.Finish());
  }
  std::time_t now = std::time(nullptr);
  Part old;  // a re-sent part replaces the first; freed outside the lock
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(id);
    if (it == uploads.end()) return S3Error("NoSuchUpload", "The specified upload was aborted.");
    old = std::move(it->second.parts[part]);
    it->second.parts[part] =
        Part{std::move(segments),
             len,
             etag,
             now,
             declared ? std::string(s3::ChecksumName(*declared)) : std::string(),
             checksum};
  }
  SendXml(c, 200,
          "<CopyPartResult" + std::string(kXmlns) + "><LastModified>" + s3::FormatIsoDate(now) +
              "</LastModified><ETag>" + s3::XmlEscape(etag) + "</ETag></CopyPartResult>");
  return Status::OK();
}

Status S3Server::Impl::ListParts(Ctx& c) {
  const std::string& id = *c.Query("uploadId");
  int64_t max_parts = 1000;
  XSILO_RETURN_IF_ERROR(ParseMaxItems(c.Query("max-parts"), "max-parts", &max_parts));
  int marker = 0;
  if (const std::string* m = c.Query("part-number-marker")) {
    if (!AllDigits(*m, 5)) {
      return S3Error("InvalidArgument", "part-number-marker must be an integer from 0 to 10000");
    }
    marker = std::stoi(*m);
  }
  std::string parts;
  int last = 0;
  bool truncated = false;
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(id);
    if (it == uploads.end() || it->second.bucket != c.bucket || it->second.key != c.key) {
      return S3Error("NoSuchUpload", "The specified upload does not exist.");
    }
    int64_t n = 0;
    for (auto p = it->second.parts.upper_bound(marker); p != it->second.parts.end(); ++p) {
      if (n == max_parts) {
        truncated = true;
        break;
      }
      ++n;
      last = p->first;
      parts += "<Part><PartNumber>" + std::to_string(p->first) + "</PartNumber><LastModified>" +
               s3::FormatIsoDate(p->second.mtime) + "</LastModified><ETag>" +
               s3::XmlEscape(p->second.etag) + "</ETag>" +
               ChecksumXml(p->second.checksum_algorithm, p->second.checksum) + "<Size>" +
               std::to_string(p->second.size) + "</Size></Part>";
    }
  }
  std::string xml =
      "<ListPartsResult" + std::string(kXmlns) + "><Bucket>" + s3::XmlEscape(c.bucket) +
      "</Bucket><Key>" + s3::XmlEscape(c.key) + "</Key><UploadId>" + s3::XmlEscape(id) +
      "</UploadId><Initiator><ID>xsilo</ID><DisplayName>xsilo</DisplayName>"
      "</Initiator>" +
      std::string(kOwnerXml) + "<StorageClass>STANDARD</StorageClass><PartNumberMarker>" +
      std::to_string(marker) + "</PartNumberMarker>";
  if (truncated) xml += "<NextPartNumberMarker>" + std::to_string(last) + "</NextPartNumberMarker>";
  xml += "<MaxParts>" + std::to_string(max_parts) + "</MaxParts><IsTruncated>" +
         (truncated ? "true" : "false") + "</IsTruncated>" + parts + "</ListPartsResult>";
  SendXml(c, 200, std::move(xml));
  return Status::OK();
}

Status S3Server::Impl::ListMultipartUploads(Ctx& c) {
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  auto q = [&](std::string_view n) {
    const std::string* v = c.Query(n);
    return v ? *v : std::string();
  };
  std::string prefix = q("prefix"), delimiter = q("delimiter");
  std::string key_marker = q("key-marker"), id_marker = q("upload-id-marker");
  const std::string* encoding = c.Query("encoding-type");
  if (encoding && *encoding != "url") {
    return S3Error("InvalidArgument", "Invalid Encoding Method specified in Request");
  }
  auto enc = [&](const std::string& s) {
    return s3::XmlEscape(encoding ? s3::UriEncode(s, false) : s);
  };
  int64_t max_uploads = 1000;
  XSILO_RETURN_IF_ERROR(ParseMaxItems(c.Query("max-uploads"), "max-uploads", &max_uploads));
  struct Listed {
    std::string key;
    std::string id;
    std::time_t initiated;
    uint64_t seq;
  };
  std::vector<Listed> all;
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    for (const auto& [id, u] : uploads) {
      if (u.bucket == c.bucket && u.key.compare(0, prefix.size(), prefix) == 0) {
        all.push_back({u.key, id, u.initiated, u.seq});
      }
    }
  }
  // By key, then by initiation (S3's order).
  std::sort(all.begin(), all.end(), [](const Listed& a, const Listed& b) {
    return a.key != b.key ? a.key < b.key : a.seq < b.seq;
  });
  // upload-id-marker counts only with key-marker: uploads of that key after it.
  uint64_t id_marker_seq = 0;
  bool id_marker_found = false;
  if (!key_marker.empty() && !id_marker.empty()) {
    for (const Listed& l : all) {
      if (l.key == key_marker && l.id == id_marker) {
        id_marker_seq = l.seq;
        id_marker_found = true;
      }
    }
  }
  auto past_marker = [&](size_t i) {
    if (key_marker.empty()) return true;
    if (all[i].key > key_marker) return true;
    return id_marker_found && all[i].key == key_marker && all[i].seq > id_marker_seq;
  };
  // A common prefix is skipped when the key marker lies inside it.
  Page page = Paginate(
      all.size(), [&](size_t i) -> const std::string& { return all[i].key; }, past_marker,
      key_marker, prefix, delimiter, max_uploads);
  std::string body, next_key, next_id;
  for (const PageItem& item : page.items) {
    if (!item.prefix.empty()) {
      next_key = item.prefix;
      next_id.clear();
      body += "<CommonPrefixes><Prefix>" + enc(item.prefix) + "</Prefix></CommonPrefixes>";
      continue;
    }
    const Listed& l = all[item.index];
    next_key = l.key;
    next_id = l.id;
    body += "<Upload><Key>" + enc(l.key) + "</Key><UploadId>" + s3::XmlEscape(l.id) +
            "</UploadId><Initiator><ID>xsilo</ID><DisplayName>xsilo</DisplayName></Initiator>" +
            std::string(kOwnerXml) + "<StorageClass>STANDARD</StorageClass><Initiated>" +
            s3::FormatIsoDate(l.initiated) + "</Initiated></Upload>";
  }
  std::string xml = "<ListMultipartUploadsResult" + std::string(kXmlns) + "><Bucket>" +
                    s3::XmlEscape(c.bucket) + "</Bucket><KeyMarker>" + enc(key_marker) +
                    "</KeyMarker><UploadIdMarker>" + s3::XmlEscape(id_marker) + "</UploadIdMarker>";
  if (page.truncated) {
    xml += "<NextKeyMarker>" + enc(next_key) + "</NextKeyMarker><NextUploadIdMarker>" +
           s3::XmlEscape(next_id) + "</NextUploadIdMarker>";
  }
  xml += "<Prefix>" + enc(prefix) + "</Prefix>";
  if (!delimiter.empty()) xml += "<Delimiter>" + enc(delimiter) + "</Delimiter>";
  if (encoding) xml += "<EncodingType>url</EncodingType>";
  xml += "<MaxUploads>" + std::to_string(max_uploads) + "</MaxUploads><IsTruncated>" +
         (page.truncated ? "true" : "false") + "</IsTruncated>" + body +
         "</ListMultipartUploadsResult>";
  SendXml(c, 200, std::move(xml));
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
    s3::DirectoryStoreOptions dso;
    dso.recycle_bytes = impl->opts.recycle_bytes;
    XSILO_ASSIGN_OR_RETURN(impl->store, s3::NewDirectoryObjectStore(impl->opts.directory, dso));
    if (dso.recycle_bytes > 0) {
      // Free files past their age go even when no request comes.
      Impl* i = impl.get();
      impl->trimmer = std::thread([i] {
        std::unique_lock<std::mutex> lock(i->trim_mu);
        while (!i->trim_cv.wait_for(lock, std::chrono::seconds(1), [i] { return i->trim_stop; })) {
          lock.unlock();
          i->store->Trim();
          lock.lock();
        }
      });
    }
  }
  for (const std::string& b : impl->opts.buckets) {
    if (!ValidBucketName(b)) return InvalidArgument("S3Server: invalid bucket name " + b);
    Status st = impl->store->CreateBucket(b);
    if (!st.ok() && S3ErrorCode(st) != "BucketAlreadyOwnedByYou") return st;
  }
  s3::HttpServerOptions ho;
  if (impl->opts.tls_cert_file.empty() != impl->opts.tls_key_file.empty()) {
    return InvalidArgument("S3Server: give both tls_cert_file and tls_key_file, or neither");
  }
  if (!impl->opts.tls_cert_file.empty()) {
    XSILO_ASSIGN_OR_RETURN(
        ho.tls, s3::TlsServerContext::Load(impl->opts.tls_cert_file, impl->opts.tls_key_file));
  }
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
  const char* scheme = impl_->opts.tls_cert_file.empty() ? "http://" : "https://";
  return scheme + host + ":" + std::to_string(port());
}
void S3Server::Stop() {
  impl_->http->Stop();
  impl_->StopTrimmer();
}

Status GenerateSelfSignedCertificate(const std::string& cert_file, const std::string& key_file,
                                     const std::vector<std::string>& hosts, int days) {
  return s3::GenerateSelfSignedCertificate(cert_file, key_file, hosts, days);
}

Status PutObjectInDirectory(const std::string& directory, const std::string& bucket,
                            const std::string& key, const GatherList& body, bool md5_etag) {
  if (directory.empty()) return InvalidArgument("PutObjectInDirectory: empty directory");
  if (key.empty() || key.size() > 1024) return InvalidArgument("invalid object key");
  XSILO_ASSIGN_OR_RETURN(auto store, s3::NewDirectoryObjectStore(directory));
  StoredObject obj;  // the ETag is computed while the bytes are written
  obj.etag_hash = md5_etag ? s3::EtagHash::kMd5 : s3::EtagHash::kXxh3;
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
