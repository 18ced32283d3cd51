// The benchmarks' model message: one float32 tensor "w" with a given
// parameter count, and its XXH3-64 in param "xxh3" so that a receiver
// verifies what it holds.
#pragma once

#include <cstdint>
#include <string>

#include "xsilo/core/message.h"
#include "xsilo/core/status.h"

namespace xsilo::bench {

// What the model's values are.
//   pattern: a ramp of 1000 values repeated (the committed figures'
//       payload); zstd shrinks it far more than any real model.
//   weights: normal values (mean 0, sd 0.05, within 4 sd; from a seeded
//       generator), as a freshly initialised or lightly trained layer:
//       zstd after a byte shuffle keeps about 0.84 of them, as it does of
//       the FedAvg MLP's trained weights (docs/compression.md). The model
//       also records param "sum" and "abs_sum" (doubles) so that a
//       receiver can check a lossily compressed copy (ModelIntact).
enum class ModelPayload { kPattern, kWeights };

// "pattern" | "weights"; InvalidArgument otherwise.
Result<ModelPayload> ParseModelPayload(const std::string& name);
const char* ModelPayloadName(ModelPayload p);

// A model of `params` float32 values; `seed` varies the content.
Result<Message> MakeModel(uint64_t params, uint64_t seed,
                          ModelPayload payload = ModelPayload::kPattern);

// Makes the content unique (so hybrid backends cannot reuse an object of an
// earlier send) by writing `stamp` into the first parameter, and records it
// in param "stamp". Only call once every earlier send of the model completed.
void StampModel(Message* m, int64_t stamp);

// True when `m` holds tensor "w" and its checksum matches. With
// `lossy_tolerance` > 0 a model whose checksum does not match still passes
// when it carries "sum" and "abs_sum" and its own sums are within
// lossy_tolerance x abs_sum of them: what a lossy codec whose per-value
// error is at most lossy_tolerance x |x| can leave (LossyTolerance).
bool ModelIntact(const Message& m, double lossy_tolerance = 0);

// The tolerance ModelIntact needs after the codec a backend's
// `compression` option allows: 0 for none, auto and lossless; bf16 2^-8,
// fp16 2^-11 (half an ulp of their significands, xsilo/core/compress.h);
// int8 0.03 (absmax / 254 per value, which is about 1.5% of the mean |x|
// of Gaussian values in blocks of 256).
double LossyTolerance(const std::string& compression);

}  // namespace xsilo::bench
