// FedAvg aggregation: the sample-weighted mean of float32 TensorMaps.
//
// Updates are folded in as they arrive (acc += n_k * w_k), so the server
// holds one accumulator, never every update at once. The work is split over
// threads by element range; each inner loop is an Eigen (SIMD) expression.
#pragma once

#include <cstdint>

#include "xsilo/core/message.h"
#include "xsilo/core/status.h"

namespace xsilo::fl {

struct AggregatorOptions {
  // Worker threads for the element-wise work; 0 = the CPUs this process may use (UsableCpus).
  // Default 0.
  uint32_t threads = 0;
  // Tensors below this many elements are handled on the calling thread.
  // Default 1 << 16.
  uint64_t min_parallel_elements = 1 << 16;
};

class FedAvgAggregator {
 public:
  explicit FedAvgAggregator(AggregatorOptions options = {}) : options_(options) {}

  // Starts a round: accumulators shaped like `like` (float32 only).
  Status Reset(const TensorMap& like);
  // Offers the storage of a model nobody needs any more (typically the
  // previous global model) for the next Reset's accumulators. A tensor is
  // reused only if its layout matches and no one else holds its Buffer, so
  // a model still in flight to a slow client is never overwritten.
  // Reusing storage saves allocating and faulting in a model's worth of
  // pages every round.
  void Recycle(TensorMap spent);
  // Folds in one update with weight `samples` (> 0). The update must have
  // exactly the tensors, dtypes and shapes of `like`; InvalidArgument
  // otherwise, and the accumulator is left untouched.
  Status Add(const TensorMap& update, uint64_t samples);
  // The weighted mean of everything added since Reset; FailedPrecondition
  // when nothing was added. The accumulator buffers become the result (no
  // copy); call Reset before adding again.
  Result<TensorMap> Finish();

  uint64_t total_samples() const { return total_samples_; }
  uint32_t updates() const { return updates_; }

 private:
  AggregatorOptions options_;
  TensorMap acc_;
  TensorMap spare_;
  uint64_t total_samples_ = 0;
  uint32_t updates_ = 0;
  bool active_ = false;
};

// Checks that `update` has the names, dtypes and shapes of `like`.
Status CheckSameLayout(const TensorMap& like, const TensorMap& update);

}  // namespace xsilo::fl
