// Trainer: the model a federated client trains, behind a small interface.
//
// The FedAvg runtime never looks inside a model. It moves the model's
// parameters as a TensorMap (float32 tensors, named like a PyTorch
// state_dict), asks the client's Trainer to train locally for the round's
// work, and weights the returned parameters by the returned sample count.
// Users plug in their own model by implementing these four calls; the
// built-in one is the Eigen multilayer perceptron of xsilo/fl/mlp.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "xsilo/core/message.h"
#include "xsilo/core/status.h"

namespace xsilo::fl {

// How much local training a client does per round. Exactly one of the two
// should be non-zero; if both are, steps wins.
struct LocalWork {
  // Passes over the local training set. Default 0.
  uint64_t epochs = 0;
  // Mini-batch steps. Default 0.
  uint64_t steps = 0;
};

struct TrainResult {
  // The weight of this client's update in the average: the number of local
  // training samples (FedAvg's n_k). Must be > 0.
  uint64_t samples = 0;
  // Free-form metrics of the local training, e.g. "loss" (mean training
  // loss over the steps taken) and "steps". Reported by the server.
  std::map<std::string, double> metrics;
};

struct EvalResult {
  double loss = 0;
  double accuracy = 0;   // in [0, 1]
  uint64_t samples = 0;  // evaluated samples; weights the federated mean
};

// Thread-compatible: the runtime calls one Trainer from one thread at a time.
class Trainer {
 public:
  virtual ~Trainer() = default;

  // The current parameters. The returned tensors may share storage with the
  // trainer (no copy); a trainer that does so must not write into storage it
  // handed out (copy-on-write), because the runtime sends these Buffers
  // while the trainer may already be running again.
  virtual Result<TensorMap> GetParameters() = 0;
  // Replaces the parameters. `parameters` may be shared with other parties
  // (a broadcast delivers one Buffer to every client in the process): read
  // them, never write into them. InvalidArgument on a name/shape mismatch.
  virtual Status SetParameters(const TensorMap& parameters) = 0;
  // Trains locally for `work`, starting from the current parameters.
  virtual Result<TrainResult> Train(const LocalWork& work) = 0;
  // Evaluates the current parameters on the local held-out data.
  virtual Result<EvalResult> Evaluate() = 0;
};

}  // namespace xsilo::fl
