// libcurl's memory functions (src/s3/curl_memory.h): large blocks are
// mappings reused from a bounded cache, and curl's per-transfer buffers
// really come from them.
#include "s3/curl_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "s3/s3_test_util.h"
#include "transport/test_util.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define XSILO_HAS_ASAN_FEATURE 1
#endif
#endif
#ifndef XSILO_HAS_ASAN_FEATURE
#define XSILO_HAS_ASAN_FEATURE 0
#endif
namespace xsilo::s3client {
namespace {

TEST(CurlMemory, ALargeBlockIsReusedNotMappedAgain) {
  TrimCurlMemory();
  const CurlMemoryStats s0 = GetCurlMemoryStats();
  void* a = CurlMalloc(1 << 20);
  ASSERT_NE(a, nullptr);
  std::memset(a, 0xab, 1 << 20);
  CurlFree(a);
  void* b = CurlMalloc(1 << 20);
  ASSERT_NE(b, nullptr);
  const CurlMemoryStats s1 = GetCurlMemoryStats();
  EXPECT_EQ(b, a);
  EXPECT_EQ(s1.large_allocations - s0.large_allocations, 2u);
  EXPECT_EQ(s1.large_maps - s0.large_maps, 1u);
  EXPECT_GE(s1.live_large_bytes - s0.live_large_bytes, uint64_t{1} << 20);
  CurlFree(b);
  EXPECT_EQ(GetCurlMemoryStats().live_large_bytes, s0.live_large_bytes);
}

TEST(CurlMemory, TheCacheIsBounded) {
  TrimCurlMemory();
  std::vector<void*> blocks;
  for (int i = 0; i < 40; ++i) blocks.push_back(CurlMalloc(2 << 20));
  for (void* p : blocks) ASSERT_NE(p, nullptr);
  for (void* p : blocks) CurlFree(p);
  const CurlMemoryStats s = GetCurlMemoryStats();
  EXPECT_LE(s.cached_bytes, kMaxCachedBytes);
  EXPECT_GT(s.cached_bytes, kMaxCachedBytes / 2);
  TrimCurlMemory();
  EXPECT_EQ(GetCurlMemoryStats().cached_bytes, 0u);
}

TEST(CurlMemory, ReallocKeepsTheBytesAcrossSmallAndLarge) {
  char* p = static_cast<char*>(CurlMalloc(100));
  ASSERT_NE(p, nullptr);
  for (int i = 0; i < 100; ++i) p[i] = static_cast<char>(i);
  p = static_cast<char*>(CurlRealloc(p, 3 << 20));  // small -> large
  ASSERT_NE(p, nullptr);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(p[i], static_cast<char>(i));
  std::memset(p + 100, 7, (3 << 20) - 100);
  char* const large = p;
  p = static_cast<char*>(CurlRealloc(p, (3 << 20) - 4096));  // shrinks in place
  ASSERT_EQ(p, large);
  EXPECT_EQ(p[(3 << 20) - 4097], 7);
  p = static_cast<char*>(CurlRealloc(p, 50));  // large -> small
  ASSERT_NE(p, nullptr);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(p[i], static_cast<char>(i));
  CurlFree(p);
}

TEST(CurlMemory, CallocZeroesAReusedBlockAndRefusesOverflow) {
  void* a = CurlMalloc(1 << 20);
  ASSERT_NE(a, nullptr);
  std::memset(a, 0xff, 1 << 20);
  CurlFree(a);
  auto* z = static_cast<unsigned char*>(CurlCalloc(1 << 10, 1 << 10));
  ASSERT_NE(z, nullptr);
  for (size_t i = 0; i < (1 << 20); ++i) ASSERT_EQ(z[i], 0) << i;
  CurlFree(z);
  EXPECT_EQ(CurlCalloc(SIZE_MAX / 2 + 2, 2), nullptr);  // the product wraps to 2
  EXPECT_EQ(CurlMalloc(SIZE_MAX - 8), nullptr);
  char* d = CurlStrdup("xsilo");
  ASSERT_NE(d, nullptr);
  EXPECT_STREQ(d, "xsilo");
  CurlFree(d);
}

// The S3 client's transfers get curl's 1 MiB receive buffer from here, and
// the second transfer reuses the first one's instead of mapping anew. Not a
// case of a sanitized build, where curl keeps malloc: it is not compiled
// there (a skip would count as a test that could not run).
#if !defined(__SANITIZE_ADDRESS__) && !XSILO_HAS_ASAN_FEATURE
TEST(CurlMemory, TheClientsTransfersUseItAndReuseTheirBuffers) {
  static_assert(!kCurlMemoryUnderSanitizer);
  auto s3 = testing::StartS3ServerAndClient("ak", "sk", "bkt");
  ASSERT_TRUE(s3.ok()) << s3.status().ToString();
  S3Client& client = *s3->client;
  ASSERT_TRUE(CurlMemoryInstalled());
  GatherList body;
  body.Append(testing::PatternTensor(3 << 20, 1).data);
  ASSERT_TRUE(client.PutObject({.bucket = "bkt", .key = "k", .body = body}).ok());

  auto get = [&] {
    auto got = client.GetObject({.bucket = "bkt", .key = "k"});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->data.size(), uint64_t{3} << 20);
  };
  get();  // warms the cache
  const CurlMemoryStats s0 = GetCurlMemoryStats();
  for (int i = 0; i < 5; ++i) get();
  const CurlMemoryStats s1 = GetCurlMemoryStats();
  EXPECT_GE(s1.large_allocations - s0.large_allocations, 5u);
  EXPECT_EQ(s1.large_maps, s0.large_maps);
}
#endif

}  // namespace
}  // namespace xsilo::s3client
