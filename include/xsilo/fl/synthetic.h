// Synthetic(alpha, beta): the non-IID federated data set of Li et al.
// (FedProx, MLSys 2020), generated locally from a seed, so every client
// builds its own shard and no data ever moves.
//
// For client k: u_k ~ N(0, alpha), B_k ~ N(0, beta) (alpha, beta are
// standard deviations, as in the authors' generator); the client's labelling
// model W_k (classes x dimension) and b_k have entries ~ N(u_k, 1); its
// feature mean v_k has entries ~ N(B_k, 1); x ~ N(v_k, Sigma) with Sigma
// diagonal, Sigma_jj = j^-1.2 (j = 1..dimension); y = argmax(W_k x + b_k)
// (the argmax of the softmax). Sample counts follow a lognormal law:
// n_k = floor(exp(N(mean, sigma))) + min_samples, capped at max_samples.
#pragma once

#include <cstdint>
#include <vector>

#include "xsilo/core/status.h"

namespace xsilo::fl {

struct SyntheticOptions {
  // Spread of the clients' labelling models. Default 1.0.
  double alpha = 1.0;
  // Spread of the clients' feature means. Default 1.0.
  double beta = 1.0;
  // Seed of the whole federation; client k's shard depends only on
  // (seed, k). Default 1.
  uint64_t seed = 1;
  // Feature dimension. Default 60.
  uint32_t dimension = 60;
  // Number of classes. Default 10.
  uint32_t classes = 10;
  // Lognormal parameters of the sample count. Defaults 5.5 and 1.0: shards
  // of a few hundred to a few thousand samples, so that per-round test
  // metrics are not dominated by a handful of held-out samples. FedProx
  // used 4.0 and 2.0 with min_samples 50 (most shards under 150 samples).
  double lognormal_mean = 5.5;
  double lognormal_sigma = 1.0;
  // Added to every client's count. Default 200.
  uint64_t min_samples = 200;
  // Upper bound on a client's count, to bound memory and epoch time.
  // Default 20000.
  uint64_t max_samples = 20000;
  // Share of a client's samples held out for evaluation. Default 0.2.
  double test_fraction = 0.2;
  // Upper bound on held-out samples per client (evaluation runs every
  // round). Default 500.
  uint64_t max_test_samples = 500;
};

// One client's shard. Features are sample-major: sample i occupies
// x[i * dimension, (i + 1) * dimension).
struct SyntheticShard {
  uint32_t dimension = 0;
  uint32_t classes = 0;
  std::vector<float> train_x, test_x;
  std::vector<int32_t> train_y, test_y;

  uint64_t train_size() const { return train_y.size(); }
  uint64_t test_size() const { return test_y.size(); }
};

// The total sample count (train + test) of client `client` (0-based).
uint64_t SyntheticSampleCount(const SyntheticOptions& options, uint32_t client);
// Generates client `client`'s shard. InvalidArgument on nonsensical options.
Result<SyntheticShard> GenerateSyntheticShard(const SyntheticOptions& options, uint32_t client);

}  // namespace xsilo::fl
