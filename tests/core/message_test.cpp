#include <gtest/gtest.h>

#include "xsilo/core/base64.h"
#include "xsilo/core/message.h"

namespace xsilo {
namespace {

TEST(DType, NamesAndSizesRoundTrip) {
  for (DType d : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32,
                  DType::kI16, DType::kI8, DType::kU8, DType::kBool}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_FALSE(ParseDType("F8").ok());
}

TEST(Tensor, MakeChecksShapeAgainstBytes) {
  EXPECT_TRUE(Tensor::Make(DType::kF32, {2, 3}, *Buffer::Allocate(24)).ok());
  EXPECT_EQ(Tensor::Make(DType::kF32, {2, 3}, *Buffer::Allocate(20)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(Tensor::Make(DType::kF32, {-1}, Buffer()).ok());
  EXPECT_FALSE(Tensor::Make(DType::kF64, {INT64_MAX, INT64_MAX}, Buffer()).ok());
  EXPECT_TRUE(Tensor::Make(DType::kF32, {}, *Buffer::Allocate(4)).ok());  // scalar
  EXPECT_TRUE(Tensor::Make(DType::kF32, {0, 5}, Buffer()).ok());          // empty
}

TEST(Message, TypedParams) {
  Message m;
  m.params["n"] = int64_t{3};
  m.params["s"] = std::string("x");
  EXPECT_EQ(*m.GetInt("n"), 3);
  EXPECT_EQ(m.GetString("n").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.GetDouble("missing").status().code(), StatusCode::kNotFound);
}

TEST(Base64, RoundTripsAndRejectsGarbage) {
  for (std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar"}) {
    std::vector<uint8_t> bytes(s.begin(), s.end());
    auto back = Base64Decode(Base64Encode(bytes));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, bytes);
  }
  EXPECT_EQ(Base64Encode(std::vector<uint8_t>{'f', 'o', 'o', 'b'}), "Zm9vYg==");
  EXPECT_FALSE(Base64Decode("Zm9").has_value());
  EXPECT_FALSE(Base64Decode("Zm=v").has_value());
  EXPECT_FALSE(Base64Decode("Z!9v").has_value());
}

}  // namespace
}  // namespace xsilo
