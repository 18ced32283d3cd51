#include "xsilo/s3/client.h"

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "s3/crypto.h"
#include "s3/errors.h"
#include "s3/sigv4.h"
#include "s3/xml.h"
#include "s3/xml_bodies.h"
#include "xsilo/core/base64.h"

namespace xsilo {

using s3::Params;

// ---------------------------------------------------------------- validation

namespace {

Status ValidateBucket(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) {
    return InvalidArgument("bucket name must be 3..63 characters: '" + b + "'");
  }
  for (char c : b) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) {
      return InvalidArgument("bucket name may hold only a-z 0-9 - .: '" + b + "'");
    }
  }
  return Status::OK();
}

Status ValidateKey(const std::string& k) {
  if (k.empty()) return InvalidArgument("object key must not be empty");
  if (k.size() > 1024) return InvalidArgument("object key longer than 1024 bytes");
  return Status::OK();
}

Status ValidateObject(const std::string& b, const std::string& k) {
  XSILO_RETURN_IF_ERROR(ValidateBucket(b));
  return ValidateKey(k);
}

Status ValidateGather(const GatherList& g) {
  uint64_t sum = 0;
  for (const Buffer& b : g.segments) sum += b.size();
  if (sum != g.size) return InvalidArgument("GatherList size does not match its segments");
  return Status::OK();
}

Status ValidateMetadata(const std::vector<std::pair<std::string, std::string>>& md) {
  for (const auto& [k, v] : md) {
    if (k.empty() || k.find_first_of(" :\r\n") != std::string::npos ||
        v.find_first_of("\r\n") != std::string::npos) {
      return InvalidArgument("metadata names must be tokens and values single-line: " + k);
    }
  }
  return Status::OK();
}

// The standard headers S3 stores with an object, as S3 spells them.
constexpr std::string_view kStoredHeaderNames[] = {
    "Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language", "Expires"};

bool SameNameIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// Sent with S3's spelling, whatever the caller's case (names are signed
// lowercase either way).
void AddStoredHeaders(const std::vector<std::pair<std::string, std::string>>& headers,
                      Params* out) {
  for (const auto& [k, v] : headers) {
    std::string name = k;
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    out->emplace_back(std::move(name), v);
  }
}

Status ValidateStoredHeaders(const std::vector<std::pair<std::string, std::string>>& headers) {
  for (const auto& [k, v] : headers) {
    bool known = std::any_of(std::begin(kStoredHeaderNames), std::end(kStoredHeaderNames),
                             [&](std::string_view n) { return SameNameIgnoringCase(k, n); });
    if (!known) {
      return InvalidArgument("headers: " + k +
                             " is not one S3 stores (Cache-Control, Content-Disposition, "
                             "Content-Encoding, Content-Language, Expires)");
    }
    if (v.find_first_of("\r\n") != std::string::npos) {
      return InvalidArgument("headers: the value of " + k + " must be one line");
    }
  }
  return Status::OK();
}

}  // namespace

Status CreateBucketArgs::Validate() const { return ValidateBucket(bucket); }
Status BucketArgs::Validate() const { return ValidateBucket(bucket); }
Status ObjectArgs::Validate() const { return ValidateObject(bucket, key); }

Status PutObjectArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateObject(bucket, key));
  XSILO_RETURN_IF_ERROR(ValidateMetadata(metadata));
  XSILO_RETURN_IF_ERROR(ValidateStoredHeaders(headers));
  if (body.size > (5ull << 30)) {
    return InvalidArgument("a single PUT is limited to 5 GiB; use UploadObject");
  }
  return ValidateGather(body);
}

Status GetObjectArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateObject(bucket, key));
  if (length && *length == 0) return InvalidArgument("range length must be > 0");
  if (length && offset + *length < offset) return InvalidArgument("range overflows");
  if ((if_match + if_none_match).find_first_of("\r\n") != std::string::npos) {
    return InvalidArgument("if_match / if_none_match must be one line");
  }
  if (!expected_sha256.empty()) {
    auto d = Base64Decode(expected_sha256);
    if (!d || d->size() != 32) return InvalidArgument("expected_sha256 must be base64 of 32 bytes");
  }
  return Status::OK();
}

Status CopyObjectArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateObject(source_bucket, source_key));
  XSILO_RETURN_IF_ERROR(ValidateObject(bucket, key));
  XSILO_RETURN_IF_ERROR(ValidateMetadata(metadata));
  XSILO_RETURN_IF_ERROR(ValidateStoredHeaders(headers));
  if (!replace_metadata && (!content_type.empty() || !metadata.empty() || !headers.empty())) {
    return InvalidArgument(
        "CopyObject: content_type, metadata and headers apply only with replace_metadata");
  }
  if (!replace_metadata && source_bucket == bucket && source_key == key) {
    return InvalidArgument("CopyObject: copying an object onto itself needs replace_metadata");
  }
  return Status::OK();
}

Status ListUploadsArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateBucket(bucket));
  if (max_uploads < 1 || max_uploads > 1000) return InvalidArgument("max_uploads must be 1..1000");
  return Status::OK();
}

Status ListObjectsArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateBucket(bucket));
  if (max_keys < 1 || max_keys > 1000) return InvalidArgument("max_keys must be 1..1000");
  return Status::OK();
}

Status UploadObjectArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateObject(bucket, key));
  XSILO_RETURN_IF_ERROR(ValidateMetadata(metadata));
  XSILO_RETURN_IF_ERROR(ValidateStoredHeaders(headers));
  XSILO_RETURN_IF_ERROR(ValidateGather(body));
  if (part_size < (5ull << 20) || part_size > (5ull << 30)) {
    return InvalidArgument("part_size must be 5 MiB .. 5 GiB");
  }
  if (concurrency < 1) return InvalidArgument("concurrency must be >= 1");
  if ((body.size + part_size - 1) / part_size > 10000) {
    return InvalidArgument("more than 10000 parts; raise part_size");
  }
  return Status::OK();
}

Status DownloadObjectArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateObject(bucket, key));
  if (connections < 1) return InvalidArgument("connections must be >= 1");
  if (max_range_retries < 0) return InvalidArgument("max_range_retries must be >= 0");
  if (!expected_sha256.empty()) {
    auto d = Base64Decode(expected_sha256);
    if (!d || d->size() != 32) return InvalidArgument("expected_sha256 must be base64 of 32 bytes");
  }
  return Status::OK();
}

Status PresignArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateObject(bucket, key));
  if (method != "GET" && method != "PUT" && method != "HEAD" && method != "DELETE" &&
      method != "POST") {
    return InvalidArgument("presign method must be GET, PUT, HEAD, DELETE or POST");
  }
  for (const auto& [k, v] : query) {
    if (k.empty() || k.rfind("X-Amz-", 0) == 0 || k.rfind("x-amz-", 0) == 0) {
      return InvalidArgument("presign query parameter '" + k + "' is empty or reserved");
    }
  }
  if (expires.count() < 1 || expires.count() > 604800) {
    return InvalidArgument("presigned URL expiry must be 1 s .. 7 days");
  }
  return Status::OK();
}

// ------------------------------------------------------------------ plumbing

namespace {

void GlobalCurlInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Endpoint {
  std::string scheme;  // "http" / "https"
  std::string host;
  int port = 0;  // 0: scheme default
  bool aws = false;
  std::string HostPort(const std::string& bucket_prefix = "") const {
    std::string h = bucket_prefix.empty() ? host : bucket_prefix + "." + host;
    return port ? h + ":" + std::to_string(port) : h;
  }
};

Result<Endpoint> ParseEndpoint(const std::string& url) {
  Endpoint e;
  size_t sep = url.find("://");
  if (sep == std::string::npos) return InvalidArgument("endpoint needs a scheme: " + url);
  e.scheme = url.substr(0, sep);
  if (e.scheme != "http" && e.scheme != "https") {
    return InvalidArgument("endpoint scheme must be http or https: " + url);
  }
  std::string rest = url.substr(sep + 3);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) {
    return InvalidArgument("endpoint must not have a path: " + url);
  }
  size_t colon = rest.rfind(':');
  if (colon != std::string::npos && rest.find(']') == std::string::npos) {
    std::string p = rest.substr(colon + 1);
    if (p.empty() || p.size() > 5 || !std::all_of(p.begin(), p.end(), ::isdigit)) {
      return InvalidArgument("bad port in endpoint: " + url);
    }
    e.port = std::stoi(p);
    rest = rest.substr(0, colon);
    if ((e.scheme == "http" && e.port == 80) || (e.scheme == "https" && e.port == 443)) e.port = 0;
  }
  if (rest.empty()) return InvalidArgument("endpoint has no host: " + url);
  e.host = rest;
  e.aws = rest.size() > 14 && rest.compare(rest.size() - 14, 14, ".amazonaws.com") == 0;
  return e;
}

// A bounded pool of worker threads, spawned lazily.
class WorkerPool {
 public:
  explicit WorkerPool(int max_threads) : max_(max_threads) {}
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void Submit(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
    if (idle_ < static_cast<int>(queue_.size()) && static_cast<int>(threads_.size()) < max_) {
      threads_.emplace_back([this] { Loop(); });
    }
    cv_.notify_one();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ++idle_;
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;  // stopping
      auto fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }
  int max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  bool stop_ = false;
};

// Waits for N tasks.
class Latch {
 public:
  explicit Latch(int n) : n_(n) {}
  void CountDown() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--n_ == 0) cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return n_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
};

// A bounded pool of curl easy handles; a handle keeps its connection alive
// for the next request that takes it.
class HandlePool {
 public:
  explicit HandlePool(int max, size_t max_idle = SIZE_MAX) : max_(max), max_idle_(max_idle) {}
  ~HandlePool() {
    for (CURL* h : free_) curl_easy_cleanup(h);
  }
  CURL* Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !free_.empty() || created_ < max_; });
    if (!free_.empty()) {
      CURL* h = free_.back();
      free_.pop_back();
      return h;
    }
    ++created_;
    lock.unlock();
    return curl_easy_init();
  }
  void Release(CURL* h) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (free_.size() >= max_idle_) {
        --created_;
      } else {
        free_.push_back(h);
        h = nullptr;
      }
    }
    if (h) curl_easy_cleanup(h);  // closes its connections
    cv_.notify_one();
  }

 private:
  int max_;
  size_t max_idle_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<CURL*> free_;
  int created_ = 0;
};

GatherList SliceGather(const GatherList& g, uint64_t offset, uint64_t len) {
  GatherList out;
  for (const Buffer& s : g.segments) {
    if (len == 0) break;
    if (offset >= s.size()) {
      offset -= s.size();
      continue;
    }
    uint64_t n = std::min(len, s.size() - offset);
    out.Append(s.SliceUnchecked(offset, n));
    len -= n;
    offset = 0;
  }
  return out;
}

s3::Sha256Digest Sha256Of(const GatherList& g) {
  s3::Sha256Stream s;
  for (const Buffer& b : g.segments) s.Update(b.data(), b.size());
  return s.Finish();
}

s3::Md5Digest Md5Of(const GatherList& g) {
  s3::Md5Stream s;
  for (const Buffer& b : g.segments) s.Update(b.data(), b.size());
  return s.Finish();
}

std::time_t ParseHttpDate(const std::string& s) {
  std::tm tm{};
  if (!strptime(s.c_str(), "%a, %d %b %Y %H:%M:%S", &tm)) return 0;
  return timegm(&tm);
}

// One request to send.
struct Call {
  std::string method;
  std::string bucket;
  std::string key;
  Params query;
  Params headers;                    // extra headers; all signed
  const GatherList* body = nullptr;  // request body (PUT/POST)
  std::string text_body;             // used when body is null and has_text_body
  bool has_text_body = false;
  // 2xx body sink: a caller-owned region, or (allocate_body) a Buffer sized
  // by Content-Length; otherwise small bodies go to Reply::text.
  uint8_t* dest = nullptr;
  uint64_t dest_capacity = 0;
  bool allocate_body = false;
  int expect_status = 0;  // non-zero: any other 2xx is an error
  int max_retries = -1;   // -1: the client's option
};

struct Reply {
  int status = 0;
  Params headers;  // lowercase names
  Buffer body;
  std::string text;
  uint64_t received = 0;
  const std::string* Header(std::string_view name) const {
    for (const auto& [k, v] : headers) {
      if (k == name) return &v;
    }
    return nullptr;
  }
};

struct Transfer {
  const Call* call;
  Reply* reply;
  size_t seg = 0;
  uint64_t seg_off = 0;
  uint64_t text_off = 0;
  bool decided = false;
  bool to_text = false;
  Status sink_error;
};

size_t HeaderCallback(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(data, size * n);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  if (line.rfind("HTTP/", 0) == 0) {
    size_t sp = line.find(' ');
    t->reply->status =
        sp == std::string_view::npos ? 0 : std::atoi(std::string(line.substr(sp + 1, 3)).c_str());
    t->reply->headers.clear();
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    std::string_view v = line.substr(colon + 1);
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    t->reply->headers.emplace_back(std::move(name), std::string(v));
  }
  return size * n;
}

size_t WriteCallback(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t len = size * n;
  Reply* r = t->reply;
  const Call* c = t->call;
  if (!t->decided) {
    t->decided = true;
    bool success = r->status >= 200 && r->status < 300;
    t->to_text = !success || (c->dest == nullptr && !c->allocate_body);
    if (success && c->expect_status != 0 && r->status != c->expect_status) {
      t->sink_error = Internal("HTTP " + std::to_string(r->status) + " where " +
                               std::to_string(c->expect_status) + " was expected");
      return 0;
    }
    if (!t->to_text && c->allocate_body) {
      const std::string* cl = r->Header("content-length");
      if (!cl) {
        t->to_text = true;  // unknown length: collect, copy once at the end
      } else {
        auto b = Buffer::Allocate(std::strtoull(cl->c_str(), nullptr, 10));
        if (!b.ok()) {
          t->sink_error = b.status();
          return 0;
        }
        r->body = std::move(b).value();
      }
    }
  }
  if (t->to_text) {
    if (!(c->allocate_body && r->status < 300) && r->text.size() + len > (16u << 20)) {
      t->sink_error = ResourceExhausted("response body too large for a text reply");
      return 0;
    }
    r->text.append(data, len);
    r->received += len;
    return len;
  }
  uint8_t* base = c->dest ? c->dest : r->body.mutable_data();
  uint64_t cap = c->dest ? c->dest_capacity : r->body.size();
  if (r->received + len > cap) {
    t->sink_error = Corrupt("server sent more bytes than announced/requested");
    return 0;
  }
  std::memcpy(base + r->received, data, len);
  r->received += len;
  return len;
}

size_t ReadCallback(char* out, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t want = size * n, done = 0;
  const Call* c = t->call;
  if (c->body == nullptr) {
    size_t k = std::min<uint64_t>(want, c->text_body.size() - t->text_off);
    std::memcpy(out, c->text_body.data() + t->text_off, k);
    t->text_off += k;
    return k;
  }
  const auto& segs = c->body->segments;
  while (done < want && t->seg < segs.size()) {
    const Buffer& b = segs[t->seg];
    uint64_t k = std::min<uint64_t>(want - done, b.size() - t->seg_off);
    std::memcpy(out + done, b.data() + t->seg_off, k);
    done += k;
    t->seg_off += k;
    if (t->seg_off == b.size()) {
      ++t->seg;
      t->seg_off = 0;
    }
  }
  return done;
}

// Rewinds an upload body: curl calls this to resend a request that a reused
// connection dropped before any reply.
int SeekCallback(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0) return CURL_SEEKFUNC_CANTSEEK;
  const Call* c = t->call;
  uint64_t off = static_cast<uint64_t>(offset);
  if (c->body == nullptr) {
    if (off > c->text_body.size()) return CURL_SEEKFUNC_FAIL;
    t->text_off = off;
    return CURL_SEEKFUNC_OK;
  }
  const auto& segs = c->body->segments;
  t->seg = 0;
  while (t->seg < segs.size() && off >= segs[t->seg].size()) off -= segs[t->seg++].size();
  if (t->seg == segs.size() && off > 0) return CURL_SEEKFUNC_FAIL;
  t->seg_off = off;
  return CURL_SEEKFUNC_OK;
}

Status CurlStatus(CURLcode code, const char* errbuf, const Call& call) {
  std::string where = " (" + call.method + " " + call.bucket + "/" + call.key + ")";
  std::string msg = std::string("curl: ") + (errbuf[0] ? errbuf : curl_easy_strerror(code)) + where;
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT:
      return Timeout(msg);
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
      return Unavailable(msg);
    case CURLE_PEER_FAILED_VERIFICATION:
      return PermissionDenied(msg);
    default:
      return Internal(msg);
  }
}

bool Transient(const Status& st, int http_status) {
  if (http_status == 500 || http_status == 502 || http_status == 503 || http_status == 504) {
    return true;
  }
  return http_status == 0 &&
         (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kTimeout);
}

}  // namespace

// ---------------------------------------------------------------- the client

struct S3Client::Impl {
  S3ClientOptions opts;
  Endpoint endpoint;
  HandlePool handles;
  WorkerPool workers;
  std::mutex rng_mu;
  std::mt19937_64 rng{std::random_device{}()};

  explicit Impl(S3ClientOptions o, Endpoint e)
      : opts(std::move(o)),
        endpoint(std::move(e)),
        handles(opts.max_connections),
        workers(opts.max_connections) {}

  bool VirtualHost(const std::string& bucket) const {
    if (bucket.empty()) return false;
    if (opts.addressing == S3Addressing::kPath) return false;
    if (opts.addressing == S3Addressing::kVirtualHost) return true;
    return endpoint.aws && bucket.find('.') == std::string::npos;
  }
  // Host header value and the encoded path for a bucket/key.
  void Locate(const std::string& bucket, const std::string& key, std::string* host,
              std::string* path) const {
    if (VirtualHost(bucket)) {
      *host = endpoint.HostPort(bucket);
      *path = "/" + s3::UriEncode(key, false);
    } else {
      *host = endpoint.HostPort();
      *path = bucket.empty() ? "/"
                             : "/" + bucket + (key.empty() ? "" : "/" + s3::UriEncode(key, false));
      if (!bucket.empty() && key.empty()) *path = "/" + bucket;
    }
  }

  std::chrono::milliseconds Backoff(int attempt, std::chrono::milliseconds base) {
    int64_t ms = base.count() << std::min(attempt, 10);
    ms = std::min<int64_t>(ms, 5000);
    std::lock_guard<std::mutex> lock(rng_mu);
    return std::chrono::milliseconds(ms / 2 + static_cast<int64_t>(rng() % (ms / 2 + 1)));
  }

  Status Perform(CURL* h, const Call& call, Reply* reply);
  Status Execute(const Call& call, Reply* reply);
  Status HttpError(const Call& call, const Reply& reply) const;
  Result<PutObjectResult> Put(const std::string& bucket, const std::string& key,
                              const GatherList& body, const std::string& content_type,
                              const std::vector<std::pair<std::string, std::string>>& metadata,
                              const Params& headers, bool checksum, bool md5, Params query);
};

Status S3Client::Impl::HttpError(const Call& call, const Reply& reply) const {
  std::string code = s3::XmlText(reply.text, "Code").value_or("");
  std::string message = s3::XmlText(reply.text, "Message").value_or("");
  if (code.empty()) {
    switch (reply.status) {
      case 404:
        code = call.key.empty() ? "NoSuchBucket" : "NoSuchKey";
        break;
      case 403:
        code = "AccessDenied";
        break;
      case 416:
        code = "InvalidRange";
        break;
      case 304:
        code = "NotModified";
        break;
      case 412:
        code = "PreconditionFailed";
        break;
      case 503:
        code = "ServiceUnavailable";
        break;
      default:
        code = reply.status >= 500 ? "InternalError" : "HttpError" + std::to_string(reply.status);
    }
  }
  if (message.empty()) message = "HTTP " + std::to_string(reply.status);
  s3::S3ErrorKind kind = s3::LookupS3Error(code, reply.status);
  return Status(kind.status_code, code + ": " + message + " (" + call.method + " " + call.bucket +
                                      (call.key.empty() ? "" : "/" + call.key) + ", HTTP " +
                                      std::to_string(reply.status) + ")");
}

Status S3Client::Impl::Perform(CURL* h, const Call& call, Reply* reply) {
  XSILO_ASSIGN_OR_RETURN(S3Credentials creds, opts.credentials->Get());
  curl_easy_reset(h);
  std::string host, path;
  Locate(call.bucket, call.key, &host, &path);
  std::string query = s3::CanonicalQuery(call.query);
  std::string url = endpoint.scheme + "://" + host + path + (query.empty() ? "" : "?" + query);

  uint64_t body_size =
      call.body ? call.body->size : (call.has_text_body ? call.text_body.size() : 0);
  std::string payload_hash;
  if (call.body == nullptr && !call.has_text_body) {
    payload_hash = std::string(s3::kEmptySha256Hex);
  } else if (opts.sign_payload || call.has_text_body) {
    payload_hash = call.body ? s3::Hex(Sha256Of(*call.body)) : s3::Hex(s3::Sha256(call.text_body));
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

  curl_slist* list = nullptr;
  for (const auto& [k, v] : parts.headers) list = curl_slist_append(list, (k + ": " + v).c_str());
  std::string authz = "Authorization: AWS4-HMAC-SHA256 Credential=" + creds.access_key_id + "/" +
                      scope + ", SignedHeaders=" + signed_headers + ", Signature=" + sig;
  list = curl_slist_append(list, authz.c_str());
  list = curl_slist_append(list, "Expect:");
  list = curl_slist_append(list, "Accept:");
  if (call.method == "POST" && call.body == nullptr && !call.has_text_body) {
    list = curl_slist_append(list, "Content-Type:");
  }

  Transfer t{&call, reply};
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opts.connect_timeout.count()));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME,
                   std::max<long>(1, static_cast<long>(opts.stall_timeout.count() / 1000)));
  if (opts.request_timeout.count() > 0) {
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(opts.request_timeout.count()));
  }
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 1L << 20);
  curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 2L << 20);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, HeaderCallback);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, WriteCallback);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_READFUNCTION, ReadCallback);
  curl_easy_setopt(h, CURLOPT_READDATA, &t);
  curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, SeekCallback);
  curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
  if (!opts.verify_tls) {
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!opts.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, opts.ca_file.c_str());
  if (call.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (call.method == "PUT") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body_size));
  } else if (call.method == "POST") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body_size));
  } else if (call.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, call.method.c_str());
  }
  CURLcode rc = curl_easy_perform(h);
  curl_slist_free_all(list);
  if (!t.sink_error.ok()) return t.sink_error;
  if (rc != CURLE_OK) {
    reply->status = 0;
    return CurlStatus(rc, errbuf, call);
  }
  if (reply->status >= 200 && reply->status < 300 && call.allocate_body && !t.decided) {
    // No body bytes arrived: an empty object (or a HEAD).
    reply->body = Buffer();
  } else if (reply->status < 300 && call.allocate_body && t.to_text) {
    reply->body = Buffer::CopyFrom(reply->text);
    reply->text.clear();
  }
  if (reply->status >= 200 && reply->status < 300 && call.allocate_body &&
      reply->received != reply->body.size()) {
    return Unavailable("response body ended after " + std::to_string(reply->received) + " of " +
                       std::to_string(reply->body.size()) + " bytes");
  }
  return Status::OK();
}

Status S3Client::Impl::Execute(const Call& call, Reply* reply) {
  int max_retries = call.max_retries >= 0 ? call.max_retries : opts.max_retries;
  for (int attempt = 0;; ++attempt) {
    *reply = Reply();
    CURL* h = handles.Acquire();
    Status st = Perform(h, call, reply);
    handles.Release(h);
    if (st.ok() && reply->status >= 200 && reply->status < 300) return Status::OK();
    Status err = st.ok() ? HttpError(call, *reply) : st;
    if (!st.ok() && reply->status >= 300) err = HttpError(call, *reply);
    if (attempt >= max_retries || !Transient(err, st.ok() ? reply->status : 0) ||
        call.dest != nullptr) {
      return err;
    }
    std::this_thread::sleep_for(Backoff(attempt, opts.retry_base_delay));
  }
}

namespace {
S3ObjectInfo InfoFromHeaders(const std::string& key, const Reply& r) {
  S3ObjectInfo info;
  info.key = key;
  if (const std::string* v = r.Header("content-range")) {
    size_t slash = v->rfind('/');
    if (slash != std::string::npos && (*v)[slash + 1] != '*')
      info.size = std::strtoull(v->c_str() + slash + 1, nullptr, 10);
  } else if (const std::string* cl = r.Header("content-length")) {
    info.size = std::strtoull(cl->c_str(), nullptr, 10);
  }
  if (const std::string* v = r.Header("etag")) info.etag = *v;
  if (const std::string* v = r.Header("content-type")) info.content_type = *v;
  if (const std::string* v = r.Header("last-modified")) info.last_modified = ParseHttpDate(*v);
  if (const std::string* v = r.Header("x-amz-checksum-sha256")) info.checksum_sha256 = *v;
  for (const auto& [k, v] : r.headers) {
    if (k.rfind("x-amz-meta-", 0) == 0) info.metadata.emplace_back(k.substr(11), v);
    for (std::string_view name : kStoredHeaderNames) {
      if (SameNameIgnoringCase(k, name)) info.headers.emplace_back(std::string(name), v);
    }
  }
  return info;
}

Status VerifySha256(const uint8_t* data, uint64_t size, const std::string& want_b64,
                    const std::string& what) {
  s3::Sha256Digest d = s3::Sha256({data, static_cast<size_t>(size)});
  std::string got = s3::Base64Of(d);
  if (got != want_b64) {
    return Corrupt("BadDigest: SHA-256 of the received bytes (" + got + ") differs from the " +
                   what + " (" + want_b64 + ")");
  }
  return Status::OK();
}
}  // namespace

Result<PutObjectResult> S3Client::Impl::Put(
    const std::string& bucket, const std::string& key, const GatherList& body,
    const std::string& content_type,
    const std::vector<std::pair<std::string, std::string>>& metadata, const Params& headers,
    bool checksum, bool md5, Params query) {
  Call c;
  c.method = "PUT";
  c.bucket = bucket;
  c.key = key;
  c.body = &body;
  c.query = std::move(query);
  if (!content_type.empty()) c.headers.emplace_back("content-type", content_type);
  for (const auto& [k, v] : metadata) {
    std::string name = k;
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    c.headers.emplace_back("x-amz-meta-" + name, v);
  }
  AddStoredHeaders(headers, &c.headers);
  PutObjectResult result;
  if (checksum) {
    result.checksum_sha256 = s3::Base64Of(Sha256Of(body));
    c.headers.emplace_back("x-amz-checksum-sha256", result.checksum_sha256);
  }
  if (md5) c.headers.emplace_back("content-md5", s3::Base64Of(Md5Of(body)));
  Reply r;
  XSILO_RETURN_IF_ERROR(Execute(c, &r));
  if (const std::string* e = r.Header("etag")) result.etag = *e;
  return result;
}

Result<std::unique_ptr<S3Client>> S3Client::Create(S3ClientOptions options) {
  if (options.region.empty()) return InvalidArgument("S3ClientOptions.region must not be empty");
  if (options.max_connections < 1) return InvalidArgument("max_connections must be >= 1");
  if (options.max_retries < 0) return InvalidArgument("max_retries must be >= 0");
  if (options.endpoint.empty())
    options.endpoint = "https://s3." + options.region + ".amazonaws.com";
  XSILO_ASSIGN_OR_RETURN(Endpoint e, ParseEndpoint(options.endpoint));
  if (!options.credentials) options.credentials = DefaultCredentialsChain();
  GlobalCurlInit();
  return std::unique_ptr<S3Client>(
      new S3Client(std::make_unique<Impl>(std::move(options), std::move(e))));
}

S3Client::S3Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
S3Client::~S3Client() = default;
const S3ClientOptions& S3Client::options() const { return impl_->opts; }

Status S3Client::CreateBucket(const CreateBucketArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "PUT";
  c.bucket = args.bucket;
  if (impl_->opts.region != "us-east-1") {
    c.has_text_body = true;
    c.text_body =
        "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
        "<LocationConstraint>" +
        s3::XmlEscape(impl_->opts.region) + "</LocationConstraint></CreateBucketConfiguration>";
  }
  Reply r;
  return impl_->Execute(c, &r);
}

Status S3Client::HeadBucket(const BucketArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "HEAD";
  c.bucket = args.bucket;
  Reply r;
  return impl_->Execute(c, &r);
}

Status S3Client::DeleteBucket(const BucketArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "DELETE";
  c.bucket = args.bucket;
  Reply r;
  return impl_->Execute(c, &r);
}

Result<PutObjectResult> S3Client::PutObject(const PutObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  return impl_->Put(args.bucket, args.key, args.body, args.content_type, args.metadata,
                    args.headers, args.checksum_sha256, args.content_md5, {});
}

Result<GetObjectResult> S3Client::GetObject(const GetObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "GET";
  c.bucket = args.bucket;
  c.key = args.key;
  c.allocate_body = true;
  bool ranged = args.offset > 0 || args.length.has_value();
  if (ranged) {
    std::string range = "bytes=" + std::to_string(args.offset) + "-";
    if (args.length) range += std::to_string(args.offset + *args.length - 1);
    c.headers.emplace_back("range", range);
  }
  if (args.verify_checksum) c.headers.emplace_back("x-amz-checksum-mode", "ENABLED");
  if (!args.if_match.empty()) c.headers.emplace_back("if-match", args.if_match);
  if (!args.if_none_match.empty()) c.headers.emplace_back("if-none-match", args.if_none_match);
  if (args.if_modified_since != 0) {
    c.headers.emplace_back("if-modified-since", s3::FormatHttpDate(args.if_modified_since));
  }
  if (args.if_unmodified_since != 0) {
    c.headers.emplace_back("if-unmodified-since", s3::FormatHttpDate(args.if_unmodified_since));
  }
  Reply r;
  XSILO_RETURN_IF_ERROR(impl_->Execute(c, &r));
  GetObjectResult out;
  out.info = InfoFromHeaders(args.key, r);
  out.data = std::move(r.body);
  if (ranged && r.status == 200 &&
      (args.offset > 0 || (args.length && *args.length < out.data.size()))) {
    // The server ignored the Range header: keep only what was asked for.
    uint64_t end =
        args.length ? std::min(out.data.size(), args.offset + *args.length) : out.data.size();
    if (args.offset >= out.data.size()) return OutOfRange("InvalidRange: offset past the end");
    out.data = out.data.SliceUnchecked(args.offset, end - args.offset);
  }
  if (!ranged) {
    if (args.verify_checksum && !out.info.checksum_sha256.empty()) {
      XSILO_RETURN_IF_ERROR(VerifySha256(out.data.data(), out.data.size(), out.info.checksum_sha256,
                                         "stored x-amz-checksum-sha256"));
    }
    if (!args.expected_sha256.empty()) {
      XSILO_RETURN_IF_ERROR(VerifySha256(out.data.data(), out.data.size(), args.expected_sha256,
                                         "expected checksum"));
    }
  } else if (!args.expected_sha256.empty()) {
    XSILO_RETURN_IF_ERROR(
        VerifySha256(out.data.data(), out.data.size(), args.expected_sha256, "expected checksum"));
  }
  return out;
}

Result<S3ObjectInfo> S3Client::HeadObject(const ObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "HEAD";
  c.bucket = args.bucket;
  c.key = args.key;
  c.headers.emplace_back("x-amz-checksum-mode", "ENABLED");
  Reply r;
  XSILO_RETURN_IF_ERROR(impl_->Execute(c, &r));
  return InfoFromHeaders(args.key, r);
}

Status S3Client::DeleteObject(const ObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "DELETE";
  c.bucket = args.bucket;
  c.key = args.key;
  Reply r;
  return impl_->Execute(c, &r);
}

Result<CopyObjectResult> S3Client::CopyObject(const CopyObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "PUT";
  c.bucket = args.bucket;
  c.key = args.key;
  c.headers.emplace_back("x-amz-copy-source",
                         s3::UriEncode("/" + args.source_bucket + "/" + args.source_key, false));
  if (args.replace_metadata) {
    c.headers.emplace_back("x-amz-metadata-directive", "REPLACE");
    if (!args.content_type.empty()) c.headers.emplace_back("content-type", args.content_type);
    for (const auto& [k, v] : args.metadata) {
      std::string name = k;
      std::transform(name.begin(), name.end(), name.begin(), ::tolower);
      c.headers.emplace_back("x-amz-meta-" + name, v);
    }
    AddStoredHeaders(args.headers, &c.headers);
  }
  if (!args.source_if_match.empty()) {
    c.headers.emplace_back("x-amz-copy-source-if-match", args.source_if_match);
  }
  Reply r;
  XSILO_RETURN_IF_ERROR(impl_->Execute(c, &r));
  // S3 may answer 200 and report a failure in the body.
  if (r.text.find("<Error>") != std::string::npos) return impl_->HttpError(c, r);
  CopyObjectResult out;
  out.etag = s3::XmlText(r.text, "ETag").value_or("");
  out.last_modified = s3::ParseIsoDate(s3::XmlText(r.text, "LastModified").value_or(""));
  if (out.etag.empty()) return Internal("CopyObject: no ETag in the response");
  return out;
}

Result<ListObjectsResult> S3Client::ListObjects(const ListObjectsArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  ListObjectsResult out;
  std::string token = args.continuation_token;
  while (true) {
    Call c;
    c.method = "GET";
    c.bucket = args.bucket;
    c.query = {
        {"list-type", "2"}, {"encoding-type", "url"}, {"max-keys", std::to_string(args.max_keys)}};
    if (!args.prefix.empty()) c.query.emplace_back("prefix", args.prefix);
    if (!args.delimiter.empty()) c.query.emplace_back("delimiter", args.delimiter);
    if (!args.start_after.empty()) c.query.emplace_back("start-after", args.start_after);
    if (!token.empty()) c.query.emplace_back("continuation-token", token);
    Reply r;
    XSILO_RETURN_IF_ERROR(impl_->Execute(c, &r));
    XSILO_RETURN_IF_ERROR(s3::ParseListObjectsV2(r.text, &out));
    if (!args.fetch_all || !out.truncated || out.next_continuation_token.empty()) break;
    token = out.next_continuation_token;
  }
  if (args.fetch_all) {
    out.truncated = false;
    out.next_continuation_token.clear();
  }
  return out;
}

namespace {
Result<std::string> StartMultipart(S3Client::Impl& impl, const std::string& bucket,
                                   const std::string& key, const std::string& content_type,
                                   const std::vector<std::pair<std::string, std::string>>& metadata,
                                   const Params& headers) {
  Call create;
  create.method = "POST";
  create.bucket = bucket;
  create.key = key;
  create.query = {{"uploads", ""}};
  if (!content_type.empty()) create.headers.emplace_back("content-type", content_type);
  for (const auto& [k, v] : metadata) {
    std::string name = k;
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    create.headers.emplace_back("x-amz-meta-" + name, v);
  }
  AddStoredHeaders(headers, &create.headers);
  Reply cr;
  XSILO_RETURN_IF_ERROR(impl.Execute(create, &cr));
  std::string upload_id = s3::XmlText(cr.text, "UploadId").value_or("");
  if (upload_id.empty()) return Internal("CreateMultipartUpload: no UploadId in the response");
  return upload_id;
}
}  // namespace

std::string CompleteMultipartXml(const std::vector<std::string>& etags) {
  std::string xml = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  for (size_t i = 0; i < etags.size(); ++i) {
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" +
           s3::XmlEscape(etags[i]) + "</ETag></Part>";
  }
  xml += "</CompleteMultipartUpload>";
  return xml;
}

Result<std::string> S3Client::CreateMultipartUpload(const ObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  return StartMultipart(*impl_, args.bucket, args.key, "", {}, {});
}

Result<std::vector<MultipartUploadInfo>> S3Client::ListMultipartUploads(
    const ListUploadsArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  std::vector<MultipartUploadInfo> out;
  std::string key_marker, id_marker;
  while (true) {
    Call c;
    c.method = "GET";
    c.bucket = args.bucket;
    c.query = {{"uploads", ""}, {"max-uploads", std::to_string(args.max_uploads)}};
    if (!args.prefix.empty()) c.query.emplace_back("prefix", args.prefix);
    if (!key_marker.empty()) c.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) c.query.emplace_back("upload-id-marker", id_marker);
    Reply r;
    XSILO_RETURN_IF_ERROR(impl_->Execute(c, &r));
    if (r.text.find("<ListMultipartUploadsResult") == std::string::npos) {
      return Internal("ListMultipartUploads: unexpected response body");
    }
    s3::XmlForEach(r.text, "Upload", [&](std::string_view item) {
      MultipartUploadInfo u;
      u.key = s3::XmlText(item, "Key").value_or("");
      u.upload_id = s3::XmlText(item, "UploadId").value_or("");
      u.initiated = s3::ParseIsoDate(s3::XmlText(item, "Initiated").value_or(""));
      out.push_back(std::move(u));
    });
    if (s3::XmlText(r.text, "IsTruncated").value_or("false") != "true") break;
    std::string next_key = s3::XmlText(r.text, "NextKeyMarker").value_or("");
    std::string next_id = s3::XmlText(r.text, "NextUploadIdMarker").value_or("");
    if (next_key.empty() || (next_key == key_marker && next_id == id_marker)) {
      return Internal("ListMultipartUploads: truncated listing without a new marker");
    }
    key_marker = std::move(next_key);
    id_marker = std::move(next_id);
  }
  return out;
}

Result<std::vector<PartInfo>> S3Client::ListParts(const ObjectArgs& args,
                                                  const std::string& upload_id) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  if (upload_id.empty()) return InvalidArgument("ListParts: empty upload id");
  std::vector<PartInfo> out;
  std::string marker;
  while (true) {
    Call c;
    c.method = "GET";
    c.bucket = args.bucket;
    c.key = args.key;
    c.query = {{"uploadId", upload_id}};
    if (!marker.empty()) c.query.emplace_back("part-number-marker", marker);
    Reply r;
    XSILO_RETURN_IF_ERROR(impl_->Execute(c, &r));
    if (r.text.find("<ListPartsResult") == std::string::npos) {
      return Internal("ListParts: unexpected response body");
    }
    s3::XmlForEach(r.text, "Part", [&](std::string_view item) {
      PartInfo p;
      p.part_number = std::atoi(s3::XmlText(item, "PartNumber").value_or("0").c_str());
      p.size = std::strtoull(s3::XmlText(item, "Size").value_or("0").c_str(), nullptr, 10);
      p.etag = s3::XmlText(item, "ETag").value_or("");
      p.last_modified = s3::ParseIsoDate(s3::XmlText(item, "LastModified").value_or(""));
      out.push_back(std::move(p));
    });
    if (s3::XmlText(r.text, "IsTruncated").value_or("false") != "true") break;
    std::string next = s3::XmlText(r.text, "NextPartNumberMarker").value_or("");
    if (next.empty() || next == marker) {
      return Internal("ListParts: truncated listing without a new marker");
    }
    marker = std::move(next);
  }
  return out;
}

Status S3Client::AbortMultipartUpload(const ObjectArgs& args, const std::string& upload_id) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  if (upload_id.empty()) return InvalidArgument("AbortMultipartUpload: empty upload id");
  Call a;
  a.method = "DELETE";
  a.bucket = args.bucket;
  a.key = args.key;
  a.query = {{"uploadId", upload_id}};
  Reply ar;
  return impl_->Execute(a, &ar);
}

Result<PutObjectResult> S3Client::UploadObject(const UploadObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Impl& impl = *impl_;
  if (args.body.size <= args.part_size) {
    return impl.Put(args.bucket, args.key, args.body, args.content_type, args.metadata,
                    args.headers, args.checksum_sha256, false, {});
  }
  XSILO_ASSIGN_OR_RETURN(
      std::string upload_id,
      StartMultipart(impl, args.bucket, args.key, args.content_type, args.metadata, args.headers));

  // Parts, in parallel.
  const uint64_t n_parts = (args.body.size + args.part_size - 1) / args.part_size;
  std::vector<std::string> etags(n_parts);
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex err_mu;
  Status first_error;
  int n_workers = static_cast<int>(
      std::min<uint64_t>({static_cast<uint64_t>(args.concurrency),
                          static_cast<uint64_t>(impl.opts.max_connections), n_parts}));
  Latch latch(n_workers);
  for (int w = 0; w < n_workers; ++w) {
    impl.workers.Submit([&] {
      while (!failed.load()) {
        uint64_t i = next.fetch_add(1);
        if (i >= n_parts) break;
        uint64_t off = i * args.part_size;
        GatherList part =
            SliceGather(args.body, off, std::min(args.part_size, args.body.size - off));
        auto put = impl.Put(args.bucket, args.key, part, "", {}, {}, args.checksum_sha256, false,
                            {{"partNumber", std::to_string(i + 1)}, {"uploadId", upload_id}});
        if (!put.ok()) {
          std::lock_guard<std::mutex> lock(err_mu);
          if (first_error.ok())
            first_error = put.status().WithContext("part " + std::to_string(i + 1));
          failed = true;
          break;
        }
        etags[i] = put->etag;
      }
      latch.CountDown();
    });
  }
  latch.Wait();

  auto abort = [&] { (void)AbortMultipartUpload({args.bucket, args.key}, upload_id); };
  if (failed) {
    abort();
    return first_error.WithContext("multipart upload aborted");
  }
  // Complete.
  Call done;
  done.method = "POST";
  done.bucket = args.bucket;
  done.key = args.key;
  done.query = {{"uploadId", upload_id}};
  done.has_text_body = true;
  done.headers.emplace_back("content-type", "application/xml");
  done.text_body = CompleteMultipartXml(etags);
  Reply dr;
  Status st = impl.Execute(done, &dr);
  if (st.ok() && dr.text.find("<Error>") != std::string::npos) {
    // S3 may report a failed completion inside a 200 response.
    st = impl.HttpError(done, Reply{500, {}, {}, dr.text, 0});
  }
  if (!st.ok()) {
    abort();
    return st.WithContext("CompleteMultipartUpload");
  }
  PutObjectResult result;
  result.etag = s3::XmlText(dr.text, "ETag").value_or("");
  return result;
}

Result<DownloadObjectResult> S3Client::DownloadObject(const DownloadObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Impl& impl = *impl_;
  XSILO_ASSIGN_OR_RETURN(S3ObjectInfo info, HeadObject({args.bucket, args.key}));
  DownloadObjectResult out;
  const uint64_t size = info.size;
  XSILO_ASSIGN_OR_RETURN(out.data, Buffer::Allocate(size));
  out.info = info;
  if (size > 0) {
    uint64_t range = args.range_size;
    if (range == 0) {
      range = (size + args.connections - 1) / args.connections;
      range = std::clamp<uint64_t>(range, 1ull << 20, 64ull << 20);
    }
    const uint64_t n_ranges = (size + range - 1) / range;
    out.ranges = n_ranges;
    std::atomic<uint64_t> next{0}, retries{0};
    std::atomic<bool> failed{false};
    std::mutex err_mu;
    Status first_error;
    uint8_t* base = out.data.mutable_data();
    int n_workers = static_cast<int>(
        std::min<uint64_t>({static_cast<uint64_t>(args.connections),
                            static_cast<uint64_t>(impl.opts.max_connections), n_ranges}));
    Latch latch(n_workers);
    auto fetch_range = [&](uint64_t start, uint64_t len) -> Status {
      uint64_t done = 0;
      for (int attempt = 0;; ++attempt) {
        Call c;
        c.method = "GET";
        c.bucket = args.bucket;
        c.key = args.key;
        c.headers.emplace_back("range", "bytes=" + std::to_string(start + done) + "-" +
                                            std::to_string(start + len - 1));
        if (!info.etag.empty()) c.headers.emplace_back("if-match", info.etag);
        c.dest = base + start + done;
        c.dest_capacity = len - done;
        c.expect_status = (start + done == 0 && len - done == size) ? 0 : 206;
        c.max_retries = 0;
        Reply r;
        Status st = impl.Execute(c, &r);
        done += r.received;  // resume after whatever arrived, even on failure
        if (st.ok() && done == len) return Status::OK();
        if (st.ok()) st = Unavailable("range ended early at byte " + std::to_string(start + done));
        bool retryable = r.status == 0 || r.status >= 500 || (r.status >= 200 && r.status < 300);
        if (!retryable || attempt >= args.max_range_retries || failed.load()) {
          return st.WithContext("range " + std::to_string(start) + "+" + std::to_string(len) +
                                " after " + std::to_string(attempt) + " retries");
        }
        retries.fetch_add(1);
        std::this_thread::sleep_for(impl.Backoff(attempt, args.retry_base_delay));
      }
    };
    for (int w = 0; w < n_workers; ++w) {
      impl.workers.Submit([&] {
        while (!failed.load()) {
          uint64_t i = next.fetch_add(1);
          if (i >= n_ranges) break;
          uint64_t start = i * range;
          Status st = fetch_range(start, std::min(range, size - start));
          if (!st.ok()) {
            std::lock_guard<std::mutex> lock(err_mu);
            if (first_error.ok()) first_error = st;
            failed = true;
          }
        }
        latch.CountDown();
      });
    }
    latch.Wait();
    out.range_retries = retries.load();
    if (failed) return first_error;
  }
  if (args.verify_checksum && !info.checksum_sha256.empty()) {
    XSILO_RETURN_IF_ERROR(
        VerifySha256(out.data.data(), size, info.checksum_sha256, "stored x-amz-checksum-sha256"));
  }
  if (!args.expected_sha256.empty()) {
    XSILO_RETURN_IF_ERROR(
        VerifySha256(out.data.data(), size, args.expected_sha256, "expected checksum"));
  }
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

// ------------------------------------------------------- credential-less use

namespace {
// Handles for credential-less transfers, shared by the whole process: a
// handle keeps its connections open, so the next range or part to the same
// server skips the TCP handshake (a round trip on a long link).
HandlePool& UrlHandles() {
  static HandlePool* pool = new HandlePool(4096, 256);  // never destroyed: used until exit
  return *pool;
}

// `call` names the method (GET, PUT or POST), the URL (in `key`), extra
// headers, the body (GatherList or text) and where a 2xx body goes.
Status PlainTransfer(const Call& call, std::chrono::milliseconds timeout, Reply* reply) {
  GlobalCurlInit();
  CURL* h = UrlHandles().Acquire();
  if (!h) return Internal("curl_easy_init failed");
  curl_easy_reset(h);  // keeps the handle's open connections
  const std::string& method = call.method;
  const std::string& url = call.key;
  const uint64_t body_size =
      call.body ? call.body->size : (call.has_text_body ? call.text_body.size() : 0);
  Transfer t{&call, reply};
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_slist* list = curl_slist_append(nullptr, "Expect:");
  for (const auto& [k, v] : call.headers) list = curl_slist_append(list, (k + ": " + v).c_str());
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 1L << 20);
  curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 2L << 20);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, HeaderCallback);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, WriteCallback);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_READFUNCTION, ReadCallback);
  curl_easy_setopt(h, CURLOPT_READDATA, &t);
  curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, SeekCallback);
  curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
  if (method == "PUT") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body_size));
  } else if (method == "POST") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body_size));
  } else if (method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  CURLcode rc = curl_easy_perform(h);
  curl_slist_free_all(list);
  UrlHandles().Release(h);
  if (!t.sink_error.ok()) return t.sink_error;
  if (rc != CURLE_OK) return CurlStatus(rc, errbuf, call);
  if (reply->status >= 300) {
    std::string code =
        s3::XmlText(reply->text, "Code").value_or("HttpError" + std::to_string(reply->status));
    std::string message =
        s3::XmlText(reply->text, "Message").value_or("HTTP " + std::to_string(reply->status));
    s3::S3ErrorKind kind = s3::LookupS3Error(code, reply->status);
    return Status(kind.status_code, code + ": " + message + " (" + method +
                                        " presigned URL, HTTP " + std::to_string(reply->status) +
                                        ")");
  }
  if (call.allocate_body && t.to_text) {
    reply->body = Buffer::CopyFrom(reply->text);
  } else if (call.allocate_body && reply->received != reply->body.size()) {
    return Unavailable("response body ended early");
  } else if (call.dest && reply->received != call.dest_capacity) {
    return Unavailable("response body ended early");
  }
  return Status::OK();
}
// Sleeps before retry `attempt` (0-based): base * 2^attempt, jittered into
// [half, full].
void SleepBeforeRetry(std::chrono::milliseconds base, int attempt) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  const int64_t ms = base.count() << std::min(attempt, 10);
  std::this_thread::sleep_for(
      std::chrono::milliseconds(ms / 2 + static_cast<int64_t>(rng() % (ms / 2 + 1))));
}

// Runs fn(i, failed) for every i in [0, n) on up to `threads` threads. After
// the first failure no new item starts (`failed` also tells running ones to
// stop retrying); returns that first failure.
Status ParallelForEach(uint64_t n, int threads,
                       const std::function<Status(uint64_t, const std::atomic<bool>&)>& fn) {
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex err_mu;
  Status first_error;
  std::vector<std::thread> workers;
  const int n_workers = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(threads), n));
  for (int w = 0; w < n_workers; ++w) {
    workers.emplace_back([&] {
      while (!failed.load()) {
        const uint64_t i = next.fetch_add(1);
        if (i >= n) break;
        Status st = fn(i, failed);
        if (!st.ok()) {
          std::lock_guard<std::mutex> lock(err_mu);
          if (first_error.ok()) first_error = st;
          failed = true;
        }
      }
    });
  }
  for (auto& t : workers) t.join();
  return first_error;
}
}  // namespace

Result<Buffer> HttpGetUrl(const std::string& url, std::chrono::milliseconds timeout) {
  Call c;
  c.method = "GET";
  c.key = url;
  c.allocate_body = true;
  Reply r;
  XSILO_RETURN_IF_ERROR(PlainTransfer(c, timeout, &r));
  return std::move(r.body);
}

Status HttpPutUrl(const std::string& url, const GatherList& body,
                  std::chrono::milliseconds timeout) {
  XSILO_RETURN_IF_ERROR(ValidateGather(body));
  Call c;
  c.method = "PUT";
  c.key = url;
  c.body = &body;
  Reply r;
  return PlainTransfer(c, timeout, &r);
}

Result<UrlDownloadResult> HttpGetUrlRanges(const UrlDownloadArgs& args) {
  if (args.url.empty()) return InvalidArgument("HttpGetUrlRanges: empty URL");
  if (args.connections < 1 || args.connections > 256) {
    return InvalidArgument("HttpGetUrlRanges: connections must be in [1, 256]");
  }
  UrlDownloadResult out;
  XSILO_ASSIGN_OR_RETURN(out.data, Buffer::Allocate(args.size));
  if (args.size == 0) {
    XSILO_ASSIGN_OR_RETURN(Buffer whole, HttpGetUrl(args.url, args.timeout));
    if (whole.size() != 0) return Corrupt("object is not empty as announced");
    return out;
  }
  const uint64_t size = args.size;
  uint64_t range = (size + args.connections - 1) / args.connections;
  range = std::clamp<uint64_t>(range, 1ull << 20, 64ull << 20);
  const uint64_t n_ranges = (size + range - 1) / range;
  out.ranges = n_ranges;
  std::atomic<uint64_t> retries{0};
  uint8_t* base = out.data.mutable_data();
  auto fetch_range = [&](uint64_t i, const std::atomic<bool>& failed) -> Status {
    const uint64_t start = i * range, len = std::min(range, size - start);
    uint64_t done = 0;
    for (int attempt = 0;; ++attempt) {
      Call c;
      c.method = "GET";
      c.key = args.url;
      c.headers.emplace_back(
          "Range", "bytes=" + std::to_string(start + done) + "-" + std::to_string(start + len - 1));
      c.dest = base + start + done;
      c.dest_capacity = len - done;
      c.expect_status = 206;
      Reply r;
      Status st = PlainTransfer(c, args.timeout, &r);
      if (r.status >= 200 && r.status < 300) done += r.received;  // resume after what arrived
      if (st.ok() && done == len) return Status::OK();
      if (st.ok()) st = Unavailable("range ended early at byte " + std::to_string(start + done));
      bool retryable = r.status == 0 || r.status >= 500 || (r.status >= 200 && r.status < 300);
      if (!retryable || attempt >= args.max_range_retries || failed.load()) {
        return st.WithContext("range " + std::to_string(start) + "+" + std::to_string(len) +
                              " after " + std::to_string(attempt) + " retries");
      }
      retries.fetch_add(1);
      SleepBeforeRetry(args.retry_base_delay, attempt);
    }
  };
  Status st = ParallelForEach(n_ranges, args.connections, fetch_range);
  out.range_retries = retries.load();
  if (!st.ok()) return st;
  return out;
}

Result<uint64_t> HttpPutUrlParts(const UrlUploadArgs& args) {
  if (args.part_urls.empty()) return InvalidArgument("HttpPutUrlParts: no part URLs");
  if (args.complete_url.empty()) return InvalidArgument("HttpPutUrlParts: no completion URL");
  if (args.connections < 1 || args.connections > 256) {
    return InvalidArgument("HttpPutUrlParts: connections must be in [1, 256]");
  }
  XSILO_RETURN_IF_ERROR(ValidateGather(args.body));
  const uint64_t size = args.body.size;
  const uint64_t wanted = size / std::max<uint64_t>(args.min_part_bytes, 1);
  const uint64_t most = std::clamp<uint64_t>(wanted, 1, args.part_urls.size());
  const uint64_t part = std::max<uint64_t>((size + most - 1) / most, 1);
  const uint64_t n_parts = size == 0 ? 1 : (size + part - 1) / part;
  std::vector<std::string> etags(n_parts);
  auto put_part = [&](uint64_t i, const std::atomic<bool>& failed) -> Status {
    const uint64_t off = i * part;
    GatherList slice = SliceGather(args.body, off, std::min(part, size - off));
    for (int attempt = 0;; ++attempt) {
      Call c;
      c.method = "PUT";
      c.key = args.part_urls[i];
      c.body = &slice;
      Reply r;
      Status st = PlainTransfer(c, args.timeout, &r);
      if (st.ok()) {
        const std::string* etag = r.Header("etag");
        if (etag && !etag->empty()) {
          etags[i] = *etag;
          return Status::OK();
        }
        st = Internal("the server returned no ETag");
      }
      bool retryable = r.status == 0 || r.status >= 500;
      if (!retryable || attempt >= args.max_part_retries || failed.load()) {
        return st.WithContext("part " + std::to_string(i + 1) + " after " +
                              std::to_string(attempt) + " retries");
      }
      SleepBeforeRetry(args.retry_base_delay, attempt);
    }
  };
  XSILO_RETURN_IF_ERROR(ParallelForEach(n_parts, args.connections, put_part));

  Call done;
  done.method = "POST";
  done.key = args.complete_url;
  done.has_text_body = true;
  done.text_body = CompleteMultipartXml(etags);
  done.headers.emplace_back("Content-Type", "application/xml");
  Reply r;
  XSILO_RETURN_IF_ERROR(PlainTransfer(done, args.timeout, &r).WithContext("completing the upload"));
  if (r.text.find("<Error>") != std::string::npos) {  // S3 may fail inside a 200
    return Unavailable("completing the upload: " + r.text.substr(0, 512));
  }
  return n_parts;
}

}  // namespace xsilo
