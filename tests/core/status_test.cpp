#include <gtest/gtest.h>

#include "xsilo/core/status.h"

namespace xsilo {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  XSILO_ASSIGN_OR_RETURN(int h, Half(x));
  return Half(h);
}

Status CheckEven(int x) {
  XSILO_RETURN_IF_ERROR(Half(x).status());
  return Status::OK();
}

TEST(Status, OkIsDefaultAndCheap) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_EQ(s.message(), "");
}

TEST(Status, CarriesCodeAndMessage) {
  Status s = Corrupt("checksum mismatch");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_EQ(s.ToString(), "Corrupt: checksum mismatch");
  EXPECT_EQ(s.WithContext("decode").ToString(), "Corrupt: decode: checksum mismatch");
  EXPECT_EQ(Status(StatusCode::kOk, "ignored").ok(), true);
}

TEST(Result, ValueOrStatusAndMacros) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Quarter(6).status().message(), "odd: 3");
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_FALSE(CheckEven(5).ok());
  EXPECT_EQ(Half(3).value_or(-1), -1);
}

}  // namespace
}  // namespace xsilo
