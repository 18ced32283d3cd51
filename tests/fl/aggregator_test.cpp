#include "xsilo/fl/aggregator.h"

#include <gtest/gtest.h>

#include <random>

namespace xsilo::fl {
namespace {

Tensor Filled(std::vector<int64_t> shape, float v) {
  Tensor t = *Tensor::Zeros(DType::kF32, std::move(shape));
  float* p = reinterpret_cast<float*>(t.data.mutable_data());
  std::fill(p, p + t.nbytes() / 4, v);
  return t;
}

const float* F(const Tensor& t) { return reinterpret_cast<const float*>(t.data.data()); }

TEST(FedAvgAggregator, WeightsBySampleCount) {
  TensorMap like{{"a", Filled({3, 5}, 0)}, {"b", Filled({7}, 0)}};
  FedAvgAggregator agg;
  ASSERT_TRUE(agg.Reset(like).ok());
  ASSERT_TRUE(agg.Add({{"a", Filled({3, 5}, 1.0f)}, {"b", Filled({7}, 10.0f)}}, 100).ok());
  ASSERT_TRUE(agg.Add({{"a", Filled({3, 5}, 4.0f)}, {"b", Filled({7}, -2.0f)}}, 300).ok());
  EXPECT_EQ(agg.total_samples(), 400u);
  EXPECT_EQ(agg.updates(), 2u);
  auto out = agg.Finish();
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  // (100 * 1 + 300 * 4) / 400 = 3.25 and (100 * 10 - 300 * 2) / 400 = 1.
  for (int i = 0; i < 15; ++i) EXPECT_FLOAT_EQ(F(out->at("a"))[i], 3.25f);
  for (int i = 0; i < 7; ++i) EXPECT_FLOAT_EQ(F(out->at("b"))[i], 1.0f);
  EXPECT_EQ(out->at("a").shape, (std::vector<int64_t>{3, 5}));
}

TEST(FedAvgAggregator, ThreadedMatchesDoubleReference) {
  // Large enough (and an odd size) that the work is split over threads.
  const int64_t n = 300007;
  AggregatorOptions o;
  o.threads = 3;
  o.min_parallel_elements = 1000;
  FedAvgAggregator agg(o);
  ASSERT_TRUE(agg.Reset({{"w", Filled({n}, 0)}}).ok());
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  std::vector<double> num(n, 0.0);
  double den = 0;
  for (uint64_t samples : {17u, 5000u, 1u, 250u}) {
    Tensor t = Filled({n}, 0);
    float* p = reinterpret_cast<float*>(t.data.mutable_data());
    for (int64_t i = 0; i < n; ++i) {
      p[i] = dist(rng);
      num[i] += static_cast<double>(samples) * p[i];
    }
    den += static_cast<double>(samples);
    ASSERT_TRUE(agg.Add({{"w", t}}, samples).ok());
  }
  auto out = agg.Finish();
  ASSERT_TRUE(out.ok());
  const float* p = F(out->at("w"));
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(p[i], num[i] / den, 1e-5) << i;
}

TEST(FedAvgAggregator, RejectsMismatchedUpdatesWithoutTouchingTheSum) {
  FedAvgAggregator agg;
  ASSERT_TRUE(agg.Reset({{"a", Filled({4}, 0)}}).ok());
  EXPECT_EQ(agg.Add({{"a", Filled({5}, 1)}}, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.Add({{"b", Filled({4}, 1)}}, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.Add({{"a", Filled({4}, 1)}, {"b", Filled({4}, 1)}}, 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.Add({{"a", Filled({4}, 1)}}, 0).code(), StatusCode::kInvalidArgument);
  Tensor i32 = *Tensor::Zeros(DType::kI32, {4});
  EXPECT_EQ(agg.Add({{"a", i32}}, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.Finish().status().code(), StatusCode::kFailedPrecondition);

  ASSERT_TRUE(agg.Reset({{"a", Filled({4}, 0)}}).ok());
  ASSERT_TRUE(agg.Add({{"a", Filled({4}, 2)}}, 3).ok());
  auto out = agg.Finish();
  ASSERT_TRUE(out.ok());
  EXPECT_FLOAT_EQ(F(out->at("a"))[3], 2.0f);
}

TEST(FedAvgAggregator, RecyclesOnlyStorageNobodyElseHolds) {
  TensorMap like{{"a", Filled({1000}, 0)}};
  FedAvgAggregator agg;
  ASSERT_TRUE(agg.Reset(like).ok());
  ASSERT_TRUE(agg.Add({{"a", Filled({1000}, 3)}}, 1).ok());
  TensorMap first = *agg.Finish();
  const uint8_t* first_storage = first.at("a").data.data();

  // Still held here (as a model in flight would be): must not be reused.
  agg.Recycle(first);
  ASSERT_TRUE(agg.Reset(like).ok());
  ASSERT_TRUE(agg.Add({{"a", Filled({1000}, 7)}}, 2).ok());
  TensorMap second = *agg.Finish();
  EXPECT_NE(second.at("a").data.data(), first_storage);
  EXPECT_FLOAT_EQ(F(first.at("a"))[999], 3.0f);
  EXPECT_FLOAT_EQ(F(second.at("a"))[0], 7.0f);

  // Handed over for good: reused, and the stale values do not leak in.
  agg.Recycle(std::move(first));
  ASSERT_TRUE(agg.Reset(like).ok());
  ASSERT_TRUE(agg.Add({{"a", Filled({1000}, 5)}}, 4).ok());
  ASSERT_TRUE(agg.Add({{"a", Filled({1000}, 1)}}, 4).ok());
  TensorMap third = *agg.Finish();
  EXPECT_EQ(third.at("a").data.data(), first_storage);
  EXPECT_FLOAT_EQ(F(third.at("a"))[500], 3.0f);

  // A layout change ignores the spare.
  agg.Recycle(std::move(second));
  ASSERT_TRUE(agg.Reset({{"a", Filled({10}, 0)}}).ok());
  ASSERT_TRUE(agg.Add({{"a", Filled({10}, 2)}}, 1).ok());
  EXPECT_EQ(agg.Finish()->at("a").shape, (std::vector<int64_t>{10}));
}

TEST(FedAvgAggregator, RejectsNonFloatModels) {
  FedAvgAggregator agg;
  EXPECT_EQ(agg.Reset({{"a", *Tensor::Zeros(DType::kF16, {4})}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.Add({{"a", Filled({4}, 1)}}, 1).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace xsilo::fl
