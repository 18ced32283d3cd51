#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <vector>

#include "store/connector_conformance.h"
#include "store/redis_server.h"
#include "transport/test_util.h"
#include "xsilo/s3/server.h"

namespace xsilo::testing {
namespace {

std::atomic<int> g_counter{0};

// Directories made for file connectors, removed when the process exits.
struct TempDirs {
  std::mutex mu;
  std::vector<std::filesystem::path> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};

std::string FreshDir() {
  static TempDirs temp;
  auto dir =
      std::filesystem::temp_directory_path() /
      ("xsilo-file-connector-" + std::to_string(getpid()) + "-" + std::to_string(g_counter++));
  std::lock_guard<std::mutex> lock(temp.mu);
  temp.dirs.push_back(dir);
  return dir.string();
}

}  // namespace
}  // namespace xsilo::testing

XSILO_CONNECTOR_CONFORMANCE(
    Memory,
    {.name = "memory",
     .config =
         [] {
           return ::xsilo::ConnectorConfig{"memory", {{"name", "t" + std::to_string(g_counter++)}}};
         },
     .cross_process = false});

XSILO_CONNECTOR_CONFORMANCE(File, {.name = "file", .config = [] {
                                     return ::xsilo::ConnectorConfig{"file", {{"dir", FreshDir()}}};
                                   }});

// Small parts so that multi-part objects are exercised at every size.
XSILO_CONNECTOR_CONFORMANCE(Redis, {.name = "redis", .config = [] {
                                      return ::xsilo::ConnectorConfig{
                                          "redis",
                                          {{"port", std::to_string(RedisTestPort())},
                                           {"prefix", "t" + std::to_string(g_counter++)},
                                           {"part_bytes", std::to_string(64 << 20)}}};
                                    }});

namespace xsilo {
namespace {

TEST(ConnectorRegistry, UnknownTypeAndBadOptions) {
  EXPECT_EQ(MakeConnector({"tape", {}}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(MakeConnector({"file", {}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeConnector({"file", {{"dir", "/tmp/x"}, {"speed", "fast"}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeConnector({"redis", {{"part_bytes", "1000000000"}}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ConnectorRegistry, UnreachableRedisIsUnavailable) {
  auto c = MakeConnector({"redis", {{"port", std::to_string(testing::FreeTcpPort())}}});
  ASSERT_TRUE(c.ok());
  auto k = (*c)->Put(Buffer::CopyFrom("x"));
  EXPECT_EQ(k.status().code(), StatusCode::kUnavailable);
}

TEST(Key, JsonRoundTripAndValidation) {
  Key k{"s3", "abc", 1ull << 40, {{"bucket", "b"}}};
  auto back = Key::FromJson(k.ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, k);
  EXPECT_FALSE(Key::FromJson("{\"c\":\"s3\"}").ok());
  EXPECT_FALSE(Key::FromJson("not json").ok());
  EXPECT_FALSE(Key::FromJson(R"({"c":"s3","id":"x","size":-1})").ok());
}

TEST(FileConnector, RejectsPathTraversal) {
  auto c = MakeConnector({"file", {{"dir", testing::FreshDir()}}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->Get(Key{"file", "../etc/passwd", 0, {}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*c)->Get(Key{"file", ".tmp-x", 0, {}}).status().code(), StatusCode::kInvalidArgument);
}

TEST(FileConnector, LeavesNoTemporaryFiles) {
  std::string dir = testing::FreshDir();
  auto c = MakeConnector({"file", {{"dir", dir}}});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Put(Buffer::CopyFrom("abc")).ok());
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path();
    ++files;
  }
  EXPECT_EQ(files, 1);
}

}  // namespace
}  // namespace xsilo
