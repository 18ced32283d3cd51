// The S3 client's request plumbing: endpoint, curl callbacks, signed
// requests with retries.
#include "s3/client_internal.h"
#include "s3/curl_memory.h"

namespace xsilo {

using s3::Params;
using namespace s3client;

namespace s3client {

void GlobalCurlInit() { InitCurlWithXsiloMemory(); }

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

net::Sha256Digest Sha256Of(const GatherList& g) {
  net::Sha256Stream s;
  for (const Buffer& b : g.segments) s.Update(b.data(), b.size());
  return s.Finish();
}

net::Md5Digest Md5Of(const GatherList& g) {
  net::Md5Stream s;
  for (const Buffer& b : g.segments) s.Update(b.data(), b.size());
  return s.Finish();
}

std::time_t ParseHttpDate(const std::string& s) {
  std::tm tm{};
  if (!strptime(s.c_str(), "%a, %d %b %Y %H:%M:%S", &tm)) return 0;
  return timegm(&tm);
}

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
  if (c->dest && c->on_data) c->on_data(r->received);
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
  // A call by URL (no bucket) has the URL in `key`: a presigned one is a
  // bearer token, so only its scheme, host and path are named.
  std::string where = call.bucket.empty() && call.key.find("://") != std::string::npos
                          ? " (" + call.method + " " + s3::RedactUrl(call.key) + ")"
                          : " (" + call.method + " " + call.bucket + "/" + call.key + ")";
  std::string msg =
      "curl: " + s3::RedactSignedQuery(errbuf[0] ? errbuf : curl_easy_strerror(code)) + where;
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

}  // namespace s3client

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

namespace s3client {

void SetTransferOptions(CURL* h, Transfer* t, char* errbuf) {
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 1L << 20);
  curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 2L << 20);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, HeaderCallback);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, t);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, WriteCallback);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, t);
  curl_easy_setopt(h, CURLOPT_READFUNCTION, ReadCallback);
  curl_easy_setopt(h, CURLOPT_READDATA, t);
  curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, SeekCallback);
  curl_easy_setopt(h, CURLOPT_SEEKDATA, t);
}

void SleepBeforeRetry(std::chrono::milliseconds base, int attempt) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  const int64_t ms = std::min<int64_t>(base.count() << std::min(attempt, 10), 5000);
  std::this_thread::sleep_for(
      std::chrono::milliseconds(ms / 2 + static_cast<int64_t>(rng() % (ms / 2 + 1))));
}

Status FetchRangeResuming(
    uint64_t start, uint64_t len, int max_retries, std::chrono::milliseconds retry_base_delay,
    const std::atomic<bool>& failed, std::atomic<uint64_t>* retries,
    const std::function<Status(uint64_t from, uint64_t n, Reply* r)>& request) {
  uint64_t done = 0;
  for (int attempt = 0;; ++attempt) {
    Reply r;
    Status st = request(start + done, len - done, &r);
    if (r.status < 300) done += r.received;  // resume after whatever arrived, even on failure
    if (st.ok() && done == len) return Status::OK();
    if (st.ok()) st = Unavailable("range ended early at byte " + std::to_string(start + done));
    const bool retryable = r.status == 0 || r.status >= 500 || (r.status >= 200 && r.status < 300);
    if (!retryable || attempt >= max_retries || failed.load()) {
      return st.WithContext("range " + std::to_string(start) + "+" + std::to_string(len) +
                            " after " + std::to_string(attempt) + " retries");
    }
    retries->fetch_add(1);
    SleepBeforeRetry(retry_base_delay, attempt);
  }
}

}  // namespace s3client

Status S3Client::Impl::Perform(CURL* h, const Call& call, Reply* reply) {
  XSILO_ASSIGN_OR_RETURN(SignedRequest signed_request, Sign(call));
  curl_easy_reset(h);
  const std::string& url = signed_request.url;
  uint64_t body_size =
      call.body ? call.body->size : (call.has_text_body ? call.text_body.size() : 0);
  curl_slist* list = nullptr;
  for (const auto& [k, v] : signed_request.headers)
    list = curl_slist_append(list, (k + ": " + v).c_str());
  list = curl_slist_append(list, "Expect:");
  list = curl_slist_append(list, "Accept:");
  if (call.method == "POST" && call.body == nullptr && !call.has_text_body) {
    list = curl_slist_append(list, "Content-Type:");
  }

  Transfer t{&call, reply};
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  SetTransferOptions(h, &t, errbuf);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opts.connect_timeout.count()));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME,
                   std::max<long>(1, static_cast<long>(opts.stall_timeout.count() / 1000)));
  if (opts.request_timeout.count() > 0) {
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(opts.request_timeout.count()));
  }
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
    SleepBeforeRetry(opts.retry_base_delay, attempt);
  }
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

}  // namespace xsilo
