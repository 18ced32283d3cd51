// Benchmark backend names: "NAME~CODEC" and "NAME~CODEC:whole".
#include "xsilo/bench/report.h"

#include <gtest/gtest.h>

namespace xsilo::bench {
namespace {

TEST(BenchNames, ACodecSuffixAddsCompressionAndWholeTurnsStreamingOff) {
  std::string base;
  std::map<std::string, std::string> o;
  ASSERT_TRUE(SplitCompressionSuffix("auto+s3", &base, &o));
  EXPECT_EQ(base, "auto+s3");
  EXPECT_TRUE(o.empty());
  ASSERT_TRUE(SplitCompressionSuffix("auto+s3~int8+topk", &base, &o));
  EXPECT_EQ(base, "auto+s3");
  EXPECT_EQ(o, (std::map<std::string, std::string>{{"compression", "int8+topk"}}));
  o.clear();
  ASSERT_TRUE(SplitCompressionSuffix("auto+s3~int8:whole", &base, &o));
  EXPECT_EQ(base, "auto+s3");
  EXPECT_EQ(o, (std::map<std::string, std::string>{{"compression", "int8"},
                                                   {"compression.stream", "0"}}));
  EXPECT_FALSE(SplitCompressionSuffix("auto+s3~gzip", &base, &o));
  EXPECT_FALSE(SplitCompressionSuffix("auto+s3~:whole", &base, &o));
  EXPECT_FALSE(SplitCompressionSuffix("~int8", &base, &o));
}

}  // namespace
}  // namespace xsilo::bench
