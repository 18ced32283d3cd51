// The directory object store keeps every bucket under its root and every
// object inside its bucket: a bucket named "..", "." or ".xsilo-*", or a key
// that climbs ("../x", "/abs"), reaches nothing outside. Checked through the
// server's HTTP API (signed requests: a credential holder cannot escape
// either), through the store directly, and through the co-located helpers
// PutObjectInDirectory / GetObjectFromDirectory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "s3/object_store.h"
#include "s3/raw_http.h"
#include "xsilo/s3/server.h"

namespace xsilo {
namespace {

using s3::testing::RawExchange;
using s3::testing::RawResponse;
using s3::testing::SignedRequest;

constexpr const char* kAk = "traversal-access";
constexpr const char* kSk = "traversal-secret";
constexpr const char* kSecret = "outside the store";

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class DirectoryTraversalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    outside_ = std::filesystem::temp_directory_path() /
               ("xsilo-s3-traversal-" + std::to_string(::getpid()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
    root_ = outside_ / "root";
    std::filesystem::create_directories(root_);
    std::ofstream(outside_ / "secret") << kSecret;
    // A bucket-shaped directory beside the root, as a second store would have.
    std::filesystem::create_directories(outside_ / ".xsilo-tmp");
    std::filesystem::create_directories(outside_ / ".xsilo-meta");
  }
  void TearDown() override { std::filesystem::remove_all(outside_); }

  // Everything outside the root is as SetUp left it.
  void ExpectOutsideUntouched() {
    EXPECT_EQ(ReadFile(outside_ / "secret"), kSecret);
    int entries = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(outside_)) {
      if (e.path().string().rfind(root_.string(), 0) == 0) continue;
      ++entries;
    }
    EXPECT_EQ(entries, 3) << "secret, .xsilo-tmp, .xsilo-meta and nothing else beside the root";
  }

  std::filesystem::path outside_, root_;
};

TEST_F(DirectoryTraversalTest, TheServerKeepsRequestsInsideItsRoot) {
  S3ServerOptions o;
  o.access_key = kAk;
  o.secret_key = kSk;
  o.buckets = {"bkt"};
  o.directory = root_.string();
  auto s = S3Server::Start(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const int port = (*s)->port();
  auto send = [&](const std::string& method, const std::string& path, const std::string& body) {
    return RawExchange(port, SignedRequest(port, method, path, "", body, kAk, kSk));
  };
  for (const char* bucket : {"%2E%2E", "..", ".", ".xsilo-tmp", "%2E"}) {
    const std::string b = bucket;
    SCOPED_TRACE(b);
    RawResponse get = send("GET", "/" + b + "/secret", "");
    EXPECT_GE(get.status, 400);
    EXPECT_EQ(get.body.find(kSecret), std::string::npos);
    EXPECT_GE(send("HEAD", "/" + b + "/secret", "").status, 400);
    send("DELETE", "/" + b + "/secret", "");
    EXPECT_GE(send("PUT", "/" + b + "/planted", "x").status, 400);
    EXPECT_GE(send("PUT", "/" + b + "/", "").status, 400);     // create bucket
    EXPECT_GE(send("DELETE", "/" + b + "/", "").status, 400);  // delete bucket
    EXPECT_GE(send("GET", "/" + b + "/", "").status, 400);     // list
    EXPECT_GE(send("POST", "/" + b + "/k?uploads", "").status, 400);
  }
  // Keys that look like paths are just keys: stored inside the bucket,
  // read back as written.
  for (const char* key : {"../secret", "..%2F..%2Fsecret", "a/../../../secret", "%2Fetc%2Fpasswd",
                          ".xsilo-meta/x", "."}) {
    SCOPED_TRACE(key);
    EXPECT_EQ(send("PUT", std::string("/bkt/") + key, "inside").status, 200);
    EXPECT_EQ(send("GET", std::string("/bkt/") + key, "").body, "inside");
    EXPECT_EQ(send("DELETE", std::string("/bkt/") + key, "").status, 204);
  }
  EXPECT_EQ(send("GET", "/bkt/..%2F..%2Fsecret", "").status, 404);
  ExpectOutsideUntouched();
  // The server still serves its own bucket.
  EXPECT_EQ(send("PUT", "/bkt/ok", "fine").status, 200);
  EXPECT_EQ(send("GET", "/bkt/ok", "").body, "fine");
}

TEST_F(DirectoryTraversalTest, TheStoreRefusesBucketsOutsideItsRoot) {
  auto store = s3::NewDirectoryObjectStore(root_.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE((*store)->CreateBucket("bkt").ok());
  const std::vector<std::string> buckets = {
      "..", ".", "", "../root", "bkt/..", "bkt/../..", ".xsilo-tmp", outside_.string(), "/"};
  for (const std::string& bucket : buckets) {
    SCOPED_TRACE(bucket);
    EXPECT_FALSE((*store)->HeadBucket(bucket).ok());
    EXPECT_FALSE((*store)->Get(bucket, "secret").ok());
    EXPECT_FALSE((*store)->List(bucket, "").ok());
    (void)(*store)->Delete(bucket, "secret");
    s3::StoredObject obj;
    obj.segments.push_back(Buffer::CopyFrom("planted"));
    obj.size = 7;
    EXPECT_FALSE((*store)->Put(bucket, "planted", std::move(obj)).ok());
    EXPECT_FALSE((*store)->CreateBucket(bucket).ok());
    (void)(*store)->DeleteBucket(bucket);

    GatherList body;
    body.Append(Buffer::CopyFrom("planted"));
    EXPECT_FALSE(PutObjectInDirectory(root_.string(), bucket, "planted", body).ok());
    auto got = GetObjectFromDirectory(root_.string(), bucket, "secret");
    EXPECT_FALSE(got.ok());
  }
  // Climbing keys stay inside the bucket (escaped into one flat name).
  s3::StoredObject obj;
  obj.segments.push_back(Buffer::CopyFrom("inside"));
  obj.size = 6;
  ASSERT_TRUE((*store)->Put("bkt", "../../secret", std::move(obj)).ok());
  auto back = GetObjectFromDirectory(root_.string(), "bkt", "../../secret");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->view(), "inside");
  ExpectOutsideUntouched();
  auto listed = (*store)->ListBuckets();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().name, "bkt");
}

}  // namespace
}  // namespace xsilo
