#include "xsilo/fl/synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace xsilo::fl {

namespace {

// SplitMix64: decorrelates the per-client streams derived from one seed.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::mt19937_64 ClientRng(const SyntheticOptions& o, uint32_t client, uint64_t stream) {
  return std::mt19937_64(Mix(Mix(o.seed) ^ Mix(0x1000 + client) ^ Mix(stream << 32)));
}

}  // namespace

uint64_t SyntheticSampleCount(const SyntheticOptions& o, uint32_t client) {
  auto rng = ClientRng(o, client, 1);
  std::lognormal_distribution<double> law(o.lognormal_mean, o.lognormal_sigma);
  double n = std::floor(law(rng)) + static_cast<double>(o.min_samples);
  n = std::min(n, static_cast<double>(o.max_samples));
  return static_cast<uint64_t>(std::max(n, 2.0));
}

Result<SyntheticShard> GenerateSyntheticShard(const SyntheticOptions& o, uint32_t client) {
  if (o.dimension == 0 || o.classes < 2) {
    return InvalidArgument("synthetic data needs dimension >= 1 and classes >= 2");
  }
  if (!(o.alpha >= 0) || !(o.beta >= 0)) return InvalidArgument("alpha and beta must be >= 0");
  if (!(o.test_fraction >= 0 && o.test_fraction < 1)) {
    return InvalidArgument("test_fraction must lie in [0, 1)");
  }
  const uint32_t d = o.dimension, c = o.classes;
  auto rng = ClientRng(o, client, 2);
  std::normal_distribution<double> unit(0.0, 1.0);

  const double u = o.alpha * unit(rng);
  const double big_b = o.beta * unit(rng);
  std::vector<double> w(static_cast<size_t>(c) * d), b(c), v(d), sd(d);
  for (auto& x : w) x = u + unit(rng);
  for (auto& x : b) x = u + unit(rng);
  for (auto& x : v) x = big_b + unit(rng);
  for (uint32_t j = 0; j < d; ++j) sd[j] = std::sqrt(std::pow(static_cast<double>(j + 1), -1.2));

  const uint64_t n = SyntheticSampleCount(o, client);
  uint64_t n_test = static_cast<uint64_t>(std::floor(o.test_fraction * static_cast<double>(n)));
  n_test = std::min({n_test, o.max_test_samples, n - 1});
  const uint64_t n_train = n - n_test;

  SyntheticShard s;
  s.dimension = d;
  s.classes = c;
  s.train_x.resize(n_train * d);
  s.train_y.resize(n_train);
  s.test_x.resize(n_test * d);
  s.test_y.resize(n_test);
  std::vector<double> x(d);
  for (uint64_t i = 0; i < n; ++i) {
    for (uint32_t j = 0; j < d; ++j) x[j] = v[j] + sd[j] * unit(rng);
    int32_t label = 0;
    double best = -INFINITY;
    for (uint32_t k = 0; k < c; ++k) {
      double z = b[k];
      for (uint32_t j = 0; j < d; ++j) z += w[static_cast<size_t>(k) * d + j] * x[j];
      if (z > best) {
        best = z;
        label = static_cast<int32_t>(k);
      }
    }
    // The first n_train samples train, the rest are held out (the order is
    // already random).
    const bool train = i < n_train;
    float* dst = train ? &s.train_x[i * d] : &s.test_x[(i - n_train) * d];
    for (uint32_t j = 0; j < d; ++j) dst[j] = static_cast<float>(x[j]);
    (train ? s.train_y[i] : s.test_y[i - n_train]) = label;
  }
  return s;
}

}  // namespace xsilo::fl
