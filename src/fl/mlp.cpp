#include "xsilo/fl/mlp.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "fl/mlp_gemm.h"
#include "xsilo/core/tiers.h"
#include "xsilo/fl/aggregator.h"

namespace xsilo::fl {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMap = Eigen::Map<RowMat, Eigen::Unaligned>;
using VecMap = Eigen::Map<Eigen::VectorXf, Eigen::Unaligned>;
using ConstColMap = Eigen::Map<const Eigen::MatrixXf, Eigen::Unaligned>;

// Parameters of one dense layer of `in` inputs and `out` outputs.
uint64_t DenseCount(uint64_t in, uint64_t out) { return in * out + out; }

float* F32(const Tensor& t) { return reinterpret_cast<float*>(t.data.mutable_data()); }

}  // namespace

uint64_t MlpShape::ParameterCount() const {
  uint64_t total = pad;
  uint64_t prev = input;
  for (uint32_t h : hidden) {
    total += DenseCount(prev, h);
    prev = h;
  }
  return total + DenseCount(prev, classes);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> MlpShape::Layout() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  int64_t prev = input;
  std::vector<int64_t> widths(hidden.begin(), hidden.end());
  widths.push_back(classes);
  for (size_t l = 0; l < widths.size(); ++l) {
    std::string base = "fc" + std::to_string(l + 1);
    out.push_back({base + ".weight", {widths[l], prev}});
    out.push_back({base + ".bias", {widths[l]}});
    prev = widths[l];
  }
  if (pad > 0) out.push_back({"pad", {static_cast<int64_t>(pad)}});
  return out;
}

std::string MlpShape::ToString() const {
  std::string s = std::to_string(input);
  for (uint32_t h : hidden) s += "-" + std::to_string(h);
  s += "-" + std::to_string(classes);
  if (pad > 0) s += " + pad " + std::to_string(pad);
  return s;
}

Result<MlpShape> SolveMlpShape(uint64_t parameters, uint32_t input, uint32_t classes) {
  if (input == 0 || classes == 0) return InvalidArgument("input and classes must be > 0");
  const uint64_t p = parameters;
  const uint64_t in1 = uint64_t{input} + 1, c = classes;
  // Three hidden layers h1, h2, h3 (h3 ~ h1/2):
  //   p = in1*h1 + h2*(h1 + h3 + 1) + (c + 1)*h3 + c
  // so for each (h1, h3) near the balanced width, h2 follows if integral.
  const uint64_t w = static_cast<uint64_t>(std::sqrt(static_cast<double>(p) / 1.5));
  const uint64_t max_step = std::min<uint64_t>(w, 1 << 14);
  for (uint64_t step = 0; step < max_step; ++step) {
    for (int sign : {1, -1}) {
      if (step == 0 && sign < 0) continue;
      const int64_t h1 = static_cast<int64_t>(w) + sign * static_cast<int64_t>(step);
      if (h1 < 2 || h1 > UINT32_MAX) continue;
      for (int64_t d3 = 0; d3 <= 16; ++d3) {
        for (int s3 : {1, -1}) {
          if (d3 == 0 && s3 < 0) continue;
          const int64_t h3 = h1 / 2 + s3 * d3;
          if (h3 < 1) continue;
          const uint64_t fixed = in1 * h1 + (c + 1) * h3 + c;
          if (fixed >= p) continue;
          const uint64_t den = h1 + h3 + 1;
          if ((p - fixed) % den != 0) continue;
          const uint64_t h2 = (p - fixed) / den;
          if (h2 < 1 || h2 > UINT32_MAX) continue;
          MlpShape s;
          s.input = input;
          s.classes = classes;
          s.hidden = {static_cast<uint32_t>(h1), static_cast<uint32_t>(h2),
                      static_cast<uint32_t>(h3)};
          return s;
        }
      }
    }
  }
  // Fallback: one hidden layer as wide as fits, the rest as pad.
  const uint64_t per_unit = in1 + c;
  if (p < per_unit + c) {
    return InvalidArgument("no MLP of input " + std::to_string(input) + " and " +
                           std::to_string(classes) + " classes has only " + std::to_string(p) +
                           " parameters");
  }
  MlpShape s;
  s.input = input;
  s.classes = classes;
  const uint64_t h = (p - c) / per_unit;
  s.hidden = {static_cast<uint32_t>(h)};
  s.pad = p - s.ParameterCount();
  return s;
}

Result<MlpShape> MlpShapeForTier(std::string_view tier) {
  auto t = FindTier(tier);
  if (!t) return NotFound("unknown tier '" + std::string(tier) + "' (small, medium, big, large)");
  return SolveMlpShape(t->parameters);
}

Result<TensorMap> MlpInitialParameters(const MlpShape& shape, uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 0x5eed);
  TensorMap params;
  const size_t layers = shape.hidden.size() + 1;
  size_t layer = 0;
  for (const auto& [name, dims] : shape.Layout()) {
    XSILO_ASSIGN_OR_RETURN(Tensor t, Tensor::Zeros(DType::kF32, dims));
    if (dims.size() == 2) {
      const double fan_in = static_cast<double>(dims[1]);
      // He-uniform keeps ReLU activations at scale; the output layer starts
      // small, as PyTorch's default does.
      const double bound = (layer + 1 < layers) ? std::sqrt(6.0 / fan_in) : 1.0 / std::sqrt(fan_in);
      std::uniform_real_distribution<float> dist(static_cast<float>(-bound),
                                                 static_cast<float>(bound));
      float* p = F32(t);
      const uint64_t n = t.nbytes() / sizeof(float);
      for (uint64_t i = 0; i < n; ++i) p[i] = dist(rng);
      ++layer;
    }
    params.emplace(name, std::move(t));
  }
  return params;
}

namespace {

class MlpTrainer final : public Trainer {
 public:
  MlpTrainer(MlpOptions options, SyntheticShard shard, TensorMap params,
             const gemm::Kernels& kernels)
      : o_(std::move(options)),
        shard_(std::move(shard)),
        params_(std::move(params)),
        kernels_(&kernels),
        rng_(o_.seed * 0xd1342543de82ef95ull + 17) {
    std::vector<int64_t> widths(o_.shape.hidden.begin(), o_.shape.hidden.end());
    widths.push_back(o_.shape.classes);
    int64_t prev = o_.shape.input;
    for (size_t l = 0; l < widths.size(); ++l) {
      layers_.push_back({"fc" + std::to_string(l + 1) + ".weight",
                         "fc" + std::to_string(l + 1) + ".bias", prev, widths[l]});
      grad_w_.emplace_back(widths[l], prev);
      grad_b_.emplace_back(widths[l]);
      prev = widths[l];
    }
    order_.resize(shard_.train_size());
    std::iota(order_.begin(), order_.end(), 0u);
    cursor_ = order_.size();  // shuffle on first use
  }

  Result<TensorMap> GetParameters() override { return params_; }

  Status SetParameters(const TensorMap& incoming) override {
    XSILO_RETURN_IF_ERROR(CheckSameLayout(params_, incoming));
    for (auto& [name, t] : params_) {
      const Tensor& src = incoming.find(name)->second;
      if (src.dtype != DType::kF32) return InvalidArgument("tensor '" + name + "' is not F32");
      if (t.data.SharesStorageWith(src.data)) continue;  // already ours
      XSILO_RETURN_IF_ERROR(MakeWritable(t, /*keep=*/false));
      std::memcpy(t.data.mutable_data(), src.data.data(), t.nbytes());
    }
    return Status::OK();
  }

  Result<TrainResult> Train(const LocalWork& work) override {
    const uint64_t n = shard_.train_size();
    if (n == 0) return FailedPrecondition("no training samples");
    const uint64_t batch = std::max<uint64_t>(1, std::min(o_.batch_size, n));
    uint64_t steps = work.steps;
    if (steps == 0) steps = work.epochs * ((n + batch - 1) / batch);
    if (steps == 0) return InvalidArgument("local work needs steps or epochs > 0");
    for (auto& [name, t] : params_) XSILO_RETURN_IF_ERROR(MakeWritable(t, /*keep=*/true));

    double loss_sum = 0;
    uint64_t correct = 0, seen = 0;
    Eigen::MatrixXf x(o_.shape.input, batch);
    std::vector<int32_t> y(batch);
    for (uint64_t s = 0; s < steps; ++s) {
      for (uint64_t i = 0; i < batch; ++i) {
        if (cursor_ == order_.size()) {
          std::shuffle(order_.begin(), order_.end(), rng_);
          cursor_ = 0;
        }
        const uint32_t k = order_[cursor_++];
        std::memcpy(x.col(i).data(), &shard_.train_x[uint64_t{k} * shard_.dimension],
                    sizeof(float) * shard_.dimension);
        y[i] = shard_.train_y[k];
      }
      Forward(x);
      auto [loss, hits] = SoftmaxLoss(y, /*grad=*/true);
      loss_sum += loss;
      correct += hits;
      seen += batch;
      BackwardAndStep();
    }
    TrainResult r;
    r.samples = n;
    r.metrics["loss"] = loss_sum / static_cast<double>(seen);
    r.metrics["accuracy"] = static_cast<double>(correct) / static_cast<double>(seen);
    r.metrics["steps"] = static_cast<double>(steps);
    return r;
  }

  Result<EvalResult> Evaluate() override {
    EvalResult r;
    const uint64_t n = shard_.test_size();
    if (n == 0) return r;
    double loss_sum = 0;
    uint64_t correct = 0;
    const uint64_t eb = std::max<uint64_t>(1, o_.eval_batch_size);
    for (uint64_t b = 0; b < n; b += eb) {
      const uint64_t m = std::min(eb, n - b);
      ConstColMap x(&shard_.test_x[b * shard_.dimension], shard_.dimension,
                    static_cast<Eigen::Index>(m));
      Forward(x);
      std::vector<int32_t> y(shard_.test_y.begin() + b, shard_.test_y.begin() + b + m);
      auto [loss, hits] = SoftmaxLoss(y, /*grad=*/false);
      loss_sum += loss;
      correct += hits;
    }
    r.samples = n;
    r.loss = loss_sum / static_cast<double>(n);
    r.accuracy = static_cast<double>(correct) / static_cast<double>(n);
    return r;
  }

 private:
  struct Layer {
    std::string weight, bias;
    int64_t in, out;
  };

  RowMap W(const Layer& l) { return RowMap(F32(params_.find(l.weight)->second), l.out, l.in); }
  VecMap B(const Layer& l) { return VecMap(F32(params_.find(l.bias)->second), l.out); }

  // Gives `t` storage nobody else holds before it is written (copy-on-write:
  // tensors handed out by GetParameters may still be in flight).
  static Status MakeWritable(Tensor& t, bool keep) {
    if (t.data.use_count() <= 1) return Status::OK();
    XSILO_ASSIGN_OR_RETURN(Buffer fresh, Buffer::Allocate(t.nbytes()));
    if (keep) std::memcpy(fresh.mutable_data(), t.data.data(), t.nbytes());
    t.data = std::move(fresh);
    return Status::OK();
  }

  // acts_[0] = x; acts_[l + 1] = relu(W_l acts_[l] + b_l), no relu on the logits.
  template <typename X>
  void Forward(const X& x) {
    acts_.resize(layers_.size() + 1);
    acts_[0] = x;
    for (size_t l = 0; l < layers_.size(); ++l) {
      Eigen::MatrixXf& z = acts_[l + 1];
      const Layer& L = layers_[l];
      z.resize(L.out, acts_[l].cols());
      kernels_->w_times_a(W(L).data(), L.out, L.in, acts_[l].data(), acts_[l].cols(), z.data());
      z.colwise() += B(layers_[l]);
      if (l + 1 < layers_.size()) z = z.cwiseMax(0.0f);
    }
  }

  // Summed cross-entropy and hits over the batch in acts_.back(); with
  // `grad`, leaves dLoss/dlogits (mean over the batch) in dz_.
  std::pair<double, uint64_t> SoftmaxLoss(const std::vector<int32_t>& y, bool grad) {
    const Eigen::MatrixXf& z = acts_.back();
    const Eigen::Index m = z.cols();
    if (grad) dz_.resize(z.rows(), m);
    double loss = 0;
    uint64_t hits = 0;
    for (Eigen::Index i = 0; i < m; ++i) {
      Eigen::Index arg;
      const float mx = z.col(i).maxCoeff(&arg);
      const Eigen::VectorXf e = (z.col(i).array() - mx).exp().matrix();
      const double sum = e.sum();
      loss += std::log(sum) + mx - z(y[i], i);
      hits += (arg == y[i]);
      if (grad) {
        dz_.col(i) = e / static_cast<float>(sum);
        dz_(y[i], i) -= 1.0f;
      }
    }
    if (grad) dz_ /= static_cast<float>(m);
    return {loss, hits};
  }

  void BackwardAndStep() {
    double sq = 0;
    for (size_t l = layers_.size(); l-- > 0;) {
      const Layer& L = layers_[l];
      const Eigen::Index n = dz_.cols();
      kernels_->d_times_at(dz_.data(), L.out, acts_[l].data(), L.in, n, grad_w_[l].data());
      grad_b_[l] = dz_.rowwise().sum();
      sq += grad_w_[l].squaredNorm() + grad_b_[l].squaredNorm();
      if (l > 0) {
        Eigen::MatrixXf da(L.in, n);
        kernels_->wt_times_d(W(L).data(), L.out, L.in, dz_.data(), n, da.data());
        dz_ = da.cwiseProduct((acts_[l].array() > 0.0f).cast<float>().matrix());
      }
    }
    float step = static_cast<float>(o_.learning_rate);
    const double norm = std::sqrt(sq);
    if (o_.clip_norm > 0 && norm > o_.clip_norm) step *= static_cast<float>(o_.clip_norm / norm);
    for (size_t l = 0; l < layers_.size(); ++l) {
      W(layers_[l]) -= step * grad_w_[l];
      B(layers_[l]) -= step * grad_b_[l];
    }
  }

  MlpOptions o_;
  SyntheticShard shard_;
  TensorMap params_;
  const gemm::Kernels* kernels_;  // the products, built for this CPU
  std::vector<Layer> layers_;
  std::vector<RowMat> grad_w_;
  std::vector<Eigen::VectorXf> grad_b_;
  std::vector<Eigen::MatrixXf> acts_;
  Eigen::MatrixXf dz_;
  std::mt19937_64 rng_;
  std::vector<uint32_t> order_;
  size_t cursor_ = 0;
};

}  // namespace

Result<std::string> MlpInstructionSet() {
  XSILO_ASSIGN_OR_RETURN(gemm::Isa isa, gemm::ChooseIsa());
  return std::string(gemm::IsaName(isa));
}

Result<std::unique_ptr<Trainer>> MakeMlpTrainer(const MlpOptions& options, SyntheticShard shard) {
  if (shard.dimension != options.shape.input || shard.classes != options.shape.classes) {
    return InvalidArgument("shard has dimension " + std::to_string(shard.dimension) + " and " +
                           std::to_string(shard.classes) + " classes; the MLP expects " +
                           std::to_string(options.shape.input) + " and " +
                           std::to_string(options.shape.classes));
  }
  if (options.batch_size == 0) return InvalidArgument("batch_size must be > 0");
  if (!(options.learning_rate > 0)) return InvalidArgument("learning_rate must be > 0");
  XSILO_ASSIGN_OR_RETURN(gemm::Isa isa, gemm::ChooseIsa());
  XSILO_ASSIGN_OR_RETURN(TensorMap params, MlpInitialParameters(options.shape, options.seed));
  return std::unique_ptr<Trainer>(std::make_unique<MlpTrainer>(
      options, std::move(shard), std::move(params), gemm::KernelsFor(isa)));
}

}  // namespace xsilo::fl
