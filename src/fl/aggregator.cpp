#include "xsilo/fl/aggregator.h"

#include <Eigen/Core>

#include "fl/parallel.h"

namespace xsilo::fl {

namespace {
using Vec = Eigen::Map<Eigen::VectorXf, Eigen::Unaligned>;
using ConstVec = Eigen::Map<const Eigen::VectorXf, Eigen::Unaligned>;

float* F32(const Tensor& t) { return reinterpret_cast<float*>(t.data.mutable_data()); }
}  // namespace

Status CheckSameLayout(const TensorMap& like, const TensorMap& update) {
  if (like.size() != update.size()) {
    return InvalidArgument("update has " + std::to_string(update.size()) + " tensors, model has " +
                           std::to_string(like.size()));
  }
  for (const auto& [name, t] : like) {
    auto it = update.find(name);
    if (it == update.end()) return InvalidArgument("update lacks tensor '" + name + "'");
    const Tensor& u = it->second;
    if (u.dtype != t.dtype || u.shape != t.shape || u.nbytes() != t.nbytes()) {
      return InvalidArgument("tensor '" + name + "' differs in dtype or shape from the model");
    }
  }
  return Status::OK();
}

void FedAvgAggregator::Recycle(TensorMap spent) { spare_ = std::move(spent); }

Status FedAvgAggregator::Reset(const TensorMap& like) {
  acc_.clear();
  total_samples_ = 0;
  updates_ = 0;
  active_ = false;
  TensorMap spare = std::move(spare_);
  spare_.clear();
  for (const auto& [name, t] : like) {
    if (t.dtype != DType::kF32) {
      return InvalidArgument("tensor '" + name + "' is " + std::string(DTypeName(t.dtype)) +
                             "; FedAvg aggregates F32 tensors");
    }
    // No zeroing: the first Add assigns instead of accumulating.
    auto it = spare.find(name);
    if (it != spare.end() && it->second.dtype == DType::kF32 && it->second.shape == t.shape &&
        it->second.nbytes() == t.nbytes() && it->second.data.use_count() == 1) {
      acc_.emplace(name, std::move(it->second));
      continue;
    }
    XSILO_ASSIGN_OR_RETURN(Buffer b, Buffer::Allocate(t.nbytes()));
    XSILO_ASSIGN_OR_RETURN(Tensor fresh, Tensor::Make(DType::kF32, t.shape, std::move(b)));
    acc_.emplace(name, std::move(fresh));
  }
  active_ = true;
  return Status::OK();
}

Status FedAvgAggregator::Add(const TensorMap& update, uint64_t samples) {
  if (!active_) return FailedPrecondition("aggregator not reset");
  if (samples == 0) return InvalidArgument("an update needs a sample count > 0");
  XSILO_RETURN_IF_ERROR(CheckSameLayout(acc_, update));
  const float w = static_cast<float>(samples);
  const bool first = updates_ == 0;
  for (auto& [name, a] : acc_) {
    float* dst = F32(a);
    const float* src = reinterpret_cast<const float*>(update.find(name)->second.data.data());
    ParallelFor(a.nbytes() / sizeof(float), options_.threads, options_.min_parallel_elements,
                [&](uint64_t b, uint64_t e) {
                  const auto n = static_cast<Eigen::Index>(e - b);
                  if (first) {
                    Vec(dst + b, n) = w * ConstVec(src + b, n);
                  } else {
                    Vec(dst + b, n) += w * ConstVec(src + b, n);
                  }
                });
  }
  total_samples_ += samples;
  ++updates_;
  return Status::OK();
}

Result<TensorMap> FedAvgAggregator::Finish() {
  if (!active_) return FailedPrecondition("aggregator not reset");
  if (updates_ == 0) return FailedPrecondition("no update to aggregate");
  // Scale in double precision once, then apply in float.
  const float scale = static_cast<float>(1.0 / static_cast<double>(total_samples_));
  for (auto& [name, a] : acc_) {
    float* p = F32(a);
    ParallelFor(
        a.nbytes() / sizeof(float), options_.threads, options_.min_parallel_elements,
        [&](uint64_t b, uint64_t e) { Vec(p + b, static_cast<Eigen::Index>(e - b)) *= scale; });
  }
  active_ = false;
  TensorMap out = std::move(acc_);
  acc_.clear();
  return out;
}

}  // namespace xsilo::fl
