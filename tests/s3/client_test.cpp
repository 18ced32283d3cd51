// The S3 client against the embedded server: round trips of every size
// class, multipart and parallel ranged transfers, faults, auth failures,
// presigned URLs, checksums, credentials.
#include "xsilo/s3/client.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "net/crypto.h"
#include "s3/raw_http.h"
#include "s3/xml.h"
#include "transport/test_util.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/encode_stream.h"
#include "xsilo/core/tiers.h"
#include "xsilo/s3/server.h"

namespace xsilo {
namespace {

constexpr const char* kAk = "client-test-ak";
constexpr const char* kSk = "client-test-sk";

Buffer Pattern(uint64_t bytes, uint64_t seed) { return testing::PatternTensor(bytes, seed).data; }

GatherList Gather(Buffer b) {
  GatherList g;
  g.Append(std::move(b));
  return g;
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    S3ServerOptions o;
    o.access_key = kAk;
    o.secret_key = kSk;
    o.buckets = {"bkt"};
    o.virtual_host_domain = "localhost";
    o.on_request = [this](const S3FaultRequest& r) {
      const int ms = range_delay_ms_.load();
      if (ms > 0 && r.method == "GET" && !r.range.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      }
      if (r.method == "PUT" && r.query.find("partNumber=") != std::string::npos) ++part_puts_;
    };
    o.fault_drop_after_body_bytes = [this](const S3FaultRequest& r) -> int64_t {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!r.range.empty()) ranges_seen_.push_back(r.range);
      }
      if (r.method != "GET" || r.range.empty()) return -1;
      // Only a response the drop would cut takes one of the drops: a
      // resumed range no longer than drop_after_ (which may reach the
      // server before another test range does) is sent whole, uncounted,
      // so the number of cuts does not depend on the order requests come.
      uint64_t first = 0, last = 0;
      if (std::sscanf(r.range.c_str(), "bytes=%" SCNu64 "-%" SCNu64, &first, &last) == 2 &&
          last >= first && last - first + 1 <= static_cast<uint64_t>(drop_after_.load())) {
        return -1;
      }
      if (drops_left_.fetch_sub(1) > 0) return drop_after_.load();
      drops_left_.fetch_add(1);
      return -1;
    };
    auto s = S3Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    client_ = MakeClient(kSk);
  }
  std::unique_ptr<S3Client> MakeClient(const std::string& secret, int max_retries = 3) {
    S3ClientOptions co;
    co.endpoint = server_->endpoint();
    co.credentials = StaticCredentials({kAk, secret});
    co.max_retries = max_retries;
    co.retry_base_delay = std::chrono::milliseconds(5);
    auto c = S3Client::Create(co);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(c).value();
  }

  // Stores `bytes` under `key` and returns a presigned GET URL of it.
  std::string StoreForUrl(const std::string& key, std::string_view bytes) {
    GatherList body;
    body.Append(Buffer::CopyFrom(bytes));
    EXPECT_TRUE(client_->PutObject({.bucket = "bkt", .key = key, .body = body}).ok());
    auto url = client_->PresignUrl({.method = "GET", .bucket = "bkt", .key = key});
    EXPECT_TRUE(url.ok()) << url.status().ToString();
    return url.ok() ? *url : std::string();
  }

  std::unique_ptr<S3Server> server_;
  std::unique_ptr<S3Client> client_;
  std::atomic<int> drops_left_{0};
  std::atomic<int64_t> drop_after_{0};
  std::atomic<int> range_delay_ms_{0};  // before each ranged GET's response
  std::atomic<int> part_puts_{0};       // UploadPart requests received
  std::mutex mu_;
  std::vector<std::string> ranges_seen_;
};

TEST_F(ClientTest, RoundTripSizes) {
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{100} << 20}) {
    SCOPED_TRACE(size);
    Buffer data = Pattern(size, size + 1);
    std::string key = "obj-" + std::to_string(size);
    auto put = client_->PutObject({.bucket = "bkt", .key = key, .body = Gather(data)});
    ASSERT_TRUE(put.ok()) << put.status().ToString();
    EXPECT_FALSE(put->etag.empty());
    auto got = client_->GetObject({.bucket = "bkt", .key = key});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->data.size(), size);
    EXPECT_EQ(got->data.view(), data.view());
    EXPECT_EQ(got->info.etag, put->etag);
    auto head = client_->HeadObject({"bkt", key});
    ASSERT_TRUE(head.ok());
    EXPECT_EQ(head->size, size);
    auto par = client_->DownloadObject(
        {.bucket = "bkt", .key = key, .connections = 4, .range_size = 8 << 20});
    ASSERT_TRUE(par.ok()) << par.status().ToString();
    EXPECT_EQ(par->data.view(), data.view());
  }
}

TEST_F(ClientTest, ObjectOver2GiBViaMultipartAndParallelRangedGet) {
  const uint64_t size = (2ull << 30) + (5 << 20) + 17;
  uint64_t want = 0;
  {
    Buffer data = Pattern(size, 42);
    want = Checksum(data.span());
    auto up = client_->UploadObject({.bucket = "bkt",
                                     .key = "big",
                                     .body = Gather(data),
                                     .part_size = 256 << 20,
                                     .concurrency = 4});
    ASSERT_TRUE(up.ok()) << up.status().ToString();
    EXPECT_NE(up->etag.find("-9"), std::string::npos) << up->etag;
  }
  auto head = client_->HeadObject({"bkt", "big"});
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->size, size);
  auto got = client_->DownloadObject({.bucket = "bkt", .key = "big", .connections = 8});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->data.size(), size);
  EXPECT_EQ(Checksum(got->data.span()), want);
  // A range straddling the 2 GiB mark.
  auto mid = client_->GetObject(
      {.bucket = "bkt", .key = "big", .offset = (2ull << 30) - 10, .length = 20});
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(mid->data.view(), got->data.view().substr((2ull << 30) - 10, 20));
}

TEST_F(ClientTest, PutFromGatherListWithoutFlattening) {
  GatherList g;
  g.Append(Buffer::CopyFrom("head-"));
  g.Append(Pattern(3 << 20, 7));
  g.Append(Buffer());
  g.Append(Buffer::CopyFrom("-tail"));
  ASSERT_TRUE(client_->PutObject({.bucket = "bkt", .key = "g", .body = g}).ok());
  auto got = client_->GetObject({.bucket = "bkt", .key = "g"});
  ASSERT_TRUE(got.ok());
  auto flat = g.Flatten();
  EXPECT_EQ(got->data.view(), flat->view());
}

TEST_F(ClientTest, RangedGet) {
  Buffer data = Pattern(1000, 3);
  ASSERT_TRUE(client_->PutObject({.bucket = "bkt", .key = "r", .body = Gather(data)}).ok());
  auto mid = client_->GetObject({.bucket = "bkt", .key = "r", .offset = 100, .length = 50});
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(mid->data.view(), data.view().substr(100, 50));
  EXPECT_EQ(mid->info.size, 1000u);
  auto tail = client_->GetObject({.bucket = "bkt", .key = "r", .offset = 990});
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(tail->data.view(), data.view().substr(990));
  auto past = client_->GetObject({.bucket = "bkt", .key = "r", .offset = 1000});
  EXPECT_EQ(past.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(S3ErrorCode(past.status()), "InvalidRange");
}

TEST_F(ClientTest, MissingKeyAndBucket) {
  auto get = client_->GetObject({.bucket = "bkt", .key = "nope"});
  EXPECT_EQ(get.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(S3ErrorCode(get.status()), "NoSuchKey");
  auto head = client_->HeadObject({"bkt", "nope"});
  EXPECT_EQ(head.status().code(), StatusCode::kNotFound);
  auto nb = client_->GetObject({.bucket = "no-bucket", .key = "k"});
  EXPECT_EQ(nb.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(S3ErrorCode(nb.status()), "NoSuchBucket");
  EXPECT_EQ(client_->HeadBucket({"no-bucket"}).code(), StatusCode::kNotFound);
  auto dl = client_->DownloadObject({.bucket = "bkt", .key = "nope"});
  EXPECT_EQ(dl.status().code(), StatusCode::kNotFound);
  // Deleting a missing key succeeds, as in S3.
  EXPECT_TRUE(client_->DeleteObject({"bkt", "nope"}).ok());
}

TEST_F(ClientTest, WrongSecretIsPermissionDenied) {
  auto bad = MakeClient("wrong-secret");
  auto put = bad->PutObject({.bucket = "bkt", .key = "x", .body = Gather(Buffer::CopyFrom("x"))});
  EXPECT_EQ(put.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(S3ErrorCode(put.status()), "SignatureDoesNotMatch") << put.status().ToString();
  auto get = bad->GetObject({.bucket = "bkt", .key = "x"});
  EXPECT_EQ(get.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(S3ErrorCode(get.status()), "SignatureDoesNotMatch");
}

TEST_F(ClientTest, BucketsAndDelete) {
  ASSERT_TRUE(client_->CreateBucket({"second"}).ok());
  EXPECT_TRUE(client_->HeadBucket({"second"}).ok());
  Status again = client_->CreateBucket({"second"});
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(
      client_->PutObject({.bucket = "second", .key = "k", .body = Gather(Buffer::CopyFrom("v"))})
          .ok());
  EXPECT_EQ(client_->DeleteBucket({"second"}).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(client_->DeleteObject({"second", "k"}).ok());
  EXPECT_EQ(client_->GetObject({.bucket = "second", .key = "k"}).status().code(),
            StatusCode::kNotFound);
  EXPECT_TRUE(client_->DeleteBucket({"second"}).ok());
  EXPECT_EQ(client_->HeadBucket({"second"}).code(), StatusCode::kNotFound);
}

TEST_F(ClientTest, ListObjectsV2) {
  std::vector<std::string> keys = {"a/1", "a/2", "b/x y", "b/%z", "c", "d+e"};
  for (const auto& k : keys) {
    ASSERT_TRUE(
        client_->PutObject({.bucket = "bkt", .key = k, .body = Gather(Buffer::CopyFrom(k))}).ok());
  }
  auto all = client_->ListObjects({.bucket = "bkt", .max_keys = 2, .fetch_all = true});
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  std::vector<std::string> listed;
  for (const auto& o : all->objects) listed.push_back(o.key);
  std::vector<std::string> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(listed, sorted);
  EXPECT_EQ(all->objects[0].size, 3u);
  auto page = client_->ListObjects({.bucket = "bkt", .max_keys = 2});
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->objects.size(), 2u);
  auto grouped = client_->ListObjects({.bucket = "bkt", .delimiter = "/"});
  ASSERT_TRUE(grouped.ok());
  EXPECT_EQ(grouped->common_prefixes, (std::vector<std::string>{"a/", "b/"}));
  ASSERT_EQ(grouped->objects.size(), 2u);
  auto pre = client_->ListObjects({.bucket = "bkt", .prefix = "b/"});
  ASSERT_TRUE(pre.ok());
  ASSERT_EQ(pre->objects.size(), 2u);
  EXPECT_EQ(pre->objects[0].key, "b/%z");
  EXPECT_EQ(pre->objects[1].key, "b/x y");
}

TEST_F(ClientTest, MultipartUploadInParallel) {
  Buffer data = Pattern((17 << 20) + 12345, 11);
  auto up = client_->UploadObject({.bucket = "bkt",
                                   .key = "mp",
                                   .body = Gather(data),
                                   .part_size = 5 << 20,
                                   .concurrency = 3,
                                   .checksum_sha256 = true});
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  EXPECT_NE(up->etag.find("-4"), std::string::npos) << up->etag;  // 4 parts
  auto got = client_->DownloadObject(
      {.bucket = "bkt", .key = "mp", .connections = 5, .range_size = 3 << 20});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->ranges, 6u);
  EXPECT_EQ(got->data.view(), data.view());
}

TEST_F(ClientTest, MultipartFailureIsAbortedAndReported) {
  // A server that rejects parts over 6 MiB makes the 8 MiB parts fail.
  S3ServerOptions o;
  o.access_key = kAk;
  o.secret_key = kSk;
  o.buckets = {"bkt"};
  o.max_part_bytes = 6 << 20;
  auto small = S3Server::Start(o);
  ASSERT_TRUE(small.ok());
  S3ClientOptions co;
  co.endpoint = (*small)->endpoint();
  co.credentials = StaticCredentials({kAk, kSk});
  auto c = S3Client::Create(co);
  ASSERT_TRUE(c.ok());
  auto up = (*c)->UploadObject({.bucket = "bkt",
                                .key = "big",
                                .body = Gather(Pattern(20 << 20, 1)),
                                .part_size = 8 << 20,
                                .concurrency = 2});
  EXPECT_EQ(up.status().code(), StatusCode::kResourceExhausted) << up.status().ToString();
  EXPECT_EQ(S3ErrorCode(up.status()), "EntityTooLarge");
  EXPECT_NE(up.status().message().find("aborted"), std::string::npos);
  EXPECT_EQ((*c)->HeadObject({"bkt", "big"}).status().code(), StatusCode::kNotFound);
}

TEST_F(ClientTest, RangeRetryResumesWhereTheConnectionDropped) {
  Buffer data = Pattern(24 << 20, 5);
  ASSERT_TRUE(client_->PutObject({.bucket = "bkt", .key = "flaky", .body = Gather(data)}).ok());
  {
    std::lock_guard<std::mutex> lock(mu_);
    ranges_seen_.clear();
  }
  drop_after_ = (1 << 20) + 12345;
  drops_left_ = 3;
  auto got = client_->DownloadObject({.bucket = "bkt",
                                      .key = "flaky",
                                      .connections = 1,
                                      .range_size = 8 << 20,
                                      .max_range_retries = 5,
                                      .retry_base_delay = std::chrono::milliseconds(1)});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->data.view(), data.view());
  EXPECT_EQ(got->range_retries, 3u);
  // With one connection the ranges run in order: the first range is cut
  // three times, each retry starting where the previous attempt stopped.
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_GE(ranges_seen_.size(), 4u);
  const uint64_t cut = (1 << 20) + 12345, end = (8 << 20) - 1;
  EXPECT_EQ(ranges_seen_[0], "bytes=0-" + std::to_string(end));
  EXPECT_EQ(ranges_seen_[1], "bytes=" + std::to_string(cut) + "-" + std::to_string(end));
  EXPECT_EQ(ranges_seen_[2], "bytes=" + std::to_string(2 * cut) + "-" + std::to_string(end));
  EXPECT_EQ(ranges_seen_[3], "bytes=" + std::to_string(3 * cut) + "-" + std::to_string(end));
}

TEST_F(ClientTest, RangeRetriesAreBounded) {
  Buffer data = Pattern(4 << 20, 6);
  ASSERT_TRUE(client_->PutObject({.bucket = "bkt", .key = "dead", .body = Gather(data)}).ok());
  drop_after_ = 1000;
  drops_left_ = 1000000;
  auto got = client_->DownloadObject({.bucket = "bkt",
                                      .key = "dead",
                                      .connections = 2,
                                      .range_size = 1 << 20,
                                      .max_range_retries = 2,
                                      .retry_base_delay = std::chrono::milliseconds(1)});
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  EXPECT_NE(got.status().message().find("after 2 retries"), std::string::npos);
  drops_left_ = 0;
}

TEST_F(ClientTest, ChecksumsEndToEnd) {
  Buffer data = Pattern(3 << 20, 9);
  auto put = client_->PutObject({.bucket = "bkt",
                                 .key = "ck",
                                 .body = Gather(data),
                                 .checksum_sha256 = true,
                                 .content_md5 = true});
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  std::string sha = net::Base64Of(net::Sha256(data.span()));
  EXPECT_EQ(put->checksum_sha256, sha);
  auto got = client_->GetObject({.bucket = "bkt", .key = "ck", .verify_checksum = true});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->info.checksum_sha256, sha);
  auto dl = client_->DownloadObject({.bucket = "bkt",
                                     .key = "ck",
                                     .connections = 3,
                                     .range_size = 1 << 20,
                                     .verify_checksum = true});
  ASSERT_TRUE(dl.ok()) << dl.status().ToString();
  std::string wrong = net::Base64Of(net::Sha256(std::string_view("other")));
  auto bad = client_->GetObject({.bucket = "bkt", .key = "ck", .expected_sha256 = wrong});
  EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt);
  auto bad2 = client_->DownloadObject({.bucket = "bkt", .key = "ck", .expected_sha256 = wrong});
  EXPECT_EQ(bad2.status().code(), StatusCode::kCorrupt);
}

TEST_F(ClientTest, MetadataAndContentType) {
  auto put = client_->PutObject({.bucket = "bkt",
                                 .key = "meta",
                                 .body = Gather(Buffer::CopyFrom("m")),
                                 .content_type = "application/x-safetensors",
                                 .metadata = {{"Round", "7"}, {"sender", "rank-3"}}});
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  auto head = client_->HeadObject({"bkt", "meta"});
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->content_type, "application/x-safetensors");
  EXPECT_EQ(head->metadata, (std::vector<std::pair<std::string, std::string>>{
                                {"round", "7"}, {"sender", "rank-3"}}));
}

TEST_F(ClientTest, PresignedUrlsNeedNoCredentials) {
  Buffer data = Pattern(2 << 20, 4);
  auto put_url = client_->PresignUrl(
      {.method = "PUT", .bucket = "bkt", .key = "pre/obj 1", .expires = std::chrono::seconds(60)});
  ASSERT_TRUE(put_url.ok());
  ASSERT_TRUE(HttpPutUrl(*put_url, Gather(data)).ok());
  auto get_url = client_->PresignUrl({.bucket = "bkt", .key = "pre/obj 1"});
  ASSERT_TRUE(get_url.ok());
  auto got = HttpGetUrl(*get_url);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->view(), data.view());
  // A plain curl, with no credentials at all, works too.
  std::string tmp =
      (std::filesystem::temp_directory_path() / ("xsilo-presign-" + std::to_string(::getpid())))
          .string();
  std::string cmd = "curl -sf -o '" + tmp + "' '" + *get_url + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(tmp, std::ios::binary);
  std::string fetched((std::istreambuf_iterator<char>(in)), {});
  std::filesystem::remove(tmp);
  EXPECT_EQ(fetched, data.view());
  // Expired.
  auto old = client_->PresignUrl({.bucket = "bkt",
                                  .key = "pre/obj 1",
                                  .expires = std::chrono::seconds(60),
                                  .signing_time = std::time(nullptr) - 120});
  ASSERT_TRUE(old.ok());
  auto expired = HttpGetUrl(*old);
  EXPECT_EQ(expired.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(S3ErrorCode(expired.status()), "AccessDenied");
  EXPECT_NE(expired.status().message().find("Request has expired"), std::string::npos);
  std::string cmd2 = "curl -s -o /dev/null -w '%{http_code}' '" + *old + "' > '" + tmp + "'";
  ASSERT_EQ(std::system(cmd2.c_str()), 0);
  std::ifstream code_in(tmp);
  std::string code;
  code_in >> code;
  std::filesystem::remove(tmp);
  EXPECT_EQ(code, "403");
}

// A Complete retried after its answer was lost gets the same answer (as
// in S3); a "retry" naming other parts or another key does not complete
// anything.
TEST_F(ClientTest, ARetriedCompleteGetsTheSameAnswerAndNothingElseDoes) {
  using s3::testing::RawExchange;
  using s3::testing::SignedRequest;
  auto id = client_->CreateMultipartUpload({"bkt", "mp/retried"});
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  auto part = client_->PresignUrl({.method = "PUT",
                                   .bucket = "bkt",
                                   .key = "mp/retried",
                                   .query = {{"partNumber", "1"}, {"uploadId", *id}}});
  ASSERT_TRUE(part.ok());
  ASSERT_TRUE(HttpPutUrl(*part, Gather(Pattern(1000, 3))).ok());
  auto parts = client_->ListParts({"bkt", "mp/retried"}, *id);
  ASSERT_TRUE(parts.ok() && parts->size() == 1u);
  const std::string etag = (*parts)[0].etag;
  const int port = server_->port();
  auto complete = [&](const std::string& key, const std::string& part_etag) {
    return RawExchange(port, SignedRequest(port, "POST", "/bkt/" + key, "uploadId=" + *id,
                                           CompleteMultipartXml({part_etag}), kAk, kSk));
  };
  auto first = complete("mp/retried", etag);
  ASSERT_EQ(first.status, 200) << first.body;
  auto again = complete("mp/retried", etag);
  EXPECT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(s3::XmlText(again.body, "ETag"), s3::XmlText(first.body, "ETag"));
  auto other_parts = complete("mp/retried", "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(other_parts.status, 404) << other_parts.body;
  EXPECT_NE(other_parts.body.find("NoSuchUpload"), std::string::npos) << other_parts.body;
  EXPECT_EQ(complete("mp/other-key", etag).status, 404);
  EXPECT_EQ(client_->HeadObject({"bkt", "mp/other-key"}).status().code(), StatusCode::kNotFound);
}

// A multipart upload run by a party with no credentials: presigned part
// URLs and a presigned completion, as the hybrid backends' upload grants.
TEST_F(ClientTest, PresignedMultipartUploadNeedsNoCredentials) {
  auto id = client_->CreateMultipartUpload({"bkt", "mp/obj"});
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  UrlUploadArgs up;
  for (int i = 1; i <= 8; ++i) {
    auto u = client_->PresignUrl({.method = "PUT",
                                  .bucket = "bkt",
                                  .key = "mp/obj",
                                  .query = {{"partNumber", std::to_string(i)}, {"uploadId", *id}}});
    ASSERT_TRUE(u.ok()) << u.status().ToString();
    up.part_urls.push_back(*u);
  }
  auto done = client_->PresignUrl(
      {.method = "POST", .bucket = "bkt", .key = "mp/obj", .query = {{"uploadId", *id}}});
  ASSERT_TRUE(done.ok());
  up.complete_url = *done;
  Buffer data = Pattern((23ull << 20) + 123, 9);
  up.body = Gather(data);
  up.connections = 3;
  auto parts = HttpPutUrlParts(up);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  EXPECT_EQ(*parts, 4u);  // 23 MiB in parts of at least 5 MiB
  auto got = client_->GetObject({.bucket = "bkt", .key = "mp/obj"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->data.view(), data.view());

  // A small body is one part; an empty one too.
  for (uint64_t size : {uint64_t{1000}, uint64_t{0}}) {
    auto id2 = client_->CreateMultipartUpload({"bkt", "mp/small"});
    ASSERT_TRUE(id2.ok());
    UrlUploadArgs small;
    small.part_urls = {*client_->PresignUrl({.method = "PUT",
                                             .bucket = "bkt",
                                             .key = "mp/small",
                                             .query = {{"partNumber", "1"}, {"uploadId", *id2}}}),
                       "unused-second-url"};
    small.complete_url = *client_->PresignUrl(
        {.method = "POST", .bucket = "bkt", .key = "mp/small", .query = {{"uploadId", *id2}}});
    Buffer b = Pattern(size, 3);
    small.body = Gather(b);
    auto n = HttpPutUrlParts(small);
    ASSERT_TRUE(n.ok()) << size << ": " << n.status().ToString();
    EXPECT_EQ(*n, 1u);
    auto g = client_->GetObject({.bucket = "bkt", .key = "mp/small"});
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->data.view(), b.view());
  }

  // The signature covers the part number: a URL edited to another part fails.
  std::string forged = up.part_urls[0];
  forged.replace(forged.find("partNumber=1"), 12, "partNumber=2");
  EXPECT_EQ(HttpPutUrl(forged, Gather(Pattern(10, 1))).code(), StatusCode::kPermissionDenied);

  // An aborted upload cannot be completed, and its object never appears.
  auto id3 = client_->CreateMultipartUpload({"bkt", "mp/aborted"});
  ASSERT_TRUE(id3.ok());
  UrlUploadArgs ab;
  ab.part_urls = {*client_->PresignUrl({.method = "PUT",
                                        .bucket = "bkt",
                                        .key = "mp/aborted",
                                        .query = {{"partNumber", "1"}, {"uploadId", *id3}}})};
  ab.complete_url = *client_->PresignUrl(
      {.method = "POST", .bucket = "bkt", .key = "mp/aborted", .query = {{"uploadId", *id3}}});
  ASSERT_TRUE(client_->AbortMultipartUpload({"bkt", "mp/aborted"}, *id3).ok());
  ab.body = Gather(Pattern(100, 2));
  auto late = HttpPutUrlParts(ab);
  EXPECT_FALSE(late.ok());
  EXPECT_EQ(S3ErrorCode(late.status()), "NoSuchUpload") << late.status().ToString();
  EXPECT_EQ(client_->HeadObject({"bkt", "mp/aborted"}).status().code(), StatusCode::kNotFound);

  // Reserved or empty query names are refused before anything is signed.
  EXPECT_EQ(client_->PresignUrl({.bucket = "bkt", .key = "k", .query = {{"X-Amz-Date", "1"}}})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpPutUrlParts(UrlUploadArgs{}).status().code(), StatusCode::kInvalidArgument);
}

// A multipart upload (presigned, `parts` URLs) of key; its URLs.
UrlUploadArgs PresignedUpload(S3Client& client, const std::string& key, int parts) {
  UrlUploadArgs up;
  auto id = client.CreateMultipartUpload({"bkt", key});
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  if (!id.ok()) return up;
  for (int i = 1; i <= parts; ++i) {
    up.part_urls.push_back(
        *client.PresignUrl({.method = "PUT",
                            .bucket = "bkt",
                            .key = key,
                            .query = {{"partNumber", std::to_string(i)}, {"uploadId", *id}}}));
  }
  up.complete_url = *client.PresignUrl(
      {.method = "POST", .bucket = "bkt", .key = key, .query = {{"uploadId", *id}}});
  up.connections = 4;
  return up;
}

// A body still being produced goes up part by part: parts are on the
// server before the body is finished, the head (known only at the end)
// comes first in the object, and every part but the last keeps S3's
// 5 MiB minimum (the server refuses the completion otherwise).
TEST_F(ClientTest, AStreamedUploadSendsPartsBeforeTheBodyIsFinished) {
  const Buffer data = Pattern(40ull << 20, 21);
  const std::string head_bytes(100, 'h');
  EncodeStream body;
  body.SetInputBytes(data.size());
  UrlStreamUpload up;
  up.upload = PresignedUpload(*client_, "mp/streamed", 8);
  up.body = &body;
  up.head = [&]() -> Result<GatherList> { return Gather(Buffer::CopyFrom(head_bytes)); };
  std::thread uploader;
  Result<UrlStreamResult> result = Internal("not run");
  uploader = std::thread([&] { result = HttpPutUrlStream(up); });
  const uint64_t piece = 1 << 20;
  for (uint64_t off = 0; off < data.size() / 2; off += piece) {
    body.Append(data.SliceUnchecked(off, piece), piece);
  }
  // Half the body is out: a part goes up before the rest exists.
  for (int i = 0; i < 6000 && part_puts_.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int before_finish = part_puts_.load();
  for (uint64_t off = data.size() / 2; off < data.size(); off += piece) {
    body.Append(data.SliceUnchecked(off, piece), piece);
  }
  body.Finish(Message{});
  uploader.join();
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_GE(before_finish, 1);
  EXPECT_GT(result->early_bytes, 0u);
  EXPECT_LE(result->parts, 8u);
  EXPECT_GE(result->parts, 3u);
  auto got = client_->GetObject({.bucket = "bkt", .key = "mp/streamed"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->data.view(), head_bytes + std::string(data.view()));
}

// A body under one part goes with its head as one part; an abandoned body
// is Cancelled, and the same URLs then take the whole upload again.
TEST_F(ClientTest, AStreamedUploadOfASmallOrAbandonedBody) {
  {
    EncodeStream body;
    const Buffer data = Pattern(1000, 22);
    body.Append(data, data.size());
    body.Finish(Message{});
    UrlStreamUpload up;
    up.upload = PresignedUpload(*client_, "mp/small-stream", 4);
    up.body = &body;
    up.head = [] { return Result<GatherList>(Gather(Buffer::CopyFrom(std::string("HEAD")))); };
    auto r = HttpPutUrlStream(up);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->parts, 1u);
    EXPECT_EQ(r->early_bytes, 0u);
    auto got = client_->GetObject({.bucket = "bkt", .key = "mp/small-stream"});
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->data.view(), "HEAD" + std::string(data.view()));
  }
  {
    EncodeStream body(24ull << 20);
    const Buffer data = Pattern(24ull << 20, 23);
    UrlStreamUpload up;
    up.upload = PresignedUpload(*client_, "mp/abandoned-stream", 6);
    up.body = &body;
    up.head = [] { return Result<GatherList>(Gather(Buffer::CopyFrom(std::string("HEAD")))); };
    Result<UrlStreamResult> result = Internal("not run");
    const int puts_before = part_puts_.load();
    std::thread uploader([&] { result = HttpPutUrlStream(up); });
    body.Append(data.SliceUnchecked(0, 16ull << 20), 16ull << 20);
    // Parts of the abandoned body are on the server: the upload below
    // replaces them.
    for (int i = 0; i < 6000 && part_puts_.load() == puts_before; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_GT(part_puts_.load(), puts_before);
    body.Abandon();
    uploader.join();
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), StatusCode::kCancelled) << result.status().ToString();
    EXPECT_EQ(client_->HeadObject({"bkt", "mp/abandoned-stream"}).status().code(),
              StatusCode::kNotFound);
    UrlUploadArgs again = up.upload;
    const Buffer other = Pattern(11ull << 20, 24);
    again.body = Gather(other);
    auto n = HttpPutUrlParts(again);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    auto got = client_->GetObject({.bucket = "bkt", .key = "mp/abandoned-stream"});
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->data.view(), other.view());
  }
  {  // a head that cannot be made fails the upload
    EncodeStream body;
    body.Finish(Message{});
    UrlStreamUpload up;
    up.upload = PresignedUpload(*client_, "mp/no-head", 2);
    up.body = &body;
    up.head = [] { return Result<GatherList>(Corrupt("no header")); };
    EXPECT_EQ(HttpPutUrlStream(up).status().code(), StatusCode::kCorrupt);
  }
}

TEST_F(ClientTest, VirtualHostedAddressing) {
  S3ClientOptions co;
  co.endpoint = "http://localhost:" + std::to_string(server_->port());
  co.addressing = S3Addressing::kVirtualHost;
  co.credentials = StaticCredentials({kAk, kSk});
  auto c = S3Client::Create(co);
  ASSERT_TRUE(c.ok());
  auto put = (*c)->PutObject(
      {.bucket = "bkt", .key = "vh/key", .body = Gather(Buffer::CopyFrom("virtual"))});
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  auto url = (*c)->PresignUrl({.bucket = "bkt", .key = "vh/key"});
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(url->rfind("http://bkt.localhost:", 0), 0u) << *url;
  // Path style sees the same object.
  auto got = client_->GetObject({.bucket = "bkt", .key = "vh/key"});
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->data.view(), "virtual");
}

TEST_F(ClientTest, ArgumentsAreValidatedBeforeIo) {
  // An endpoint nobody listens on: validation errors must come first.
  S3ClientOptions co;
  co.endpoint = "http://127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  co.credentials = StaticCredentials({kAk, kSk});
  co.max_retries = 0;
  auto c = S3Client::Create(co);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->GetObject({.bucket = "b", .key = "k"}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*c)->GetObject({.bucket = "bkt", .key = ""}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*c)->UploadObject({.bucket = "bkt", .key = "k", .part_size = 1024}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*c)->DownloadObject({.bucket = "bkt", .key = "k", .connections = 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*c)->PresignUrl({.bucket = "bkt", .key = "k", .expires = std::chrono::seconds(0)})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*c)->GetObject({.bucket = "bkt", .key = "k"}).status().code(),
            StatusCode::kUnavailable);
  EXPECT_FALSE(S3Client::Create({.endpoint = "ftp://x"}).ok());
  EXPECT_FALSE(S3Client::Create({.endpoint = "http://host/path"}).ok());
}

TEST(S3ClientPresign, MatchesAwsDocumentedExample) {
  S3ClientOptions co;
  co.endpoint = "https://s3.amazonaws.com";
  co.credentials =
      StaticCredentials({"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"});
  auto c = S3Client::Create(co);
  ASSERT_TRUE(c.ok());
  auto url = (*c)->PresignUrl({.bucket = "examplebucket",
                               .key = "test.txt",
                               .expires = std::chrono::seconds(86400),
                               .signing_time = 1369353600});
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(*url,
            "https://examplebucket.s3.amazonaws.com/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
            "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
            "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404");
}

TEST(S3Credentials, ProviderChain) {
  auto dir = std::filesystem::temp_directory_path() / ("xsilo-creds-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string file = (dir / "credentials").string();
  {
    std::ofstream out(file);
    out << "# comment\n[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n\n"
           "[profile other]\naws_access_key_id=OTH\naws_secret_access_key=othsecret\n"
           "aws_session_token=tok\n";
  }
  auto def = SharedFileCredentials(file, "default")->Get();
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->access_key_id, "DEF");
  EXPECT_EQ(def->secret_access_key, "defsecret");
  auto other = SharedFileCredentials(file, "other")->Get();
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->session_token, "tok");
  EXPECT_EQ(SharedFileCredentials(file, "missing")->Get().status().code(), StatusCode::kNotFound);
  EXPECT_EQ(SharedFileCredentials((dir / "nope").string())->Get().status().code(),
            StatusCode::kNotFound);

  ::setenv("AWS_ACCESS_KEY_ID", "ENVKEY", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
  ::setenv("AWS_SESSION_TOKEN", "envtok", 1);
  auto chain = CredentialsChain({EnvironmentCredentials(), SharedFileCredentials(file)});
  auto env = chain->Get();
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->access_key_id, "ENVKEY");
  EXPECT_EQ(env->session_token, "envtok");
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  ::unsetenv("AWS_SESSION_TOKEN");
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", file.c_str(), 1);
  ::setenv("AWS_PROFILE", "other", 1);
  auto fallback = DefaultCredentialsChain()->Get();
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(fallback->access_key_id, "OTH");
  ::unsetenv("AWS_SHARED_CREDENTIALS_FILE");
  ::unsetenv("AWS_PROFILE");
  auto explicit_first =
      CredentialsChain({StaticCredentials({"X", "Y"}), SharedFileCredentials(file)})->Get();
  EXPECT_EQ(explicit_first->access_key_id, "X");
  std::filesystem::remove_all(dir);
}

// Scenario 2 of issue 17: a credential-less download of a Big-tier model
// (66,362,880 float32 parameters as one safetensors object) by presigned
// ranged GETs, with the connection carrying the byte at 40 % of the object
// cut there once. The cut range resumes from the byte where it stopped (no
// restart from zero, no refetch of other ranges): the server sends the
// object plus nothing, and the tensor's checksum matches.
// `directory`: the server stores on disk and sends by sendfile(2). The
// download checks block checksums as the bytes arrive, the resumed range's
// blocks included.
void CutAt40PercentAndResume(bool directory) {
  const uint64_t params = FindTier("big")->parameters;
  const Tensor tensor = testing::PatternTensor(params * 4, 40);
  EncodedPayload payload = EncodeSafetensors({{"model", tensor}});
  const uint64_t size = payload.bytes.size;
  const uint64_t cut_at = size * 2 / 5;
  std::mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [first, last] requested
  uint64_t cut_range_first = 0;
  std::atomic<bool> cut_done{false};
  auto parse = [](const std::string& h, uint64_t* first, uint64_t* last) {
    return std::sscanf(h.c_str(), "bytes=%" SCNu64 "-%" SCNu64, first, last) == 2;
  };
  S3ServerOptions o;
  o.access_key = kAk;
  o.secret_key = kSk;
  o.buckets = {"bkt"};
  const auto dir =
      std::filesystem::temp_directory_path() / ("xsilo-s3-cut-" + std::to_string(::getpid()));
  struct RemoveAtExit {
    std::filesystem::path p;
    ~RemoveAtExit() { std::filesystem::remove_all(p); }
  } remove_at_exit{dir};
  if (directory) o.directory = dir.string();
  o.fault_drop_after_body_bytes = [&](const S3FaultRequest& r) -> int64_t {
    uint64_t first = 0, last = 0;
    if (r.method != "GET" || !parse(r.range, &first, &last)) return -1;
    std::lock_guard<std::mutex> lock(mu);
    ranges.emplace_back(first, last);
    if (first <= cut_at && cut_at <= last && !cut_done.exchange(true)) {
      cut_range_first = first;
      return static_cast<int64_t>(cut_at - first);
    }
    return -1;
  };
  auto server = S3Server::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  S3ClientOptions co;
  co.endpoint = (*server)->endpoint();
  co.addressing = S3Addressing::kPath;
  co.credentials = StaticCredentials({kAk, kSk});
  auto client = S3Client::Create(co);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->PutObject({.bucket = "bkt", .key = "model", .body = payload.bytes}).ok());
  auto url = (*client)->PresignUrl({.method = "GET", .bucket = "bkt", .key = "model"});
  ASSERT_TRUE(url.ok()) << url.status().ToString();

  UrlDownloadArgs args;
  args.url = *url;
  args.size = size;
  args.connections = 8;
  args.retry_base_delay = std::chrono::milliseconds(1);
  const uint64_t block = BlockBytesFor(size);
  const std::vector<uint64_t> sums = BlockChecksums(payload.bytes, block);
  args.block_bytes = block;
  args.block_sums = sums;
  auto got = HttpGetUrlRanges(args);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->range_retries, 1u);
  EXPECT_EQ(Checksum(got->data.span()), payload.checksum);
  auto tensors = DecodeSafetensors(got->data);
  ASSERT_TRUE(tensors.ok()) << tensors.status().ToString();
  EXPECT_EQ(Checksum(tensors->at("model").data.span()), Checksum(tensor.data.span()));

  std::lock_guard<std::mutex> lock(mu);
  ASSERT_TRUE(cut_done.load());
  ASSERT_EQ(ranges.size(), got->ranges + 1) << "one request per range plus one resume";
  uint64_t sent = 0, resumed_from = 0;
  const uint64_t range_bytes = ranges.front().second - ranges.front().first + 1;
  for (const auto& [first, last] : ranges) {
    if (first > cut_range_first && first <= cut_at && last >= cut_at) resumed_from = first;
    sent += last - first + 1;
  }
  // The cut request sent cut_at - cut_range_first bytes, not its whole range.
  const uint64_t cut_range_last = std::find_if(ranges.begin(), ranges.end(), [&](const auto& r) {
                                    return r.first == cut_range_first;
                                  })->second;
  sent -= cut_range_last - cut_at + 1;
  EXPECT_EQ(resumed_from, cut_at) << "the resume did not start at the cut";
  EXPECT_EQ(sent, size) << "bytes fetched beyond the object";
  EXPECT_LE(sent, size + range_bytes);
}

TEST(PresignedDownload, ACutAt40PercentResumesFromTheCut) { CutAt40PercentAndResume(false); }
TEST(PresignedDownload, ACutAt40PercentOfAFileSentBySendfileResumesFromTheCut) {
  CutAt40PercentAndResume(true);
}

// With a pool, a download's storage goes back to it once the result is
// dropped, and the next download of the size reuses it (no fresh memory).
TEST_F(ClientTest, APoolLendsTheStorageOfADroppedDownloadToTheNext) {
  const uint64_t size = 9ull << 20;  // pooled sizes start at 8 MiB
  std::string bytes(size, '\0');
  for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  const std::string url = StoreForUrl("m", bytes);
  ASSERT_FALSE(url.empty());
  BufferPool pool(1ull << 30, std::chrono::seconds(60));
  UrlDownloadArgs args;
  args.url = url;
  args.size = size;
  args.connections = 4;
  args.pool = &pool;
  const uint8_t* first_storage = nullptr;
  {
    auto got = HttpGetUrlRanges(args);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->data.view(), bytes);
    first_storage = got->data.storage_span().data();
    EXPECT_EQ(pool.idle_bytes(), 0u);
  }
  EXPECT_GE(pool.idle_bytes(), size) << "the dropped download's storage did not go back";
  auto again = HttpGetUrlRanges(args);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->data.storage_span().data(), first_storage);
  EXPECT_EQ(again->data.view(), bytes);
  EXPECT_EQ(pool.idle_bytes(), 0u);
  again = Cancelled("dropped");  // gives its storage back to the pool

  // Block checksums: each range is checked as it arrives. Right ones pass;
  // one wrong block fails the download with Corrupt naming its bytes; a
  // list of the wrong length is refused before anything is fetched.
  const uint64_t block = 1ull << 20;
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  std::vector<uint64_t> sums = BlockChecksums(std::span<const uint8_t>(data, size), block);
  ASSERT_EQ(sums.size(), 9u);
  args.block_bytes = block;
  args.block_sums = sums;
  auto checked = HttpGetUrlRanges(args);
  ASSERT_TRUE(checked.ok()) << checked.status().ToString();
  EXPECT_EQ(checked->data.view(), bytes);
  checked = Cancelled("dropped");
  sums[5] ^= 1;
  auto bad = HttpGetUrlRanges(args);
  ASSERT_EQ(bad.status().code(), StatusCode::kCorrupt) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("bytes 5242880-6291455"), std::string::npos)
      << bad.status().ToString();
  args.block_sums = std::span<const uint64_t>(sums).first(8);
  EXPECT_EQ(HttpGetUrlRanges(args).status().code(), StatusCode::kInvalidArgument);
}

// An object of less than a block per connection (a 3.4 MB model delta to
// a client on a long link, where one connection carries a few MB/s) goes
// over every connection when ranges may be small, in ranges that split
// each block; a block is checked once its last range is in, and a wrong
// one still fails the download with Corrupt naming its bytes.
TEST_F(ClientTest, AnObjectSmallerThanABlockPerConnectionGoesOverEveryConnection) {
  const uint64_t size = (3ull << 20) + 12345;
  std::string bytes(size, '\0');
  for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 13 + 5);
  const std::string url = StoreForUrl("small", bytes);
  ASSERT_FALSE(url.empty());
  const uint64_t block = 1ull << 20;
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  std::vector<uint64_t> sums = BlockChecksums(std::span<const uint8_t>(data, size), block);
  ASSERT_EQ(sums.size(), 4u);
  UrlDownloadArgs args;
  args.url = url;
  args.size = size;
  args.connections = 32;
  args.block_bytes = block;
  args.block_sums = sums;
  args.min_range_bytes = 64 << 10;
  auto got = HttpGetUrlRanges(args);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  // Ranges of size / 32 (98690 bytes), which straddle blocks (whole
  // blocks would be 4 ranges).
  EXPECT_EQ(got->ranges, 32u);
  EXPECT_EQ(got->data.view(), bytes);
  // Two ranges cut after 50000 bytes resume where they stopped, and the
  // blocks they share with their neighbours are still checked once whole.
  drops_left_ = 2;
  drop_after_ = 50000;
  args.retry_base_delay = std::chrono::milliseconds(1);
  auto resumed = HttpGetUrlRanges(args);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->range_retries, 2u);
  EXPECT_EQ(resumed->data.view(), bytes);
  for (size_t wrong : {size_t{1}, size_t{3}}) {
    std::vector<uint64_t> bad_sums = sums;
    bad_sums[wrong] ^= 1;
    args.block_sums = bad_sums;
    auto bad = HttpGetUrlRanges(args);
    ASSERT_EQ(bad.status().code(), StatusCode::kCorrupt) << bad.status().ToString();
    const uint64_t first = wrong * block;
    const std::string named =
        "bytes " + std::to_string(first) + "-" + std::to_string(std::min(first + block, size) - 1);
    EXPECT_NE(bad.status().message().find(named), std::string::npos) << bad.status().ToString();
  }
  // Without checksums the ranges are size / connections too, at least the
  // least range.
  args.block_bytes = 0;
  args.block_sums = {};
  auto plain = HttpGetUrlRanges(args);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->ranges, 32u);
  EXPECT_EQ(plain->data.view(), bytes);
  args.size = 100 << 10;
  args.url = StoreForUrl("tiny", std::string_view(bytes).substr(0, args.size));
  ASSERT_FALSE(args.url.empty());
  auto tiny = HttpGetUrlRanges(args);
  ASSERT_TRUE(tiny.ok()) << tiny.status().ToString();
  EXPECT_EQ(tiny->ranges, 2u);
  EXPECT_EQ(tiny->data.view(), bytes.substr(0, args.size));
}

// By default the least range follows the server's link: 1 MiB until a
// download from it showed its responses coming a long round trip (20 ms)
// after their requests, 64 KiB from then on. (Only the long direction is
// timed here: a delay can make a response later, never sooner. The
// figures are per process and per host and port: ctest runs each test in
// a process of its own.)
TEST_F(ClientTest, RangesShrinkOnceADownloadShowedALongLink) {
  EXPECT_EQ(UrlMinRangeBytes(-1), 1u << 20);
  EXPECT_EQ(UrlMinRangeBytes(0.0005), 1u << 20);
  EXPECT_EQ(UrlMinRangeBytes(0.020), 64u << 10);
  EXPECT_EQ(UrlMinRangeBytes(0.25), 64u << 10);
  const uint64_t size = (3ull << 20) + 12345;
  Buffer data = Pattern(size, 17);
  UrlDownloadArgs args;
  args.url = StoreForUrl("far", data.view());
  ASSERT_FALSE(args.url.empty());
  args.size = size;
  args.connections = 32;
  range_delay_ms_ = 30;
  // This server's first download: ranges of 1 MiB.
  auto first = HttpGetUrlRanges(args);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->min_range_bytes, 1u << 20);
  EXPECT_EQ(first->ranges, 4u);
  EXPECT_EQ(first->data.view(), data.view());
  // Its responses came 30 ms or more after their requests: size / 32.
  auto second = HttpGetUrlRanges(args);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->min_range_bytes, 64u << 10);
  EXPECT_EQ(second->ranges, 32u);
  EXPECT_EQ(second->data.view(), data.view());
  // A fixed least range is kept whatever the link.
  args.min_range_bytes = 2 << 20;
  auto fixed = HttpGetUrlRanges(args);
  ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
  EXPECT_EQ(fixed->ranges, 2u);
  EXPECT_EQ(fixed->data.view(), data.view());
}

}  // namespace
}  // namespace xsilo
