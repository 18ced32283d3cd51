// What the parts of the embedded S3 server (server*.cpp) share: one request
// being served (Ctx), the multipart uploads in progress (Upload, Part), the
// helpers more than one part uses, and the server's state (S3Server::Impl).
//
//   server.cpp            routing, errors, start and stop
//   server_auth.cpp       SigV4 (header and presigned), reading the body
//   server_conditions.cpp Range, preconditions, write conditions (pure)
//   server_buckets.cpp    bucket operations and the object listings
//   server_objects.cpp    PUT, GET/HEAD, DELETE and copy of an object
//   server_multipart.cpp  multipart uploads
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/xxh3.h"
#include "net/http_server.h"
#include "s3/checksums.h"
#include "s3/errors.h"
#include "s3/object_store.h"
#include "s3/request_body.h"
#include "s3/server_conditions.h"
#include "s3/sigv4.h"
#include "xsilo/s3/server.h"

namespace xsilo {
namespace s3server {

using net::BodyReader;
using net::HttpRequest;
using net::HttpResponse;
using s3::ObjectEntry;
using s3::Params;
using s3::PutCondition;
using s3::S3Error;
using s3::StoredObject;

constexpr std::string_view kXmlHeader = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
constexpr std::string_view kXmlns = " xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"";
constexpr std::string_view kOwnerXml =
    "<Owner><ID>xsilo</ID><DisplayName>xsilo</DisplayName></Owner>";
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

inline bool AllDigits(std::string_view s, size_t max_len) {
  return !s.empty() && s.size() <= max_len &&
         std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

// Objects (server_objects.cpp).
std::vector<Buffer> SliceSegments(const std::vector<Buffer>& segs, uint64_t offset, uint64_t len);
// The response headers of a stored checksum: x-amz-checksum-<algorithm>.
Params ChecksumHeaders(const std::string& algorithm, const std::string& value);
// The standard headers of a request that S3 keeps with an object.
Params StoredHeaders(const HttpRequest& req);
// The x-amz-meta-* headers of a request.
Params UserMetadata(const HttpRequest& req);

// Buckets and listings (server_buckets.cpp).
bool ValidBucketName(const std::string& b);
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
              const std::string& prefix, const std::string& delimiter, int64_t max_items);
// max-keys, max-uploads, max-parts: at most 1000.
Status ParseMaxItems(const std::string* v, std::string_view name, int64_t* out);

}  // namespace s3server

struct S3Server::Impl {
  using Ctx = s3server::Ctx;
  using Upload = s3server::Upload;
  using BodyReader = s3server::BodyReader;
  using HttpRequest = s3server::HttpRequest;
  using HttpResponse = s3server::HttpResponse;
  using StoredObject = s3server::StoredObject;

  S3ServerOptions opts;
  std::unique_ptr<s3::ObjectStore> store;
  std::unique_ptr<net::HttpServer> http;
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

  // server.cpp
  void Handle(const HttpRequest& req, BodyReader& body, HttpResponse* resp);
  Status Route(Ctx& c);
  void SendError(Ctx& c, const Status& st);
  void SendXml(Ctx& c, int status, std::string xml);

  // server_auth.cpp
  Status Authenticate(Ctx& c);
  // Reads and verifies the body (s3/request_body.h); limit in decoded bytes.
  Result<s3::RequestBody> ReadBody(Ctx& c, s3::BodyOptions options);
  Result<Buffer> ReadXmlBody(Ctx& c, bool header_checksums = true);
  s3::EtagHash etag_hash() const {
    return opts.md5_etags ? s3::EtagHash::kMd5 : s3::EtagHash::kXxh3;
  }

  // server_buckets.cpp
  Status ListBuckets(Ctx& c);
  Status CreateBucket(Ctx& c);
  Status DeleteBucket(Ctx& c);
  Status GetBucketLocation(Ctx& c);
  Status ListObjects(Ctx& c);
  Status ListObjectVersions(Ctx& c);
  Status DeleteObjects(Ctx& c);

  // server_objects.cpp
  Status PutObject(Ctx& c);
  Status GetObject(Ctx& c);
  Status DeleteObject(Ctx& c);
  Result<StoredObject> ReadCopySource(Ctx& c, std::string* bucket, std::string* key);
  Status CopyObject(Ctx& c);

  // server_multipart.cpp
  Status CreateUpload(Ctx& c);
  Status UploadPart(Ctx& c);
  Status UploadPartCopy(Ctx& c, int part);
  Status ListParts(Ctx& c);
  Status ListMultipartUploads(Ctx& c);
  Status CompleteUpload(Ctx& c);
  static std::string CompleteResultXml(const Ctx& c, const std::string& etag,
                                       const std::string& checksum_xml);
  Status AbortUpload(Ctx& c);
};

}  // namespace xsilo
