// Credential-less transfers to presigned URLs: plain, ranged and in parts.
#include <condition_variable>
#include <deque>
#include <map>

#include "xsilo/core/encode_stream.h"

#include "s3/client_internal.h"

namespace xsilo {

using s3::Params;
using namespace s3client;

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
Status PlainTransfer(const Call& call, std::chrono::milliseconds timeout, const UrlTlsOptions& tls,
                     Reply* reply) {
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
  SetTransferOptions(h, &t, errbuf);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  if (!tls.verify) {
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!tls.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, tls.ca_file.c_str());
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
  curl_off_t sent_us = 0, first_us = 0;
  if (curl_easy_getinfo(h, CURLINFO_PRETRANSFER_TIME_T, &sent_us) == CURLE_OK &&
      curl_easy_getinfo(h, CURLINFO_STARTTRANSFER_TIME_T, &first_us) == CURLE_OK && first_us > 0 &&
      first_us >= sent_us) {
    reply->first_byte_s = static_cast<double>(first_us - sent_us) * 1e-6;
  }
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

// "scheme://host:port" of a URL: whose link a download's figures describe.
std::string ServerOf(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t from = scheme == std::string::npos ? 0 : scheme + 3;
  return url.substr(0, url.find_first_of("/?#", from));
}

// Per server, the least first-byte time of the last download by URL from
// it (process-wide, as the handles are).
struct FirstByteTimes {
  std::mutex mu;
  std::map<std::string, double> last;
};
FirstByteTimes& ServerFirstByte() {
  static FirstByteTimes* times = new FirstByteTimes;  // never destroyed: used until exit
  return *times;
}
}  // namespace

uint64_t UrlMinRangeBytes(double first_byte_s) {
  return first_byte_s >= kLongLinkFirstByteS ? (64 << 10) : kMinRangeBytes;
}

Result<Buffer> HttpGetUrl(const std::string& url, std::chrono::milliseconds timeout,
                          const UrlTlsOptions& tls) {
  Call c;
  c.method = "GET";
  c.key = url;
  c.allocate_body = true;
  Reply r;
  XSILO_RETURN_IF_ERROR(PlainTransfer(c, timeout, tls, &r));
  return std::move(r.body);
}

Status HttpPutUrl(const std::string& url, const GatherList& body, std::chrono::milliseconds timeout,
                  const UrlTlsOptions& tls) {
  XSILO_RETURN_IF_ERROR(ValidateGather(body));
  Call c;
  c.method = "PUT";
  c.key = url;
  c.body = &body;
  Reply r;
  return PlainTransfer(c, timeout, tls, &r);
}

Result<UrlDownloadResult> HttpGetUrlRanges(const UrlDownloadArgs& args) {
  if (args.url.empty()) return InvalidArgument("HttpGetUrlRanges: empty URL");
  if (args.connections < 1 || args.connections > 256) {
    return InvalidArgument("HttpGetUrlRanges: connections must be in [1, 256]");
  }
  UrlDownloadResult out;
  XSILO_ASSIGN_OR_RETURN(out.data,
                         args.pool ? args.pool->Allocate(args.size) : Buffer::Allocate(args.size));
  if (args.pool) BufferPool::Recycle(out.data);
  if (args.size == 0) {
    XSILO_ASSIGN_OR_RETURN(Buffer whole, HttpGetUrl(args.url, args.timeout, args.tls));
    if (whole.size() != 0) return Corrupt("object is not empty as announced");
    return out;
  }
  const uint64_t size = args.size;
  const std::string server = ServerOf(args.url);
  uint64_t floor = args.min_range_bytes;
  if (floor == 0) {
    double first_byte_s = -1;
    {
      FirstByteTimes& times = ServerFirstByte();
      std::lock_guard<std::mutex> lock(times.mu);
      if (auto it = times.last.find(server); it != times.last.end()) first_byte_s = it->second;
    }
    floor = UrlMinRangeBytes(first_byte_s);
  }
  floor = std::min(floor, kMaxRangeBytes);
  uint64_t range = (size + args.connections - 1) / args.connections;
  range = std::clamp<uint64_t>(range, floor, kMaxRangeBytes);
  const uint64_t block = args.block_bytes;
  // Ranges smaller than a block (an object of less than a block per
  // connection) are size / connections as well: each block is checked by
  // the thread that brings the last of the ranges it overlaps.
  bool sub_block = false;
  if (block > 0) {
    if (args.block_sums.size() != (size + block - 1) / block) {
      return InvalidArgument("HttpGetUrlRanges: " + std::to_string(args.block_sums.size()) +
                             " block checksums for " + std::to_string(size) +
                             " bytes in blocks of " + std::to_string(block));
    }
    sub_block = range < block;
    if (!sub_block) range = (range + block - 1) / block * block;  // whole blocks
  }
  const uint64_t n_ranges = (size + range - 1) / range;
  out.ranges = n_ranges;
  std::atomic<uint64_t> retries{0};
  std::mutex first_byte_mu;
  double least_first_byte_s = -1;
  uint8_t* base = out.data.mutable_data();
  auto corrupt_block = [&](uint64_t first) {
    return Corrupt("bytes " + std::to_string(first) + "-" +
                   std::to_string(first + std::min(block, size - first) - 1) +
                   " failed their block checksum");
  };
  auto block_ok = [&](uint64_t first) {
    const uint64_t n = std::min(block, size - first);
    return Checksum(std::span<const uint8_t>(base + first, n)) == args.block_sums[first / block];
  };
  // Sub-block ranges: per block, how many ranges that overlap it are
  // still coming.
  std::vector<std::atomic<uint64_t>> ranges_left(sub_block ? args.block_sums.size() : 0);
  for (uint64_t i = 0; sub_block && i < n_ranges; ++i) {
    const uint64_t last = std::min(size, (i + 1) * range) - 1;
    for (uint64_t b = i * range / block; b <= last / block; ++b) ranges_left[b].fetch_add(1);
  }
  auto fetch_range = [&](uint64_t i, const std::atomic<bool>& failed) -> Status {
    const uint64_t start = i * range;
    const uint64_t len = std::min(range, size - start);
    // Whole-block ranges: each block is hashed as soon as its last byte is
    // in, while it is still in cache, on this range's thread: the check
    // runs alongside the transfer instead of after it. [start, checked) is
    // checked.
    uint64_t checked = start;
    std::optional<uint64_t> bad;  // first block that failed
    auto check_to = [&](uint64_t end) {
      while (block > 0 && !sub_block && !bad && checked < start + len) {
        const uint64_t n = std::min(block, size - checked);
        if (checked + n > end) break;
        if (!block_ok(checked)) bad = checked;
        checked += n;
      }
    };
    auto request = [&](uint64_t from, uint64_t n, Reply* r) {
      Call c;
      c.method = "GET";
      c.key = args.url;
      c.headers.emplace_back("Range",
                             "bytes=" + std::to_string(from) + "-" + std::to_string(from + n - 1));
      c.dest = base + from;
      c.dest_capacity = n;
      c.expect_status = 206;
      if (block > 0 && !sub_block) {
        c.on_data = [&, from](uint64_t received) { check_to(from + received); };
      }
      Status st = PlainTransfer(c, args.timeout, args.tls, r);
      if (r->first_byte_s >= 0) {
        std::lock_guard<std::mutex> lock(first_byte_mu);
        if (least_first_byte_s < 0 || r->first_byte_s < least_first_byte_s) {
          least_first_byte_s = r->first_byte_s;
        }
      }
      return st;
    };
    Status fetched = FetchRangeResuming(start, len, args.max_range_retries, args.retry_base_delay,
                                        failed, &retries, request);
    if (!fetched.ok()) return fetched;
    if (sub_block) {
      for (uint64_t b = start / block; b <= (start + len - 1) / block; ++b) {
        if (ranges_left[b].fetch_sub(1) == 1 && !block_ok(b * block)) {
          return corrupt_block(b * block);
        }
      }
      return Status::OK();
    }
    check_to(start + len);
    if (bad) return corrupt_block(*bad);
    return Status::OK();
  };
  Status st = ParallelForEach(n_ranges, args.connections, fetch_range);
  out.range_retries = retries.load();
  out.min_range_bytes = floor;
  if (least_first_byte_s >= 0) {  // the next download from this server goes by it
    FirstByteTimes& times = ServerFirstByte();
    std::lock_guard<std::mutex> lock(times.mu);
    times.last[server] = least_first_byte_s;
  }
  if (!st.ok()) return st;
  return out;
}

namespace {

// PUTs one part to its presigned URL, retried from its start on a
// connection failure or a 5xx; its ETag in *etag.
Status PutPart(const UrlUploadArgs& args, uint64_t index, const GatherList& slice,
               const std::atomic<bool>& failed, std::string* etag) {
  for (int attempt = 0;; ++attempt) {
    Call c;
    c.method = "PUT";
    c.key = args.part_urls[index];
    c.body = &slice;
    Reply r;
    Status st = PlainTransfer(c, args.timeout, args.tls, &r);
    if (st.ok()) {
      const std::string* e = r.Header("etag");
      if (e && !e->empty()) {
        *etag = *e;
        return Status::OK();
      }
      st = Internal("the server returned no ETag");
    }
    bool retryable = r.status == 0 || r.status >= 500;
    if (!retryable || attempt >= args.max_part_retries || failed.load()) {
      return st.WithContext("part " + std::to_string(index + 1) + " after " +
                            std::to_string(attempt) + " retries");
    }
    SleepBeforeRetry(args.retry_base_delay, attempt);
  }
}

Status CompleteParts(const UrlUploadArgs& args, const std::vector<std::string>& etags) {
  Call done;
  done.method = "POST";
  done.key = args.complete_url;
  done.has_text_body = true;
  done.text_body = CompleteMultipartXml(etags);
  done.headers.emplace_back("Content-Type", "application/xml");
  Reply r;
  XSILO_RETURN_IF_ERROR(
      PlainTransfer(done, args.timeout, args.tls, &r).WithContext("completing the upload"));
  if (r.text.find("<Error>") != std::string::npos) {  // S3 may fail inside a 200
    return Unavailable("completing the upload: " + s3::RedactSignedQuery(r.text.substr(0, 512)));
  }
  return Status::OK();
}

Status CheckUploadArgs(const UrlUploadArgs& args, const char* what) {
  if (args.part_urls.empty()) return InvalidArgument(std::string(what) + ": no part URLs");
  if (args.complete_url.empty()) return InvalidArgument(std::string(what) + ": no completion URL");
  if (args.connections < 1 || args.connections > 256) {
    return InvalidArgument(std::string(what) + ": connections must be in [1, 256]");
  }
  return Status::OK();
}

}  // namespace

Result<uint64_t> HttpPutUrlParts(const UrlUploadArgs& args) {
  XSILO_RETURN_IF_ERROR(CheckUploadArgs(args, "HttpPutUrlParts"));
  XSILO_RETURN_IF_ERROR(ValidateGather(args.body));
  const uint64_t size = args.body.size;
  const uint64_t wanted = size / std::max<uint64_t>(args.min_part_bytes, 1);
  const uint64_t most = std::clamp<uint64_t>(wanted, 1, args.part_urls.size());
  const uint64_t part = std::max<uint64_t>((size + most - 1) / most, 1);
  const uint64_t n_parts = size == 0 ? 1 : (size + part - 1) / part;
  std::vector<std::string> etags(n_parts);
  auto put_part = [&](uint64_t i, const std::atomic<bool>& failed) -> Status {
    const uint64_t off = i * part;
    return PutPart(args, i, SliceGather(args.body, off, std::min(part, size - off)), failed,
                   &etags[i]);
  };
  XSILO_RETURN_IF_ERROR(ParallelForEach(n_parts, args.connections, put_part));
  XSILO_RETURN_IF_ERROR(CompleteParts(args, etags));
  return n_parts;
}

Result<UrlStreamResult> HttpPutUrlStream(const UrlStreamUpload& s) {
  const UrlUploadArgs& args = s.upload;
  XSILO_RETURN_IF_ERROR(CheckUploadArgs(args, "HttpPutUrlStream"));
  if (s.body == nullptr || !s.head) return InvalidArgument("HttpPutUrlStream: no body or head");
  EncodeStream& body = *s.body;
  const uint64_t urls = args.part_urls.size();
  const uint64_t min_part = std::max<uint64_t>(args.min_part_bytes, 1);
  std::vector<std::string> etags(urls);

  // Parts queued for the connections; the first failure stops the rest.
  struct Part {
    uint64_t index;
    GatherList bytes;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Part> queue;
  bool closed = false;
  std::atomic<bool> failed{false};
  Status first_error;
  auto work = [&] {
    for (;;) {
      Part p;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return closed || !queue.empty(); });
        if (queue.empty()) return;
        p = std::move(queue.front());
        queue.pop_front();
      }
      if (failed.load()) continue;
      Status st = PutPart(args, p.index, p.bytes, failed, &etags[p.index]);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = std::move(st);
        failed = true;
      }
    }
  };
  std::vector<std::thread> workers;
  const uint64_t n_workers = std::min<uint64_t>(static_cast<uint64_t>(args.connections), urls);
  for (uint64_t w = 0; w < n_workers; ++w) workers.emplace_back(work);
  auto enqueue = [&](uint64_t index, GatherList bytes) {
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back({index, std::move(bytes)});
    }
    cv.notify_one();
  };
  auto join = [&]() -> Status {
    {
      std::lock_guard<std::mutex> lock(mu);
      closed = true;
    }
    cv.notify_all();
    for (auto& t : workers) t.join();
    return first_error;
  };

  // The body's first `held` bytes go last, in part 1 after the head.
  const uint64_t held = min_part;
  uint64_t planned = held;  // parts 2..next cover the body up to here
  uint64_t next = 1;        // index of the next part (part number next + 1)
  EncodeStream::State st = body.Now();
  while (!st.finished && !st.abandoned && !failed.load()) {
    const uint64_t free_urls = urls - next;
    if (free_urls < 2) {  // the last URL is kept for what comes after
      st = body.WaitBeyond(st.ready);
      continue;
    }
    // The estimated rest over the URLs left (the kept one included).
    const uint64_t rest = std::max(body.Estimate(), planned) - planned;
    const uint64_t target = std::max(min_part, (rest + free_urls - 1) / free_urls);
    if (st.ready >= planned + target) {
      enqueue(next++, body.Range(planned, target));
      planned += target;
      continue;
    }
    st = body.WaitBeyond(planned + target - 1);
  }
  UrlStreamResult out;
  out.early_bytes = planned - held;
  if (failed.load()) return join();
  if (st.abandoned) {
    failed = true;  // the parts still queued are not sent
    (void)join();
    return Cancelled("HttpPutUrlStream: the body was abandoned after " +
                     std::to_string(out.early_bytes) + " bytes went ahead in " +
                     std::to_string(next - 1) + " part(s)");
  }
  const uint64_t total = body.Now().ready;
  auto head = s.head();
  if (!head.ok()) {
    (void)join();
    return head.status();
  }
  // Part 1: the head and the first bytes (all of them with no URL left).
  const uint64_t rest = total > planned ? total - planned : 0;
  const uint64_t free_urls = urls - next;
  GatherList first = std::move(head).value();
  const uint64_t in_first = rest > 0 && free_urls == 0 ? total : std::min(held, total);
  for (Buffer& b : body.Range(0, in_first).segments) first.Append(std::move(b));
  enqueue(0, std::move(first));
  // What came after the last part: over the URLs left, each part of at
  // least min_part.
  uint64_t n_parts = next;
  if (rest > 0 && free_urls > 0) {
    const uint64_t k = std::clamp<uint64_t>(rest / min_part, 1, free_urls);
    const uint64_t size = (rest + k - 1) / k;
    for (uint64_t off = 0; off < rest; off += size) {
      enqueue(n_parts++, body.Range(planned + off, std::min(size, rest - off)));
    }
  }
  XSILO_RETURN_IF_ERROR(join());
  etags.resize(n_parts);
  XSILO_RETURN_IF_ERROR(CompleteParts(args, etags));
  out.parts = n_parts;
  return out;
}

}  // namespace xsilo
