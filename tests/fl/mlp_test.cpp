#include "xsilo/fl/mlp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "fl/mlp_gemm.h"
#include "require.h"
#include "xsilo/core/tiers.h"

namespace xsilo::fl {
namespace {

uint64_t CountFromLayout(const MlpShape& s) {
  uint64_t total = 0;
  for (const auto& [name, dims] : s.Layout()) total += *ElementCount(dims);
  return total;
}

TEST(MlpShape, EveryTierHasItsExactParameterCountWithoutPad) {
  for (const auto& tier : kModelTiers) {
    auto s = MlpShapeForTier(tier.name);
    ASSERT_TRUE(s.ok()) << tier.name << ": " << s.status().ToString();
    EXPECT_EQ(s->pad, 0u) << tier.name;
    EXPECT_EQ(s->input, 60u);
    EXPECT_EQ(s->classes, 10u);
    ASSERT_EQ(s->hidden.size(), 3u) << tier.name;
    // Counted two independent ways, neither allocating a parameter.
    EXPECT_EQ(s->ParameterCount(), tier.parameters) << tier.name << " " << s->ToString();
    EXPECT_EQ(CountFromLayout(*s), tier.parameters) << tier.name;
    uint64_t by_hand = 0, prev = 60;
    for (uint64_t h : s->hidden) {
      by_hand += prev * h + h;
      prev = h;
    }
    by_hand += prev * 10 + 10;
    EXPECT_EQ(by_hand, tier.parameters) << tier.name;
  }
  EXPECT_EQ(MlpShapeForTier("small")->ToString(), "60-600-612-300-10");
  EXPECT_EQ(MlpShapeForTier("huge").status().code(), StatusCode::kNotFound);
}

TEST(MlpShape, LayoutFollowsPyTorchLinearConvention) {
  auto s = *MlpShapeForTier("small");
  auto layout = s.Layout();
  ASSERT_EQ(layout.size(), 8u);
  EXPECT_EQ(layout[0].first, "fc1.weight");
  EXPECT_EQ(layout[0].second, (std::vector<int64_t>{600, 60}));
  EXPECT_EQ(layout[1].first, "fc1.bias");
  EXPECT_EQ(layout[7].first, "fc4.bias");
  EXPECT_EQ(layout[7].second, (std::vector<int64_t>{10}));
}

TEST(MlpShape, OtherCountsAreMatchedExactlyTooPaddingOnlyWhenNeeded) {
  for (uint64_t p : {1000ull, 12345ull, 100000ull, 999999ull, 2000003ull}) {
    auto s = SolveMlpShape(p);
    ASSERT_TRUE(s.ok()) << p;
    EXPECT_EQ(s->ParameterCount(), p);
    EXPECT_EQ(CountFromLayout(*s), p);
  }
  // The smallest MLP (one hidden unit) has 60 + 1 + 10 + 10 = 81 parameters.
  EXPECT_EQ(SolveMlpShape(80).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SolveMlpShape(81)->ParameterCount(), 81u);
  auto tiny = SolveMlpShape(200);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->ParameterCount(), 200u);
}

TEST(Synthetic, ShardsAreDeterministicPerSeedAndDifferAcrossClients) {
  SyntheticOptions o;
  auto a = *GenerateSyntheticShard(o, 3);
  auto b = *GenerateSyntheticShard(o, 3);
  auto c = *GenerateSyntheticShard(o, 4);
  EXPECT_EQ(a.train_x, b.train_x);
  EXPECT_EQ(a.test_y, b.test_y);
  EXPECT_NE(a.train_x, c.train_x);
  EXPECT_EQ(a.train_size() + a.test_size(), SyntheticSampleCount(o, 3));
  EXPECT_EQ(a.train_x.size(), a.train_size() * 60);
  EXPECT_GE(a.train_size() + a.test_size(), o.min_samples);
  for (int32_t y : a.train_y) ASSERT_TRUE(y >= 0 && y < 10);
  o.seed = 2;
  EXPECT_NE(GenerateSyntheticShard(o, 3)->train_x, a.train_x);
}

TEST(Synthetic, SampleCountsAreUnbalancedAndBounded) {
  SyntheticOptions o;
  o.max_samples = 5000;
  uint64_t lo = UINT64_MAX, hi = 0;
  for (uint32_t k = 0; k < 40; ++k) {
    uint64_t n = SyntheticSampleCount(o, k);
    lo = std::min(lo, n);
    hi = std::max(hi, n);
    EXPECT_LE(n, 5000u);
    EXPECT_GE(n, o.min_samples);
  }
  EXPECT_GT(hi, 3 * lo);  // a lognormal law, not equal shards
}

TEST(Synthetic, FeaturesFollowTheDecayingCovariance) {
  // Var(x_j) within a client is Sigma_jj = j^-1.2: the first feature
  // spreads far more than the last.
  SyntheticOptions o;
  o.min_samples = 3000;
  auto s = *GenerateSyntheticShard(o, 0);
  auto var = [&](int j) {
    double m = 0, m2 = 0;
    const uint64_t n = s.train_size();
    for (uint64_t i = 0; i < n; ++i) m += s.train_x[i * 60 + j];
    m /= n;
    for (uint64_t i = 0; i < n; ++i)
      m2 += (s.train_x[i * 60 + j] - m) * (s.train_x[i * 60 + j] - m);
    return m2 / n;
  };
  EXPECT_NEAR(var(0), 1.0, 0.1);
  EXPECT_NEAR(var(59), std::pow(60.0, -1.2), 0.01);
}

MlpOptions SmallOptions() {
  MlpOptions o;
  o.shape = *SolveMlpShape(20000);
  return o;
}

TEST(MlpTrainer, ParametersHandedOutAreNeverWrittenLater) {
  SyntheticOptions so;
  auto t = *MakeMlpTrainer(SmallOptions(), *GenerateSyntheticShard(so, 0));
  TensorMap before = *t->GetParameters();
  std::map<std::string, std::string> snapshot;
  for (auto& [n, x] : before) snapshot[n] = std::string(x.data.view());
  ASSERT_TRUE(t->Train({0, 5}).ok());
  TensorMap after = *t->GetParameters();
  bool changed = false;
  for (auto& [n, x] : before) {
    EXPECT_EQ(std::string(x.data.view()), snapshot[n]) << n;  // copy-on-write kept them
    changed |= std::string(after.at(n).data.view()) != snapshot[n];
  }
  EXPECT_TRUE(changed);
}

TEST(MlpTrainer, SetParametersReadsButNeverWritesTheSharedModel) {
  SyntheticOptions so;
  auto opts = SmallOptions();
  auto t = *MakeMlpTrainer(opts, *GenerateSyntheticShard(so, 1));
  TensorMap global = *MlpInitialParameters(opts.shape, 99);
  std::map<std::string, std::string> snapshot;
  for (auto& [n, x] : global) snapshot[n] = std::string(x.data.view());
  ASSERT_TRUE(t->SetParameters(global).ok());
  ASSERT_TRUE(t->Train({1, 0}).ok());
  for (auto& [n, x] : global) EXPECT_EQ(std::string(x.data.view()), snapshot[n]) << n;
  // Wrong layout is refused.
  TensorMap wrong = global;
  wrong.erase("fc1.bias");
  EXPECT_EQ(t->SetParameters(wrong).code(), StatusCode::kInvalidArgument);
}

TEST(MlpTrainer, LocalTrainingLowersTheLocalLoss) {
  SyntheticOptions so;
  auto t = *MakeMlpTrainer(SmallOptions(), *GenerateSyntheticShard(so, 2));
  auto before = *t->Evaluate();
  EXPECT_GT(before.samples, 0u);
  auto r = t->Train({0, 60});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples, GenerateSyntheticShard(so, 2)->train_size());
  EXPECT_EQ(r->metrics.at("steps"), 60);
  auto after = *t->Evaluate();
  EXPECT_LT(after.loss, before.loss);
  EXPECT_GE(after.accuracy, before.accuracy);
  EXPECT_EQ(t->Train({0, 0}).status().code(), StatusCode::kInvalidArgument);
}

TEST(MlpTrainer, RejectsAShardOfTheWrongShape) {
  SyntheticOptions so;
  so.dimension = 30;
  EXPECT_EQ(MakeMlpTrainer(SmallOptions(), *GenerateSyntheticShard(so, 0)).status().code(),
            StatusCode::kInvalidArgument);
}

// Sets XSILO_MLP_ISA for a scope and puts back what was there, also when
// an assertion ends the test early.
class ScopedIsa {
 public:
  ScopedIsa() {
    const char* old = std::getenv("XSILO_MLP_ISA");
    had_ = old != nullptr;
    if (had_) old_ = old;
  }
  ~ScopedIsa() {
    if (had_) {
      ::setenv("XSILO_MLP_ISA", old_.c_str(), 1);
    } else {
      ::unsetenv("XSILO_MLP_ISA");
    }
  }
  void Set(std::string_view v) { ::setenv("XSILO_MLP_ISA", std::string(v).c_str(), 1); }
  void Unset() { ::unsetenv("XSILO_MLP_ISA"); }

 private:
  bool had_ = false;
  std::string old_;
};

// Every build of the products this CPU can run computes what a plain loop
// does, on shapes no vector width divides (and a one-sample batch).
TEST(MlpGemm, EveryInstructionSetComputesThePlainProducts) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
  };
  struct Shape {
    int64_t out, in, n;
  };
  int checked = 0;
  for (Shape s : {Shape{37, 53, 5}, Shape{70, 129, 33}, Shape{10, 300, 1}}) {
    const auto w = random(s.out * s.in);  // row-major out x in
    const auto a = random(s.in * s.n);    // column-major in x n
    const auto d = random(s.out * s.n);   // column-major out x n
    std::vector<double> z(s.out * s.n, 0), g(s.out * s.in, 0), y(s.in * s.n, 0);
    for (int64_t o = 0; o < s.out; ++o) {
      for (int64_t i = 0; i < s.in; ++i) {
        for (int64_t b = 0; b < s.n; ++b) {
          z[o + b * s.out] += double(w[o * s.in + i]) * a[i + b * s.in];
          g[o * s.in + i] += double(d[o + b * s.out]) * a[i + b * s.in];
          y[i + b * s.in] += double(w[o * s.in + i]) * d[o + b * s.out];
        }
      }
    }
    auto near = [](const std::vector<float>& got, const std::vector<double>& want) {
      for (size_t i = 0; i < want.size(); ++i) {
        if (std::fabs(got[i] - want[i]) > 1e-4 * (1 + std::fabs(want[i]))) return false;
      }
      return true;
    };
    for (auto isa : {gemm::Isa::kGeneric, gemm::Isa::kAvx2, gemm::Isa::kAvx512}) {
      if (!gemm::IsaSupported(isa)) continue;
      SCOPED_TRACE(std::string(gemm::IsaName(isa)) + " " + std::to_string(s.out) + "x" +
                   std::to_string(s.in) + "x" + std::to_string(s.n));
      const gemm::Kernels& k = gemm::KernelsFor(isa);
      std::vector<float> zf(z.size(), NAN), gf(g.size(), NAN), yf(y.size(), NAN);
      k.w_times_a(w.data(), s.out, s.in, a.data(), s.n, zf.data());
      k.d_times_at(d.data(), s.out, a.data(), s.in, s.n, gf.data());
      k.wt_times_d(w.data(), s.out, s.in, d.data(), s.n, yf.data());
      EXPECT_TRUE(near(zf, z));
      EXPECT_TRUE(near(gf, g));
      EXPECT_TRUE(near(yf, y));
      ++checked;
    }
  }
  EXPECT_GE(checked, 3);
}

TEST(MlpGemm, XsiloMlpIsaPicksOrRefusesAnInstructionSet) {
  ScopedIsa env;
  env.Set("generic");
  auto isa = gemm::ChooseIsa();
  ASSERT_TRUE(isa.ok()) << isa.status().ToString();
  EXPECT_EQ(*isa, gemm::Isa::kGeneric);
  EXPECT_EQ(MlpInstructionSet().value_or(""), "generic");
  env.Set("sse9");
  EXPECT_EQ(gemm::ChooseIsa().status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MlpInstructionSet().status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeMlpTrainer(SmallOptions(), *GenerateSyntheticShard(SyntheticOptions{}, 0))
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  for (auto want : {gemm::Isa::kAvx2, gemm::Isa::kAvx512}) {
    env.Set(gemm::IsaName(want));
    auto got = gemm::ChooseIsa();
    if (gemm::IsaSupported(want)) {
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(*got, want);
    } else {
      EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    }
  }
  env.Unset();
  auto best = gemm::ChooseIsa();
  ASSERT_TRUE(best.ok());
  EXPECT_TRUE(gemm::IsaSupported(*best));
  for (auto isa : {gemm::Isa::kAvx2, gemm::Isa::kAvx512}) {
    if (gemm::IsaSupported(isa)) {
      EXPECT_GE(static_cast<int>(*best), static_cast<int>(isa));
    }
  }
}

// Training under every instruction set ends at the same model, up to
// rounding.
TEST(MlpGemm, TrainingAgreesAcrossInstructionSets) {
  ScopedIsa env;
  SyntheticOptions so;
  std::vector<std::pair<std::string, TensorMap>> models;
  for (auto isa : {gemm::Isa::kGeneric, gemm::Isa::kAvx2, gemm::Isa::kAvx512}) {
    if (!gemm::IsaSupported(isa)) continue;
    env.Set(gemm::IsaName(isa));
    auto t = MakeMlpTrainer(SmallOptions(), *GenerateSyntheticShard(so, 1));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_TRUE((*t)->Train({0, 20}).ok());
    models.emplace_back(gemm::IsaName(isa), *(*t)->GetParameters());
  }
  XSILO_REQUIRE(models.size() >= 2, "a CPU with more than one instruction set (AVX2)");
  for (size_t m = 1; m < models.size(); ++m) {
    SCOPED_TRACE(models[m].first);
    for (const auto& [name, t] : models[0].second) {
      const Tensor& other = models[m].second.at(name);
      ASSERT_EQ(other.nbytes(), t.nbytes());
      const float* x = reinterpret_cast<const float*>(t.data.data());
      const float* y = reinterpret_cast<const float*>(other.data.data());
      for (uint64_t i = 0; i < t.nbytes() / 4; ++i) {
        ASSERT_NEAR(x[i], y[i], 1e-3 * (1 + std::fabs(x[i]))) << name << "[" << i << "]";
      }
    }
  }
}

}  // namespace
}  // namespace xsilo::fl
