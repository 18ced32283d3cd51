// The benchmarks' model payloads: the Gaussian "weights" payload, its sums,
// and the lossy check a receiver of a compressed copy makes.
#include "xsilo/bench/model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "xsilo/core/compress.h"

namespace xsilo::bench {
namespace {

const float* Values(const Message& m) {
  return reinterpret_cast<const float*>(m.tensors.at("w").data.data());
}

// A copy of `m` through the lossy codec `q` and back, as a receiver gets it.
Message ThroughCodec(const Message& m, Quant q) {
  Message copy = m;
  const Buffer& b = m.tensors.at("w").data;
  copy.tensors.at("w").data = Buffer::CopyFrom(b.data(), b.size());
  TensorRecipe recipe;
  recipe.quant = q;
  EXPECT_TRUE(CompressMessage(&copy, recipe, CompressOptions{}).ok());
  EXPECT_TRUE(DecompressMessage(&copy).ok());
  return copy;
}

TEST(BenchModel, PayloadNamesParseAndBadOnesAreRefused) {
  EXPECT_EQ(*ParseModelPayload("pattern"), ModelPayload::kPattern);
  EXPECT_EQ(*ParseModelPayload("weights"), ModelPayload::kWeights);
  EXPECT_EQ(ParseModelPayload("gaussian").status().code(), StatusCode::kInvalidArgument);
  EXPECT_STREQ(ModelPayloadName(ModelPayload::kWeights), "weights");
}

TEST(BenchModel, WeightsAreGaussianWithTheirSumsRecorded) {
  const uint64_t n = 1 << 20;
  auto m = MakeModel(n, 7, ModelPayload::kWeights);
  ASSERT_TRUE(m.ok());
  const float* p = Values(*m);
  double sum = 0, sq = 0, abs = 0;
  for (uint64_t i = 0; i < n; ++i) {
    sum += p[i];
    sq += static_cast<double>(p[i]) * p[i];
    abs += std::fabs(p[i]);
  }
  EXPECT_NEAR(sum / n, 0.0, 0.001);
  EXPECT_NEAR(std::sqrt(sq / n), 0.05, 0.001);
  EXPECT_NEAR(*m->GetDouble("sum"), sum, 1e-6 * abs);
  EXPECT_NEAR(*m->GetDouble("abs_sum"), abs, 1e-6 * abs);
  EXPECT_TRUE(ModelIntact(*m));
  // Another seed, other values.
  auto other = MakeModel(n, 8, ModelPayload::kWeights);
  EXPECT_NE(*other->GetInt("xxh3"), *m->GetInt("xxh3"));
}

// What the payload is for: zstd after the byte shuffle keeps about as much
// of it as of the FedAvg MLP's trained weights (0.838-0.842,
// docs/compression.md), where the pattern payload shrinks to almost
// nothing.
TEST(BenchModel, WeightsCompressLikeTrainedWeightsAndThePatternDoesNot) {
  auto ratio = [](ModelPayload payload) {
    auto m = MakeModel(1 << 20, 5, payload);
    EXPECT_TRUE(m.ok());
    CompressStats st;
    EXPECT_TRUE(CompressMessage(&*m, TensorRecipe{}, CompressOptions{}, nullptr, 0, &st).ok());
    return st.ratio();
  };
  const double weights = ratio(ModelPayload::kWeights);
  EXPECT_GT(weights, 0.78);
  EXPECT_LT(weights, 0.90);
  EXPECT_LT(ratio(ModelPayload::kPattern), 0.2);
}

TEST(BenchModel, StampKeepsTheSumsAndTheChecksumTrue) {
  auto m = MakeModel(4096, 1, ModelPayload::kWeights);
  ASSERT_TRUE(m.ok());
  for (int64_t stamp : {1, 999, 123456}) {
    StampModel(&*m, stamp);
    double sum = 0, abs = 0;
    for (int i = 0; i < 4096; ++i) {
      sum += Values(*m)[i];
      abs += std::fabs(Values(*m)[i]);
    }
    EXPECT_NEAR(*m->GetDouble("sum"), sum, 1e-9);
    EXPECT_NEAR(*m->GetDouble("abs_sum"), abs, 1e-9);
    EXPECT_LE(std::fabs(Values(*m)[0]), 0.1f) << "a stamp left the weights' range";
    EXPECT_TRUE(ModelIntact(*m));
    EXPECT_EQ(*m->GetInt("stamp"), stamp);
  }
}

TEST(BenchModel, ALossyCopyPassesWithinItsCodecsToleranceOnly) {
  auto m = MakeModel(1 << 18, 3, ModelPayload::kWeights);
  ASSERT_TRUE(m.ok());
  for (auto [q, name] : {std::pair{Quant::kBF16, "bf16"}, std::pair{Quant::kFP16, "fp16"},
                         std::pair{Quant::kInt8, "int8"}}) {
    SCOPED_TRACE(name);
    Message copy = ThroughCodec(*m, q);
    EXPECT_FALSE(ModelIntact(copy)) << "a lossy copy matched the exact checksum";
    EXPECT_TRUE(ModelIntact(copy, LossyTolerance(name)));
    // Damage a lossy check must see: a tenth of the values zeroed.
    float* p = reinterpret_cast<float*>(copy.tensors.at("w").data.mutable_data());
    for (int i = 0; i < (1 << 18) / 10; ++i) p[i] = 0;
    EXPECT_FALSE(ModelIntact(copy, LossyTolerance(name)));
  }
  // One value far out of range fails too.
  Message copy = ThroughCodec(*m, Quant::kBF16);
  reinterpret_cast<float*>(copy.tensors.at("w").data.mutable_data())[5] = 1000.0f;
  EXPECT_FALSE(ModelIntact(copy, LossyTolerance("bf16")));
}

TEST(BenchModel, LosslessCodecsAndThePatternPayloadGetNoTolerance) {
  EXPECT_EQ(LossyTolerance("lossless"), 0);
  EXPECT_EQ(LossyTolerance("auto"), 0);
  EXPECT_EQ(LossyTolerance(""), 0);
  // The pattern payload records no sums: a changed value fails whatever
  // the tolerance.
  auto m = MakeModel(4096, 1);
  ASSERT_TRUE(m.ok());
  reinterpret_cast<float*>(m->tensors.at("w").data.mutable_data())[9] += 1e-3f;
  EXPECT_FALSE(ModelIntact(*m, 0.1));
}

}  // namespace
}  // namespace xsilo::bench
