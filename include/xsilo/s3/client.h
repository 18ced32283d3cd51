// An S3 client over libcurl: SigV4 signing, path-style or virtual-hosted
// addressing, parallel multipart upload, parallel ranged download into one
// preallocated Buffer, presigned URLs.
//
// Every operation takes an arguments struct, validated before any I/O, and
// returns a Status or Result. S3 errors become Status values carrying the S3
// code (see xsilo/s3/errors.h). Requests run on a bounded pool of curl
// handles (kept alive between requests); parallel operations run on a
// bounded pool of worker threads owned by the client. The client is
// thread-safe.
//
//   S3ClientOptions o;
//   o.endpoint = "http://127.0.0.1:9000";
//   o.credentials = StaticCredentials({"AK", "SK"});
//   auto client = S3Client::Create(o);
//   XSILO_RETURN_IF_ERROR((*client)->PutObject({.bucket = "b", .key = "k", .body = bytes}));
//   auto got = (*client)->DownloadObject({.bucket = "b", .key = "k", .connections = 8});
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "xsilo/core/buffer.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/status.h"
#include "xsilo/s3/credentials.h"
#include "xsilo/s3/errors.h"

namespace xsilo {

class EncodeStream;

enum class S3Addressing {
  kAuto,         // virtual-hosted for *.amazonaws.com and DNS-safe bucket names, else path
  kPath,         // http://endpoint/bucket/key
  kVirtualHost,  // http://bucket.endpoint/key
};

struct S3ClientOptions {
  // Service URL, "http[s]://host[:port]". Default "" means
  // https://s3.<region>.amazonaws.com.
  std::string endpoint;
  // Region requests are signed for. Default "us-east-1".
  std::string region = "us-east-1";
  // Default kAuto.
  S3Addressing addressing = S3Addressing::kAuto;
  // Default nullptr: DefaultCredentialsChain() (environment, shared file).
  std::shared_ptr<S3CredentialsProvider> credentials;
  // Requests in flight at once (curl handles, each keeping its connection
  // alive) and worker threads for parallel operations. Default 16.
  int max_connections = 16;
  // Connection setup limit. Default 10 s.
  std::chrono::milliseconds connect_timeout{10000};
  // A request that moves no byte for this long fails with Timeout. Default 30 s.
  std::chrono::milliseconds stall_timeout{30000};
  // Whole-request limit; 0 (default) means none (stall_timeout still applies).
  std::chrono::milliseconds request_timeout{0};
  // Retries of a request that failed transiently (connection errors, 500,
  // 503). Default 3.
  int max_retries = 3;
  // First retry delay; doubles per attempt, with jitter. Default 100 ms.
  std::chrono::milliseconds retry_base_delay{100};
  // Sign payloads with their SHA-256 (one extra pass over the data) instead
  // of UNSIGNED-PAYLOAD. Default false.
  bool sign_payload = false;
  // TLS: verify the peer (default true) and an optional CA bundle.
  bool verify_tls = true;
  std::string ca_file;
};

struct S3ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // quoted, as S3 sends it
  std::time_t last_modified = 0;
  std::string content_type;
  std::string checksum_sha256;  // base64, when the server returned one
  std::vector<std::pair<std::string, std::string>> metadata;  // x-amz-meta-* headers
  // The standard headers stored with the object (see PutObjectArgs::headers),
  // names as S3 spells them.
  std::vector<std::pair<std::string, std::string>> headers;
};

struct CreateBucketArgs {
  std::string bucket;
  Status Validate() const;
};

struct BucketArgs {  // HeadBucket, DeleteBucket
  std::string bucket;
  Status Validate() const;
};

struct PutObjectArgs {
  std::string bucket;
  std::string key;
  // The bytes, sent in order without being flattened. Assign a Buffer with
  // body.Append(buffer) or a codec GatherList directly.
  GatherList body;
  std::string content_type;  // default "" (server: application/octet-stream)
  std::vector<std::pair<std::string, std::string>> metadata;  // sent as x-amz-meta-<name>
  // Standard headers S3 stores with the object and returns on GET / HEAD:
  // Cache-Control, Content-Disposition, Content-Encoding, Content-Language,
  // Expires (names case-insensitive; any other name fails Validate()).
  std::vector<std::pair<std::string, std::string>> headers;
  // Send x-amz-checksum-sha256 (the server verifies it and keeps it for
  // GET). Default false.
  bool checksum_sha256 = false;
  // Send Content-MD5 (the server verifies it). Default false.
  bool content_md5 = false;
  Status Validate() const;
};

struct PutObjectResult {
  std::string etag;
  std::string checksum_sha256;  // base64, when sent
};

struct GetObjectArgs {
  std::string bucket;
  std::string key;
  // Byte range [offset, offset + length); length nullopt (default) means to
  // the end of the object.
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  // Ask for the stored x-amz-checksum-sha256 and verify the bytes against it
  // when the server has one (whole-object reads only). Default false.
  bool verify_checksum = false;
  // When non-empty, the SHA-256 (base64) the whole object must have;
  // mismatch is Corrupt. Default "".
  std::string expected_sha256;
  // Conditions, sent when set and applied by the server in RFC 7232 order,
  // as S3 does. A failed If-Match / If-Unmodified-Since is
  // FailedPrecondition with S3 code PreconditionFailed (412); a matching
  // If-None-Match, or no change since If-Modified-Since, is
  // FailedPrecondition with S3 code NotModified (304).
  std::string if_match;       // an ETag (quoted, as returned) or "*"
  std::string if_none_match;  // an ETag or "*"
  std::time_t if_modified_since = 0;
  std::time_t if_unmodified_since = 0;
  Status Validate() const;
};

struct GetObjectResult {
  Buffer data;
  S3ObjectInfo info;
};

struct CopyObjectArgs {
  std::string source_bucket;
  std::string source_key;
  std::string bucket;  // the destination, may be the source's bucket
  std::string key;
  // false (default): the copy keeps the source's content type, metadata and
  // headers; true: they are replaced by the three fields below (S3's
  // x-amz-metadata-directive REPLACE; required to copy an object onto itself).
  bool replace_metadata = false;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<std::pair<std::string, std::string>> headers;  // as PutObjectArgs::headers
  // Copy only while the source has this ETag (x-amz-copy-source-if-match),
  // else FailedPrecondition (PreconditionFailed). Default "": unconditional.
  std::string source_if_match;
  Status Validate() const;
};

struct CopyObjectResult {
  std::string etag;  // of the copy
  std::time_t last_modified = 0;
};

struct ObjectArgs {  // HeadObject, DeleteObject
  std::string bucket;
  std::string key;
  Status Validate() const;
};

struct ListObjectsArgs {
  std::string bucket;
  std::string prefix;
  std::string delimiter;  // e.g. "/" to group keys into common prefixes
  std::string start_after;
  std::string continuation_token;  // from a previous truncated result
  int max_keys = 1000;             // per request, 1..1000
  bool fetch_all = false;          // follow continuation tokens to the end
  Status Validate() const;
};

struct ListObjectsResult {
  std::vector<S3ObjectInfo> objects;  // key, size, etag, last_modified
  std::vector<std::string> common_prefixes;
  bool truncated = false;
  std::string next_continuation_token;
};

struct ListUploadsArgs {  // ListMultipartUploads
  std::string bucket;
  std::string prefix;      // only uploads of keys starting with this
  int max_uploads = 1000;  // per request, 1..1000; every page is fetched
  Status Validate() const;
};

struct MultipartUploadInfo {
  std::string key;
  std::string upload_id;
  std::time_t initiated = 0;
};

struct PartInfo {
  int part_number = 0;
  uint64_t size = 0;
  std::string etag;  // quoted
  std::time_t last_modified = 0;
};

struct UploadObjectArgs {
  std::string bucket;
  std::string key;
  GatherList body;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<std::pair<std::string, std::string>> headers;  // as PutObjectArgs::headers
  // Objects larger than part_size go multipart, parts of part_size bytes
  // (the last may be smaller). S3 needs >= 5 MiB. Default 64 MiB.
  uint64_t part_size = 64ull << 20;
  // Parts in flight at once (bounded also by max_connections). Default 8.
  int concurrency = 8;
  // Send x-amz-checksum-sha256 with each part / the single PUT. Default false.
  bool checksum_sha256 = false;
  Status Validate() const;
};

struct DownloadObjectArgs {
  std::string bucket;
  std::string key;
  // Connections fetching ranges at once (bounded by max_connections). Default 8.
  int connections = 8;
  // Range size; 0 (default) means size / connections, at least 1 MiB and
  // at most 64 MiB.
  uint64_t range_size = 0;
  // Attempts per range after the first; each resumes at the first byte not
  // yet received. Default 5.
  int max_range_retries = 5;
  // First retry delay; doubles per attempt. Default 50 ms.
  std::chrono::milliseconds retry_base_delay{50};
  // Verify the downloaded bytes against the stored x-amz-checksum-sha256
  // when the server has one. Default false.
  bool verify_checksum = false;
  std::string expected_sha256;  // base64; when non-empty, must match
  Status Validate() const;
};

struct DownloadObjectResult {
  Buffer data;
  S3ObjectInfo info;
  uint64_t ranges = 0;         // range requests planned
  uint64_t range_retries = 0;  // retried (resumed) range requests
};

struct PresignArgs {
  std::string method = "GET";  // "GET", "PUT", "HEAD", "DELETE" or "POST"
  std::string bucket;
  std::string key;
  // Extra query parameters the URL carries and signs, e.g. {"uploadId", id}
  // and {"partNumber", "3"} for one part of a multipart upload.
  std::vector<std::pair<std::string, std::string>> query;
  std::chrono::seconds expires{3600};  // 1 s .. 7 days; default 1 hour
  std::time_t signing_time = 0;        // 0 (default): now
  Status Validate() const;
};

class S3Client {
 public:
  static Result<std::unique_ptr<S3Client>> Create(S3ClientOptions options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  Status CreateBucket(const CreateBucketArgs& args);
  Status HeadBucket(const BucketArgs& args);  // NotFound (NoSuchBucket) when absent
  Status DeleteBucket(const BucketArgs& args);

  Result<PutObjectResult> PutObject(const PutObjectArgs& args);
  Result<GetObjectResult> GetObject(const GetObjectArgs& args);
  Result<S3ObjectInfo> HeadObject(const ObjectArgs& args);  // NotFound (NoSuchKey) when absent
  Status DeleteObject(const ObjectArgs& args);              // OK when absent, as S3
  // Server-side copy (no bytes through the client), up to 5 GiB on AWS.
  Result<CopyObjectResult> CopyObject(const CopyObjectArgs& args);
  Result<ListObjectsResult> ListObjects(const ListObjectsArgs& args);

  // PUT, or a multipart upload with parts sent in parallel; a failed
  // multipart upload is aborted.
  Result<PutObjectResult> UploadObject(const UploadObjectArgs& args);
  // HEAD, then parallel ranged GETs writing straight into one Buffer.
  Result<DownloadObjectResult> DownloadObject(const DownloadObjectArgs& args);

  // A URL anyone can use, without credentials, until it expires.
  Result<std::string> PresignUrl(const PresignArgs& args);

  // The three steps of a multipart upload, for callers that hand the parts
  // to others (presigned "PUT ?partNumber=N&uploadId=ID" URLs).
  Result<std::string> CreateMultipartUpload(const ObjectArgs& args);  // the upload id
  Status AbortMultipartUpload(const ObjectArgs& args, const std::string& upload_id);
  // Uploads begun and neither completed nor aborted (e.g. left by a crashed
  // party: abort them to free their parts), by key then initiation time.
  Result<std::vector<MultipartUploadInfo>> ListMultipartUploads(const ListUploadsArgs& args);
  // The parts an upload holds so far, by part number (every page fetched).
  Result<std::vector<PartInfo>> ListParts(const ObjectArgs& args, const std::string& upload_id);

  const S3ClientOptions& options() const;
  struct Impl;

 private:
  explicit S3Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// How a credential-less transfer checks an https server. Plain http URLs
// ignore it.
struct UrlTlsOptions {
  std::string ca_file;  // PEM roots to verify the server with; "" = the system's
  bool verify = true;   // false: no verification (tests only)
};

// For a party without credentials: GET or PUT a (presigned) URL.
Result<Buffer> HttpGetUrl(const std::string& url,
                          std::chrono::milliseconds timeout = std::chrono::minutes(10),
                          const UrlTlsOptions& tls = {});
Status HttpPutUrl(const std::string& url, const GatherList& body,
                  std::chrono::milliseconds timeout = std::chrono::minutes(10),
                  const UrlTlsOptions& tls = {});

// GET of a (presigned) URL whose object is `size` bytes long, by ranges over
// `connections` parallel connections straight into one Buffer. A range that
// fails mid-way is retried with backoff (up to `max_range_retries` times)
// from the byte where it stopped. A signed URL covers any Range header.
struct UrlDownloadArgs {
  std::string url;
  uint64_t size = 0;
  int connections = 8;        // default 8
  int max_range_retries = 5;  // default 5
  std::chrono::milliseconds retry_base_delay{50};
  std::chrono::milliseconds timeout = std::chrono::minutes(10);  // per range request
  // When set, the result's storage comes from this pool and goes back to it
  // once the result's last view dies: a receiver of one big object after
  // another faults in no fresh memory after the first. Not owned.
  BufferPool* pool = nullptr;
  // When block_bytes > 0: the object's BlockChecksums at that block size
  // (one per block, all of them). Each block is checked as soon as its
  // last byte arrived, while the other ranges are still coming: a block
  // whose bytes fail fails the download with Corrupt, and no second pass
  // over the whole object is needed. Ranges (size / connections, at
  // least min_range_bytes) are whole blocks, each checked on its own
  // range's thread, but for an object of less than a block per
  // connection: a block is then checked by the thread that brings the
  // last range overlapping it. Not owned.
  uint64_t block_bytes = 0;
  std::span<const uint64_t> block_sums;
  UrlTlsOptions tls;
  // The least range (at most 64 MiB). 0 (default): by the server's link,
  // UrlMinRangeBytes of the least first-byte time of the last download by
  // URL from the same scheme, host and port in this process (1 MiB for
  // the first).
  uint64_t min_range_bytes = 0;
};
struct UrlDownloadResult {
  Buffer data;
  uint64_t ranges = 0;
  uint64_t range_retries = 0;
  uint64_t min_range_bytes = 0;  // the least range it used
};
Result<UrlDownloadResult> HttpGetUrlRanges(const UrlDownloadArgs& args);

// The least range of a download by URL from a server whose responses came
// `first_byte_s` after their requests (a round trip and the server's
// time, so a server slow to answer, 20 ms or more, counts as far: its
// small objects then take more requests; < 0: unknown): 64 KiB across a
// long link (20 ms or more), where
// one connection carries little (Bahrain's measured 6.9 MB/s) and an
// object of a few MiB is fetched fastest over every connection at once;
// else 1 MiB, where more requests only cost CPU (a 20 MB object on
// loopback took 18 ms in ranges of 644 KB against 16 ms in 1 MiB ones).
uint64_t UrlMinRangeBytes(double first_byte_s);

// The body of a CompleteMultipartUpload request naming parts 1..N by ETag.
std::string CompleteMultipartXml(const std::vector<std::string>& etags);

// A multipart upload through presigned URLs (no credentials): the body is
// cut into at most part_urls.size() parts of at least min_part_bytes (S3's
// 5 MiB; the last part may be smaller), PUT over up to `connections`
// parallel connections, then completed by POSTing the part list to
// complete_url. A part that fails is retried from its start (up to
// max_part_retries times). Returns the number of parts used.
struct UrlUploadArgs {
  std::vector<std::string> part_urls;  // part 1, 2, ...
  std::string complete_url;            // presigned "POST ?uploadId=ID"
  GatherList body;
  int connections = 8;
  uint64_t min_part_bytes = 5ull << 20;
  int max_part_retries = 3;
  std::chrono::milliseconds retry_base_delay{50};
  std::chrono::milliseconds timeout = std::chrono::minutes(10);  // per request
  UrlTlsOptions tls;
};
Result<uint64_t> HttpPutUrlParts(const UrlUploadArgs& args);

// The same upload of a body still being produced (an EncodeStream), so
// that its first parts are on the wire while the rest is encoded. Part 1
// holds head() (bytes that go before the body and are known only once it
// is finished: a safetensors header) and the body's first min_part_bytes,
// and goes last. Parts 2.. take the body as it is appended, each of at
// least min_part_bytes, sized to spread the body's Estimate() over the
// URLs left; what the body adds after the last of them goes, once it is
// finished, in parts over the URLs still left. Cancelled when the stream is
// abandoned: the parts sent stay with the upload, and a later
// HttpPutUrlParts over the same URLs replaces them (completing lists only
// its own parts).
struct UrlStreamUpload {
  UrlUploadArgs upload;  // `body` unused
  EncodeStream* body = nullptr;
  std::function<Result<GatherList>()> head;
};
struct UrlStreamResult {
  uint64_t parts = 0;
  uint64_t early_bytes = 0;  // body bytes in parts sent before it was finished
};
Result<UrlStreamResult> HttpPutUrlStream(const UrlStreamUpload& args);

}  // namespace xsilo
