// Our client on the S3 features of issue #18, one test group per feature
// (standard headers, conditional GET, CopyObject, multipart listing,
// presign expiry, bucket errors), against the embedded server with memory and directory storage
// and against s3rver, so the assertions hold for an S3 server we did not
// write too. Where s3rver lacks a behaviour the test says so and skips
// that part (the boto3 tests in tests/s3/boto3/ cover the rest).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>

#include "s3/s3rver.h"
#include "transport/test_util.h"
#include "xsilo/s3/client.h"
#include "xsilo/s3/server.h"

namespace xsilo {
namespace {

constexpr const char* kBucket = "compat";
constexpr const char* kOtherBucket = "compat-other";

GatherList Gather(std::string_view s) {
  GatherList g;
  g.Append(Buffer::CopyFrom(s));
  return g;
}

std::string Text(const Buffer& b) { return std::string(b.view()); }

std::string Value(const std::vector<std::pair<std::string, std::string>>& list,
                  std::string_view name) {
  for (const auto& [k, v] : list) {
    if (k == name) return v;
  }
  return "<absent>";
}

class CompatTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    S3ClientOptions co;
    co.addressing = S3Addressing::kPath;
    co.max_retries = 0;
    if (s3rver()) {
      auto s = testing::S3rver::Start({.buckets = {kBucket, kOtherBucket}});
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      s3rver_ = std::move(s).value();
      co.endpoint = s3rver_->endpoint();
      co.credentials =
          StaticCredentials({testing::S3rver::kAccessKey, testing::S3rver::kSecretKey});
    } else {
      S3ServerOptions o;
      o.access_key = "compat-ak";
      o.secret_key = "compat-sk";
      o.buckets = {kBucket, kOtherBucket};
      if (GetParam() == "directory") {
        static std::atomic<int> n{0};
        dir_ = (std::filesystem::temp_directory_path() /
                ("xsilo-compat-" + std::to_string(::getpid()) + "-" + std::to_string(n++)))
                   .string();
        o.directory = dir_;
      }
      auto s = S3Server::Start(o);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      server_ = std::move(s).value();
      co.endpoint = server_->endpoint();
      co.credentials = StaticCredentials({"compat-ak", "compat-sk"});
    }
    auto c = S3Client::Create(co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(c).value();
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
    s3rver_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  bool s3rver() const { return GetParam() == "s3rver"; }

  std::string Put(const std::string& key, std::string_view body) {
    auto r = client_->PutObject({.bucket = kBucket, .key = key, .body = Gather(body)});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->etag : "";
  }

  std::unique_ptr<S3Server> server_;
  std::unique_ptr<testing::S3rver> s3rver_;
  std::string dir_;
  std::unique_ptr<S3Client> client_;
};

TEST_P(CompatTest, HeadersStoredAndReturned) {
  PutObjectArgs put{.bucket = kBucket, .key = "h", .body = Gather("weights")};
  put.content_type = "text/x-weights";
  put.metadata = {{"round", "7"}};
  put.headers = {{"cache-control", "max-age=60"},
                 {"Content-Disposition", "attachment; filename=\"w.bin\""},
                 {"Content-Language", "en"},
                 {"Expires", "Wed, 21 Oct 2037 07:28:00 GMT"}};
  ASSERT_TRUE(client_->PutObject(put).ok());
  auto head = client_->HeadObject({.bucket = kBucket, .key = "h"});
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  auto got = client_->GetObject({.bucket = kBucket, .key = "h"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (const S3ObjectInfo* info : {&*head, &got->info}) {
    EXPECT_EQ(info->content_type, "text/x-weights");
    EXPECT_EQ(Value(info->metadata, "round"), "7");
    EXPECT_EQ(Value(info->headers, "Cache-Control"), "max-age=60");
    EXPECT_EQ(Value(info->headers, "Content-Disposition"), "attachment; filename=\"w.bin\"");
    EXPECT_EQ(Value(info->headers, "Content-Language"), "en");
    EXPECT_EQ(Value(info->headers, "Expires"), "Wed, 21 Oct 2037 07:28:00 GMT");
  }
  EXPECT_EQ(Text(got->data), "weights");
}

TEST_P(CompatTest, HeadersOfMultipartUpload) {
  Buffer data = testing::PatternTensor((5 << 20) + 3, 11).data;
  UploadObjectArgs up{.bucket = kBucket, .key = "mp", .part_size = 5 << 20};
  up.body.Append(data);
  up.headers = {{"Cache-Control", "no-store"}};
  up.metadata = {{"party", "a"}};
  auto r = client_->UploadObject(up);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto head = client_->HeadObject({.bucket = kBucket, .key = "mp"});
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->size, data.size());
  EXPECT_EQ(Value(head->headers, "Cache-Control"), "no-store");
  EXPECT_EQ(Value(head->metadata, "party"), "a");
}

TEST_P(CompatTest, HeadersValidateRefusesOthers) {
  PutObjectArgs put{.bucket = kBucket, .key = "h", .body = Gather("x")};
  put.headers = {{"X-Custom", "1"}};
  EXPECT_EQ(client_->PutObject(put).status().code(), StatusCode::kInvalidArgument);
  put.headers = {{"Cache-Control", "a\r\nInjected: 1"}};
  EXPECT_EQ(client_->PutObject(put).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(CompatTest, ConditionalGet) {
  std::string etag = Put("c", "conditional");
  const std::time_t past = 978307200;     // 2001-01-01
  const std::time_t future = 4070908800;  // 2099-01-01
  auto get = [&](GetObjectArgs a) {
    a.bucket = kBucket;
    a.key = "c";
    return client_->GetObject(a);
  };
  auto ok = get({.if_none_match = "\"0123456789abcdef0123456789abcdef\""});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(Text(ok->data), "conditional");
  auto not_modified = get({.if_none_match = etag});
  EXPECT_EQ(not_modified.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(S3ErrorCode(not_modified.status()), "NotModified");
  EXPECT_EQ(S3ErrorCode(get({.if_modified_since = future}).status()), "NotModified");
  EXPECT_TRUE(get({.if_modified_since = past}).ok());
  if (s3rver()) {
    // s3rver ignores If-Match and If-Unmodified-Since: checked, so that a
    // release which implements them shows up here.
    EXPECT_TRUE(get({.if_match = "\"0123456789abcdef0123456789abcdef\""}).ok());
    EXPECT_TRUE(get({.if_unmodified_since = past}).ok());
    return;
  }
  EXPECT_TRUE(get({.if_match = etag}).ok());
  EXPECT_TRUE(get({.if_match = "*"}).ok());
  auto failed = get({.if_match = "\"0123456789abcdef0123456789abcdef\""});
  EXPECT_EQ(failed.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(S3ErrorCode(failed.status()), "PreconditionFailed");
  EXPECT_EQ(S3ErrorCode(get({.if_unmodified_since = past}).status()), "PreconditionFailed");
  EXPECT_TRUE(get({.if_unmodified_since = future}).ok());
  // A ranged read under If-Match: the condition holds for the bytes asked.
  auto part = get({.offset = 4, .length = 3, .if_match = etag});
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_EQ(Text(part->data), "iti");
}

TEST_P(CompatTest, CopyKeepsOrReplacesMetadata) {
  PutObjectArgs put{.bucket = kBucket, .key = "src", .body = Gather("model")};
  put.content_type = "text/x-model";
  put.metadata = {{"round", "3"}};
  put.headers = {{"Cache-Control", "no-store"}};
  ASSERT_TRUE(client_->PutObject(put).ok());

  auto same = client_->CopyObject(
      {.source_bucket = kBucket, .source_key = "src", .bucket = kBucket, .key = "dst"});
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_FALSE(same->etag.empty());
  EXPECT_GT(same->last_modified, 0);
  auto got = client_->GetObject({.bucket = kBucket, .key = "dst"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(Text(got->data), "model");
  EXPECT_EQ(got->info.content_type, "text/x-model");
  EXPECT_EQ(Value(got->info.metadata, "round"), "3");
  EXPECT_EQ(Value(got->info.headers, "Cache-Control"), "no-store");
  EXPECT_EQ(got->info.etag, same->etag);

  CopyObjectArgs replace{
      .source_bucket = kBucket, .source_key = "src", .bucket = kOtherBucket, .key = "dst"};
  replace.replace_metadata = true;
  replace.content_type = "application/json";
  replace.metadata = {{"round", "4"}};
  ASSERT_TRUE(client_->CopyObject(replace).ok());
  auto head = client_->HeadObject({.bucket = kOtherBucket, .key = "dst"});
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->content_type, "application/json");
  EXPECT_EQ(Value(head->metadata, "round"), "4");
  EXPECT_EQ(Value(head->headers, "Cache-Control"), "<absent>");
}

TEST_P(CompatTest, CopyZeroSizeAndMissingSource) {
  Put("empty", "");
  ASSERT_TRUE(
      client_
          ->CopyObject(
              {.source_bucket = kBucket, .source_key = "empty", .bucket = kBucket, .key = "empty2"})
          .ok());
  auto got = client_->GetObject({.bucket = kBucket, .key = "empty2"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->data.size(), 0u);
  auto missing = client_->CopyObject(
      {.source_bucket = kBucket, .source_key = "absent", .bucket = kBucket, .key = "x"});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  EXPECT_EQ(S3ErrorCode(missing.status()), "NoSuchKey");
}

TEST_P(CompatTest, CopySourceIfMatch) {
  std::string etag = Put("src", "v1");
  EXPECT_TRUE(client_
                  ->CopyObject({.source_bucket = kBucket,
                                .source_key = "src",
                                .bucket = kBucket,
                                .key = "ok",
                                .source_if_match = etag})
                  .ok());
  Put("src", "v2");  // replaced: the ETag the caller holds is stale
  auto stale = client_->CopyObject({.source_bucket = kBucket,
                                    .source_key = "src",
                                    .bucket = kBucket,
                                    .key = "never",
                                    .source_if_match = etag});
  if (s3rver()) {
    // s3rver ignores x-amz-copy-source-if-match: the stale copy is made.
    EXPECT_TRUE(stale.ok()) << stale.status().ToString();
    return;
  }
  EXPECT_EQ(S3ErrorCode(stale.status()), "PreconditionFailed") << stale.status().ToString();
  EXPECT_EQ(client_->HeadObject({.bucket = kBucket, .key = "never"}).status().code(),
            StatusCode::kNotFound);
}

TEST_P(CompatTest, CopyValidateRefusesSelfCopyWithoutReplace) {
  auto r = client_->CopyObject(
      {.source_bucket = kBucket, .source_key = "k", .bucket = kBucket, .key = "k"});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST_P(CompatTest, PresignSignedInThePast) {
  Put("p", "presigned");
  const std::time_t now = std::time(nullptr);
  auto expired = client_->PresignUrl({.bucket = kBucket,
                                      .key = "p",
                                      .expires = std::chrono::hours(1),
                                      .signing_time = now - 2 * 3600});
  ASSERT_TRUE(expired.ok()) << expired.status().ToString();
  auto refused = HttpGetUrl(*expired);
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
  auto valid = client_->PresignUrl({.bucket = kBucket,
                                    .key = "p",
                                    .expires = std::chrono::seconds(604800),
                                    .signing_time = now - 2 * 3600});
  ASSERT_TRUE(valid.ok()) << valid.status().ToString();
  auto got = HttpGetUrl(*valid);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(Text(*got), "presigned");
  // Beyond S3's maximum the client refuses before any I/O.
  EXPECT_EQ(
      client_->PresignUrl({.bucket = kBucket, .key = "p", .expires = std::chrono::seconds(604801)})
          .status()
          .code(),
      StatusCode::kInvalidArgument);
}

TEST_P(CompatTest, BucketErrors) {
  Put("k", "x");
  auto not_empty = client_->DeleteBucket({.bucket = kBucket});
  EXPECT_EQ(S3ErrorCode(not_empty), "BucketNotEmpty") << not_empty.ToString();
  EXPECT_EQ(not_empty.code(), StatusCode::kFailedPrecondition);
  auto missing = client_->GetObject({.bucket = "no-such-bucket-xs", .key = "k"});
  EXPECT_EQ(S3ErrorCode(missing.status()), "NoSuchBucket") << missing.status().ToString();
  EXPECT_EQ(S3ErrorCode(client_->DeleteBucket({.bucket = "no-such-bucket-xs"})), "NoSuchBucket");
  auto again = client_->CreateBucket({.bucket = kBucket});
  if (s3rver()) {
    // s3rver treats an own bucket as anyone's: 409 BucketAlreadyExists.
    EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
    EXPECT_EQ(S3ErrorCode(again), "BucketAlreadyExists") << again.ToString();
    return;
  }
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  EXPECT_EQ(S3ErrorCode(again), "BucketAlreadyOwnedByYou");
}

TEST_P(CompatTest, MultipartListingAndCleanup) {
  if (s3rver()) {
    // s3rver implements neither ListMultipartUploads nor ListParts: both
    // are refused, not answered with an empty list. Checked, so that a
    // release which implements them shows up here.
    auto id = client_->CreateMultipartUpload({.bucket = kBucket, .key = "round/1"});
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    auto uploads = client_->ListMultipartUploads({.bucket = kBucket});
    EXPECT_FALSE(uploads.ok()) << "s3rver listed uploads";
    EXPECT_FALSE(client_->ListParts({.bucket = kBucket, .key = "round/1"}, *id).ok());
    // Nor AbortMultipartUpload: 405 MethodNotAllowed.
    Status abort = client_->AbortMultipartUpload({.bucket = kBucket, .key = "round/1"}, *id);
    EXPECT_EQ(S3ErrorCode(abort), "MethodNotAllowed") << abort.ToString();
    return;
  }
  std::vector<std::string> ids;
  for (const char* key : {"round/1", "round/2", "round/2", "other", "round/3"}) {
    auto id = client_->CreateMultipartUpload({.bucket = kBucket, .key = key});
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ids.push_back(*id);
  }
  // Pages of two uploads, followed to the end, in S3's order.
  auto listed = client_->ListMultipartUploads({.bucket = kBucket, .max_uploads = 2});
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  std::vector<std::pair<std::string, std::string>> got;
  for (const auto& u : *listed) got.emplace_back(u.key, u.upload_id);
  std::vector<std::pair<std::string, std::string>> want = {{"other", ids[3]},
                                                           {"round/1", ids[0]},
                                                           {"round/2", ids[1]},
                                                           {"round/2", ids[2]},
                                                           {"round/3", ids[4]}};
  EXPECT_EQ(got, want);
  auto round = client_->ListMultipartUploads({.bucket = kBucket, .prefix = "round/"});
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->size(), 4u);
  EXPECT_GT(round->front().initiated, 0);

  for (int n : {2, 1}) {  // out of order: listed by number
    auto put =
        client_->PresignUrl({.method = "PUT",
                             .bucket = kBucket,
                             .key = "round/1",
                             .query = {{"partNumber", std::to_string(n)}, {"uploadId", ids[0]}}});
    ASSERT_TRUE(put.ok());
    ASSERT_TRUE(HttpPutUrl(*put, Gather(std::string(n * 10, 'p'))).ok());
  }
  auto parts = client_->ListParts({.bucket = kBucket, .key = "round/1"}, ids[0]);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].part_number, 1);
  EXPECT_EQ((*parts)[0].size, 10u);
  EXPECT_EQ((*parts)[1].part_number, 2);
  EXPECT_EQ((*parts)[1].size, 20u);
  EXPECT_FALSE((*parts)[0].etag.empty());

  // What a coordinator does with uploads a crashed party left behind.
  for (const auto& u : *listed) {
    ASSERT_TRUE(client_->AbortMultipartUpload({.bucket = kBucket, .key = u.key}, u.upload_id).ok());
  }
  auto left = client_->ListMultipartUploads({.bucket = kBucket});
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty());
  EXPECT_EQ(S3ErrorCode(client_->ListParts({.bucket = kBucket, .key = "round/1"}, ids[0]).status()),
            "NoSuchUpload");
}

INSTANTIATE_TEST_SUITE_P(Backends, CompatTest, ::testing::Values("memory", "directory", "s3rver"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace xsilo
