#include "xsilo/core/copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace xsilo {
namespace {

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + seed);
  return v;
}

// Every head and tail case: each alignment of source and destination and
// every length around the 16-byte alignment and the 64-byte stride.
TEST(CopyStreaming, CopiesEveryAlignmentAndLengthExactly) {
  const std::vector<uint8_t> src = Pattern(512, 7);
  for (size_t src_off = 0; src_off < 17; ++src_off) {
    for (size_t dst_off = 0; dst_off < 17; ++dst_off) {
      for (size_t n = 0; n <= 200; ++n) {
        std::vector<uint8_t> dst(300, 0xEE);
        CopyStreaming(dst.data() + dst_off, src.data() + src_off, n);
        FenceStreamingStores();
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= dst_off && i < dst_off + n;
          const uint8_t want = inside ? src[src_off + i - dst_off] : 0xEE;
          ASSERT_EQ(dst[i], want) << "src+" << src_off << " dst+" << dst_off << " n=" << n
                                  << " byte " << i;
        }
      }
    }
  }
}

TEST(CopyStreaming, CopiesALargeOddRange) {
  const size_t n = (4u << 20) + 77;
  const std::vector<uint8_t> src = Pattern(n + 3, 3);
  std::vector<uint8_t> dst(n + 8, 0);
  CopyStreaming(dst.data() + 5, src.data() + 3, n);
  FenceStreamingStores();
  EXPECT_EQ(0, std::memcmp(dst.data() + 5, src.data() + 3, n));
  EXPECT_EQ(dst[4], 0);
  EXPECT_EQ(dst[n + 5], 0);
}

}  // namespace
}  // namespace xsilo
