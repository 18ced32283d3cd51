// An embedded S3-compatible object server.
//
// Serves the S3 REST API subset xsilo needs over plain HTTP/1.1: buckets
// (create, head, delete, list), objects (PUT, GET with Range and
// If-Match / If-None-Match / If-Modified-Since / If-Unmodified-Since and
// response-* overrides, HEAD, DELETE, DeleteObjects, CopyObject), the
// standard object headers and x-amz-meta-*, multipart uploads (create,
// upload part, upload part copy, complete, abort, list uploads, list
// parts), ListObjects V1 and V2, ListObjectVersions (buckets are
// unversioned). The operations table in docs/s3.md lists what is not
// served (501). Requests are authenticated with
// AWS Signature V4, either in the Authorization header or as a presigned
// URL whose X-Amz-Expires is enforced. Errors are S3 XML error documents.
// Objects live in memory or in a directory. See docs/s3.md.
//
//   S3ServerOptions o;
//   o.access_key = "AK"; o.secret_key = "SK";
//   auto server = S3Server::Start(o);          // port 0: ephemeral
//   if (!server.ok()) return server.status();
//   std::string url = (*server)->endpoint();   // "http://127.0.0.1:41234"
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "xsilo/core/codec.h"
#include "xsilo/core/status.h"

namespace xsilo {

// What the fault-injection hook sees of a request.
struct S3FaultRequest {
  std::string method;  // "GET"
  std::string path;    // raw request path, e.g. "/bucket/key"
  std::string range;   // the Range header, or ""
  std::string query;   // raw query string (after '?'), or ""
};

struct S3ServerOptions {
  // Address to bind (IPv4 literal). Default "127.0.0.1"; "0.0.0.0" for all.
  std::string host = "127.0.0.1";
  // Port to listen on; 0 (default) picks an ephemeral port (see port()).
  int port = 0;
  // Directory to keep objects in; empty (default) keeps them in memory.
  std::string directory;
  // Directory mode: the files of deleted objects of 8 MiB and more kept for
  // reuse by later PUTs, up to this many bytes, each for up to 30 s (on
  // tmpfs, writing into existing pages is about twice as fast as
  // allocating new ones). 0 (default): deletes unlink. The embedded server
  // of the hybrid backends sets 2 GiB.
  uint64_t recycle_bytes = 0;
  // The one credential the server accepts. Both are required unless
  // allow_anonymous is set.
  std::string access_key;
  std::string secret_key;
  // Region that requests must be signed for. Default "us-east-1".
  std::string region = "us-east-1";
  // Accept unsigned requests as well (signed ones are still verified).
  // Default false.
  bool allow_anonymous = false;
  // ETags as S3 defines them: the hex MD5 of a single-part object, MD5 of
  // the concatenated part MD5s plus "-<parts>" for a multipart one, which
  // S3 clients check (rclone, s3cmd, aws s3 sync). Default true. false: the
  // same shapes from the 128-bit XXH3, about twenty times cheaper, for a
  // server whose only clients are xsilo's, which never check ETags as MD5
  // (the hybrid backends' embedded server; xsilo verifies payloads with the
  // wire format's own checksum).
  bool md5_etags = true;
  // HTTPS: a PEM certificate chain and its key; both or neither. Empty
  // (default): plain HTTP, for loopback and tests. endpoint() then starts
  // with "https://", and clients verify the chain (S3ClientOptions::ca_file,
  // UrlTlsOptions::ca_file). GenerateSelfSignedCertificate makes a pair.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Buckets created at start (ignored if they already exist). Default none.
  std::vector<std::string> buckets;
  // Largest object a single PUT or a completed multipart upload may have.
  // Default 64 GiB.
  uint64_t max_object_bytes = 64ull << 30;
  // Largest single part of a multipart upload. Default 5 GiB (as S3).
  uint64_t max_part_bytes = 5ull << 30;
  // Smallest part except the last one of a multipart upload. Default 5 MiB (as S3).
  uint64_t min_part_bytes = 5ull << 20;
  // Largest request line plus headers. Default 64 KiB.
  uint64_t max_header_bytes = 64ull << 10;
  // Worker threads, i.e. connections served at once; more wait in a queue.
  // Default 64.
  int max_connections = 64;
  // How far X-Amz-Date may be from the server clock. Default 15 minutes.
  std::chrono::seconds max_clock_skew{900};
  // Longest presigned URL lifetime accepted. Default 7 days (as S3).
  std::chrono::seconds max_presign_expiry{604800};
  // Keep-alive connections idle longer than this are closed. Default 60 s.
  std::chrono::milliseconds idle_timeout{60000};
  // One blocked send or receive longer than this drops the connection.
  // Default 60 s.
  std::chrono::milliseconds io_timeout{60000};
  // If set, "<bucket>.<virtual_host_domain>[:port]" in the Host header
  // selects the bucket (virtual-hosted-style addressing); path style always
  // works. Default "" (path style only).
  std::string virtual_host_domain;
  // Test hook (fault injection): called for every response with a body; a
  // return value n >= 0 makes the server close the connection after sending
  // n bytes of that body. Default: none.
  std::function<int64_t(const S3FaultRequest&)> fault_drop_after_body_bytes;
  // Test hook (observer): called at the start of every request, from the
  // connection's worker thread. Default: none.
  std::function<void(const S3FaultRequest&)> on_request;
};

class S3Server {
 public:
  // Validates the options, opens the storage, binds and starts serving.
  static Result<std::unique_ptr<S3Server>> Start(S3ServerOptions options);
  ~S3Server();  // stops
  S3Server(const S3Server&) = delete;
  S3Server& operator=(const S3Server&) = delete;

  // The bound port (the ephemeral one when options.port was 0).
  int port() const;
  // "http://<host>:<port>" ("https://" with TLS), 127.0.0.1 for a wildcard bind.
  std::string endpoint() const;
  // Closes every connection and joins the threads; idempotent.
  void Stop();

  struct Impl;

 private:
  explicit S3Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Stores an object straight into `directory`, the storage of an S3Server
// on this machine started with S3ServerOptions::directory, as a PUT would
// (temporary file, then an atomic rename: the server serves it at once).
// For a party co-located with its object server: no HTTP, no socket copy,
// and on a tmpfs directory the bytes are not charged to the caller's RSS.
// NotFound (NoSuchBucket) when the bucket does not exist. The ETag is
// computed while the bytes are written: MD5, or XXH3 with md5_etag false
// (as S3ServerOptions::md5_etags).
// Writes a self-signed certificate for `hosts` (IP literals and DNS names;
// at least one) and its key (mode 0600), valid for `days`: for a local job's
// HTTPS, where the certificate is also the CA file clients trust.
Status GenerateSelfSignedCertificate(const std::string& cert_file, const std::string& key_file,
                                     const std::vector<std::string>& hosts, int days = 30);

Status PutObjectInDirectory(const std::string& directory, const std::string& bucket,
                            const std::string& key, const GatherList& body, bool md5_etag = true);

// Reads an object straight from such a directory: a private (copy-on-write)
// mapping of its file, no HTTP and no copy; the mapping stays valid after
// the object is deleted. NotFound (NoSuchKey / NoSuchBucket) when absent.
Result<Buffer> GetObjectFromDirectory(const std::string& directory, const std::string& bucket,
                                      const std::string& key);

}  // namespace xsilo
