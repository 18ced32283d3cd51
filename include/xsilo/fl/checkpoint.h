// Server checkpoints: the global model and the next round, so that a
// restarted FedAvg server resumes where the last one stopped.
//
// A checkpoint directory holds
//   model-<next_round>.safetensors  the global model (the wire format's
//                                   safetensors layout: readable by PyTorch)
//   checkpoint.json                 {"format": "xsilo.fl.checkpoint",
//                                    "version": 1, "next_round": N,
//                                    "model": "model-N.safetensors",
//                                    "bytes": size, "xxh3": "16 hex digits"}
// Each file is written to a temporary name, flushed and renamed into place;
// checkpoint.json is renamed last, so it always names a complete model
// whose size and checksum it records. Older model files are removed after
// the rename. See docs/fl.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "xsilo/core/message.h"
#include "xsilo/core/status.h"

namespace xsilo::fl {

struct Checkpoint {
  uint64_t next_round = 0;  // rounds finished (the first round to run on resume)
  TensorMap model;          // owned copies, not views of the file
};

// Creates `dir` if needed. Internal / NotFound on I/O errors.
Status WriteCheckpoint(const std::string& dir, uint64_t next_round, const TensorMap& model);

// nullopt when `dir` holds no checkpoint.json. Corrupt when the model file
// does not match the size or checksum the JSON records, or either fails to
// parse.
Result<std::optional<Checkpoint>> ReadCheckpoint(const std::string& dir);

}  // namespace xsilo::fl
