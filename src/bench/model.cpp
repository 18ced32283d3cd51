#include "xsilo/bench/model.h"

#include <array>
#include <cmath>

#include "xsilo/core/codec.h"

namespace xsilo::bench {
namespace {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Quantiles of the standard normal distribution at k / kBins for k = 1 ..
// kBins - 1, with the two ends at -4 and 4.
constexpr int kBins = 4096;
const std::array<double, kBins + 1>& NormalQuantiles() {
  static const std::array<double, kBins + 1> q = [] {
    std::array<double, kBins + 1> t{};
    t[0] = -4;
    t[kBins] = 4;
    for (int k = 1; k < kBins; ++k) {
      const double p = static_cast<double>(k) / kBins;
      double lo = -4, hi = 4;  // bisect the normal CDF, 0.5 erfc(-x / sqrt 2)
      for (int it = 0; it < 60; ++it) {
        const double mid = 0.5 * (lo + hi);
        (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
      }
      t[k] = 0.5 * (lo + hi);
    }
    return t;
  }();
  return q;
}

// Normal values, sd 0.05: a uniform bin of the quantile table and a uniform
// point inside it (the inverse CDF, piecewise linear in 4096 bins; every
// value gets 52 random bits). Box-Muller cost ~180 ns a value here, 13 s
// for a Big model; this is a few ns.
void FillGaussian(float* p, uint64_t n, uint64_t seed) {
  constexpr double kSd = 0.05;
  const auto& q = NormalQuantiles();
  uint64_t state = seed * 0x2545f4914f6cdd1dULL + 1;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t r = SplitMix64(&state);
    const auto k = static_cast<size_t>(r >> 52);  // 12 bits: the bin
    const double frac = static_cast<double>(r & ((uint64_t{1} << 52) - 1)) * 0x1p-52;
    p[i] = static_cast<float>(kSd * (q[k] + frac * (q[k + 1] - q[k])));
  }
}

struct Sums {
  double sum = 0;
  double abs_sum = 0;
};

Sums SumsOf(const float* p, uint64_t n) {
  double s[4] = {0, 0, 0, 0}, a[4] = {0, 0, 0, 0};
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int k = 0; k < 4; ++k) {
      s[k] += p[i + k];
      a[k] += std::fabs(p[i + k]);
    }
  }
  for (; i < n; ++i) {
    s[0] += p[i];
    a[0] += std::fabs(p[i]);
  }
  return {s[0] + s[1] + s[2] + s[3], a[0] + a[1] + a[2] + a[3]};
}

}  // namespace

Result<ModelPayload> ParseModelPayload(const std::string& name) {
  if (name == "pattern") return ModelPayload::kPattern;
  if (name == "weights") return ModelPayload::kWeights;
  return InvalidArgument("payload '" + name + "': expected pattern or weights");
}

const char* ModelPayloadName(ModelPayload p) {
  return p == ModelPayload::kWeights ? "weights" : "pattern";
}

Result<Message> MakeModel(uint64_t params, uint64_t seed, ModelPayload payload) {
  XSILO_ASSIGN_OR_RETURN(Buffer b, Buffer::Allocate(params * 4));
  auto* p = reinterpret_cast<float*>(b.mutable_data());
  Message m;
  m.type = "model";
  if (payload == ModelPayload::kWeights) {
    FillGaussian(p, params, seed);
    const Sums s = SumsOf(p, params);
    m.params["sum"] = s.sum;
    m.params["abs_sum"] = s.abs_sum;
  } else {
    for (uint64_t i = 0; i < params; ++i)
      p[i] = static_cast<float>((i * 2654435761u + seed) % 1000) * 1e-3f;
  }
  m.params["xxh3"] = static_cast<int64_t>(Checksum(b.span()));
  XSILO_ASSIGN_OR_RETURN(Tensor t, Tensor::Make(DType::kF32, {static_cast<int64_t>(params)}, b));
  m.tensors.emplace("w", std::move(t));
  return m;
}

void StampModel(Message* m, int64_t stamp) {
  Tensor& t = m->tensors.at("w");
  auto* p = reinterpret_cast<float*>(t.data.mutable_data());
  const float before = p[0];
  // Weights stay in their range: a stamp of thousands would dominate the
  // sums the lossy check compares and the absmax of the first int8 block.
  p[0] = m->params.count("abs_sum") ? static_cast<float>(stamp % 1000) * 1e-4f
                                    : static_cast<float>(stamp) + 0.5f;
  if (auto sum = m->params.find("sum"); sum != m->params.end()) {
    std::get<double>(sum->second) += static_cast<double>(p[0]) - before;
    std::get<double>(m->params.at("abs_sum")) +=
        std::fabs(static_cast<double>(p[0])) - std::fabs(static_cast<double>(before));
  }
  m->params["xxh3"] = static_cast<int64_t>(Checksum(t.data.span()));
  m->params["stamp"] = stamp;
}

bool ModelIntact(const Message& m, double lossy_tolerance) {
  auto it = m.tensors.find("w");
  auto sum = m.GetInt("xxh3");
  if (it == m.tensors.end() || !sum.ok()) return false;
  if (static_cast<int64_t>(Checksum(it->second.data.span())) == *sum) return true;
  auto want_sum = m.GetDouble("sum");
  auto want_abs = m.GetDouble("abs_sum");
  if (lossy_tolerance <= 0 || !want_sum.ok() || !want_abs.ok() || it->second.dtype != DType::kF32) {
    return false;
  }
  const Sums got =
      SumsOf(reinterpret_cast<const float*>(it->second.data.data()), it->second.data.size() / 4);
  const double slack = lossy_tolerance * *want_abs;
  return std::fabs(got.sum - *want_sum) <= slack && std::fabs(got.abs_sum - *want_abs) <= slack;
}

double LossyTolerance(const std::string& compression) {
  if (compression == "bf16") return 1.0 / 256;
  if (compression == "fp16") return 1.0 / 2048;
  if (compression == "int8") return 0.03;
  return 0;
}

}  // namespace xsilo::bench
