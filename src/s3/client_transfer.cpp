// Large objects in parallel: UploadObject (multipart parts) and
// DownloadObject (byte ranges), over the client's bounded worker pool.
#include "s3/client_internal.h"

namespace xsilo {

using s3::Params;
using namespace s3client;

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
      range = std::clamp<uint64_t>(range, kMinRangeBytes, kMaxRangeBytes);
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
      return FetchRangeResuming(
          start, len, args.max_range_retries, args.retry_base_delay, failed, &retries,
          [&](uint64_t from, uint64_t n, Reply* r) {
            Call c;
            c.method = "GET";
            c.bucket = args.bucket;
            c.key = args.key;
            c.headers.emplace_back(
                "range", "bytes=" + std::to_string(from) + "-" + std::to_string(from + n - 1));
            if (!info.etag.empty()) c.headers.emplace_back("if-match", info.etag);
            c.dest = base + from;
            c.dest_capacity = n;
            c.expect_status = (from == 0 && n == size) ? 0 : 206;
            c.max_retries = 0;
            return impl.Execute(c, r);
          });
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

}  // namespace xsilo
