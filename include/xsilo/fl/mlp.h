// The built-in trainer: a multilayer perceptron (ReLU hidden layers,
// softmax cross-entropy) in Eigen, trained with mini-batch SGD on a
// Synthetic(alpha, beta) shard.
//
// Its widths are solved so that the parameter count (weights + biases)
// equals a model tier's exactly: input -> h1 -> h2 -> h3 -> classes. See
// SolveMlpShape and docs/fl.md for the widths of each tier.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "xsilo/fl/synthetic.h"
#include "xsilo/fl/trainer.h"

namespace xsilo::fl {

struct MlpShape {
  uint32_t input = 60;
  std::vector<uint32_t> hidden;  // widths of the hidden layers
  uint32_t classes = 10;
  // Elements of an extra, untrained "pad" tensor, used only when no widths
  // hit a requested count exactly (never for the four tiers). Default 0.
  uint64_t pad = 0;

  // Weights + biases (+ pad). No allocation.
  uint64_t ParameterCount() const;
  // The tensors' names and shapes, in layer order: fc1.weight [h1, input],
  // fc1.bias [h1], ..., fcN.weight [classes, h_{N-1}], fcN.bias [classes],
  // and "pad" [pad] when pad > 0. Weights are [out, in] as in PyTorch.
  std::vector<std::pair<std::string, std::vector<int64_t>>> Layout() const;
  std::string ToString() const;  // "60-600-612-300-10"
};

// Widths for exactly `parameters` parameters: three hidden layers shaped
// roughly h, h, h/2, searched outward from the balanced width until the
// middle width comes out integral. Falls back to one hidden layer plus a pad
// tensor when no such widths exist (tiny counts). InvalidArgument if even
// that cannot fit.
Result<MlpShape> SolveMlpShape(uint64_t parameters, uint32_t input = 60, uint32_t classes = 10);
// SolveMlpShape for a tier of xsilo/core/tiers.h; NotFound for an unknown tier.
Result<MlpShape> MlpShapeForTier(std::string_view tier);

// Seeded initial parameters: He-uniform hidden weights, PyTorch-style
// uniform output weights, zero biases and pad. Every party that calls this
// with the same shape and seed gets the same model.
Result<TensorMap> MlpInitialParameters(const MlpShape& shape, uint64_t seed);

struct MlpOptions {
  MlpShape shape;
  // Samples per SGD step. Default 32.
  uint64_t batch_size = 32;
  // SGD step size. Default 0.05.
  double learning_rate = 0.05;
  // Gradient-norm clip per step (0 = off). Default 5.0.
  double clip_norm = 5.0;
  // Seeds the parameter initialisation and the batch order. Default 1.
  uint64_t seed = 1;
  // Samples per forward pass in Evaluate. Default 256.
  uint64_t eval_batch_size = 256;
};

// An MLP trainer over `shard` (which must match shape.input / classes).
// Starts from MlpInitialParameters(shape, seed). Its matrix products run
// built for MlpInstructionSet(); InvalidArgument for a bad XSILO_MLP_ISA.
Result<std::unique_ptr<Trainer>> MakeMlpTrainer(const MlpOptions& options, SyntheticShard shard);

// The instruction set the MLP's products run with here: "avx512", "avx2"
// or "generic", the widest this build and CPU support or the one
// XSILO_MLP_ISA names (docs/fl.md, "Instruction sets"); InvalidArgument
// when XSILO_MLP_ISA names an unknown or unsupported one.
Result<std::string> MlpInstructionSet();

}  // namespace xsilo::fl
