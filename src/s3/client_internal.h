// What the parts of the S3 client (client*.cpp) share: the validation of
// names, one request (Call) and its Reply, the curl callbacks that perform
// it, the bounded pools, and the client's state (S3Client::Impl).
#pragma once

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "net/crypto.h"
#include "s3/errors.h"
#include "s3/sigv4.h"
#include "s3/xml.h"
#include "s3/xml_bodies.h"
#include "xsilo/core/base64.h"
#include "xsilo/s3/client.h"

namespace xsilo {
namespace s3client {

using s3::Params;

// Names and arguments (client_args.cpp).
Status ValidateBucket(const std::string& b);
Status ValidateKey(const std::string& k);
Status ValidateObject(const std::string& b, const std::string& k);
Status ValidateGather(const GatherList& g);
Status ValidateMetadata(const std::vector<std::pair<std::string, std::string>>& md);
Status ValidateStoredHeaders(const std::vector<std::pair<std::string, std::string>>& headers);
// The standard headers S3 stores with an object, as S3 spells them.
constexpr std::string_view kStoredHeaderNames[] = {
    "Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language", "Expires"};
bool SameNameIgnoringCase(std::string_view a, std::string_view b);
// Sent with S3's spelling, whatever the caller's case (names are signed
// lowercase either way).
void AddStoredHeaders(const std::vector<std::pair<std::string, std::string>>& headers, Params* out);

// Request plumbing (client.cpp).
void GlobalCurlInit();

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

Result<Endpoint> ParseEndpoint(const std::string& url);

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

GatherList SliceGather(const GatherList& g, uint64_t offset, uint64_t len);
net::Sha256Digest Sha256Of(const GatherList& g);
net::Md5Digest Md5Of(const GatherList& g);
std::time_t ParseHttpDate(const std::string& s);

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
  // With dest: called after each piece of the body was written there, with
  // the bytes received so far (from dest).
  std::function<void(uint64_t received)> on_data;
};

struct Reply {
  int status = 0;
  Params headers;  // lowercase names
  Buffer body;
  std::string text;
  uint64_t received = 0;
  // Seconds from the request sent to the first byte of the response (a
  // round trip plus the server's time), where the transport measured it.
  double first_byte_s = -1;
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

// A request signed with SigV4 in its headers (client_signing.cpp): the URL
// and every header to send, Authorization last.
struct SignedRequest {
  std::string url;
  Params headers;
};

// The options every request of this client sets on a handle (both the
// signed requests and the credential-less URL transfers): no signals, the
// error buffer, TCP_NODELAY, 1-2 MiB socket buffers, and the callbacks that
// move the body through `t`.
void SetTransferOptions(CURL* h, Transfer* t, char* errbuf);

// Sleeps before retry `attempt` (0-based): base * 2^attempt, at most 5 s,
// jittered into [half, full].
void SleepBeforeRetry(std::chrono::milliseconds base, int attempt);

// The smallest and largest range of a parallel download (size /
// connections within these; a download by URL from a server across a
// long link goes down to 64 KiB: UrlMinRangeBytes).
constexpr uint64_t kMinRangeBytes = 1 << 20;
constexpr uint64_t kMaxRangeBytes = 64ull << 20;
// A server whose responses come this long after their requests is across
// a long link (the round trip the auto backend calls long, docs/auto.md).
constexpr double kLongLinkFirstByteS = 0.020;

// A ranged GET of bytes [start, start + len) that survives cuts: `request`
// asks for [from, from + n) and reports what arrived in its Reply; after a
// failure the next request resumes where the bytes stopped, up to
// `max_retries` times with backoff (transient failures only: no reply, 5xx,
// or a 2xx cut short), and no more once `failed` is set. `retries` counts
// the retries made.
Status FetchRangeResuming(
    uint64_t start, uint64_t len, int max_retries, std::chrono::milliseconds retry_base_delay,
    const std::atomic<bool>& failed, std::atomic<uint64_t>* retries,
    const std::function<Status(uint64_t from, uint64_t n, Reply* r)>& request);

size_t HeaderCallback(char* data, size_t size, size_t n, void* user);
size_t WriteCallback(char* data, size_t size, size_t n, void* user);
size_t ReadCallback(char* out, size_t size, size_t n, void* user);
// Rewinds an upload body: curl calls this to resend a request that a reused
// connection dropped before any reply.
int SeekCallback(void* user, curl_off_t offset, int origin);
Status CurlStatus(CURLcode code, const char* errbuf, const Call& call);
bool Transient(const Status& st, int http_status);

// Objects (client_objects.cpp).
S3ObjectInfo InfoFromHeaders(const std::string& key, const Reply& r);
Status VerifySha256(const uint8_t* data, uint64_t size, const std::string& want_b64,
                    const std::string& what);

}  // namespace s3client

struct S3Client::Impl {
  S3ClientOptions opts;
  s3client::Endpoint endpoint;
  s3client::HandlePool handles;
  s3client::WorkerPool workers;

  explicit Impl(S3ClientOptions o, s3client::Endpoint e)
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

  Result<s3client::SignedRequest> Sign(const s3client::Call& call) const;
  Status Perform(CURL* h, const s3client::Call& call, s3client::Reply* reply);
  Status Execute(const s3client::Call& call, s3client::Reply* reply);
  Status HttpError(const s3client::Call& call, const s3client::Reply& reply) const;
  Result<PutObjectResult> Put(const std::string& bucket, const std::string& key,
                              const GatherList& body, const std::string& content_type,
                              const std::vector<std::pair<std::string, std::string>>& metadata,
                              const s3::Params& headers, bool checksum, bool md5, s3::Params query);
};

namespace s3client {

// Multipart uploads (client_multipart.cpp).
Result<std::string> StartMultipart(S3Client::Impl& impl, const std::string& bucket,
                                   const std::string& key, const std::string& content_type,
                                   const std::vector<std::pair<std::string, std::string>>& metadata,
                                   const Params& headers);

}  // namespace s3client
}  // namespace xsilo
