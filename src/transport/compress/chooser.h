// Private to the compressing transport: the prediction behind
// compression.when=auto, pure functions of a message's size, a link's
// throughput and each candidate codec's measured speeds and ratio (the
// decorator in compressing_transport.cpp samples those; tests call these
// directly). docs/compression.md, "The choice".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xsilo/core/compress.h"

namespace xsilo {

// One candidate's figures, for the choice.
struct CodecCandidate {
  CodecEstimate estimate;
  uint64_t eligible_bytes = 0;  // what it would encode (CompressibleBytes)
};

struct CompressionChoice {
  bool compress = false;
  TensorRecipe recipe;
  double predicted_s = 0;     // with the chosen recipe
  double uncompressed_s = 0;  // sending as it is
  double ratio = 1;           // estimated encoded / raw of the eligible bytes
  std::string reason;         // one line, for the debug log
};

// The prediction behind compression.when=auto, pure: a message of
// `message_bytes` over a link of `link_Bps` takes message_bytes / link_Bps
// as it is; with a candidate, eligible / (encode speed x threads) +
// (message - eligible + eligible x ratio) / link_Bps + eligible / (decode
// speed x threads). The fastest candidate wins if it beats the plain send
// by `margin`. `link_Bps` <= 0 (unknown) never compresses.
CompressionChoice ChooseCompression(uint64_t message_bytes, double link_Bps, int threads,
                                    const std::vector<CodecCandidate>& candidates, double margin);

// The choice for a link known only to give at most `ceiling_Bps` (a long
// one not measured yet): each option, sending as it is or a candidate,
// takes a + b / link seconds (as in ChooseCompression) at any link speed
// up to the ceiling; its slowdown at worst is the largest ratio of its
// time to the best option's at the same speed. The candidate with the
// least wins if that is `margin` below sending as it is (the margin is a
// fraction of the slowdown at worst here, not of a time), whose worst is
// on the slowest links (its bytes over the fewest any candidate sends). So
// a cast that sends a quarter or half of the bytes usually wins even where
// it is slower than sending as it is at the ceiling itself (bf16 at 1.79x
// there against 3.00x at worst for none, on the Big model); lossless zstd
// at 0.84 does not unless its codec time is small against the ceiling's
// send. predicted_s and uncompressed_s are at the ceiling.
CompressionChoice ChooseCompressionUnderCeiling(uint64_t message_bytes, double ceiling_Bps,
                                                int threads,
                                                const std::vector<CodecCandidate>& candidates,
                                                double margin);

// Whether a recipe cannot pay even at its best ratio (0 with zstd, a bare
// cast's own size without): ChooseCompression's prediction with that ratio
// and the codec's speeds (one thread's) is not `margin` below sending as it
// is. False when a figure is unknown (<= 0). The decorator skips sampling
// such a recipe while the speeds it last sampled are fresh.
bool CompressionCannotPay(uint64_t eligible_bytes, uint64_t message_bytes, double link_Bps,
                          int threads, double encode_Bps, double decode_Bps, double best_ratio,
                          double margin);

namespace compression_internal {

// "lossless", "int8+zstd", "bf16 top-0.0100 delta", ...: a recipe's name in
// the choice's reason lines and the decorator's speed memo.
std::string RecipeName(const TensorRecipe& r);
// x with `digits` decimals.
std::string Fixed(double x, int digits);

}  // namespace compression_internal

}  // namespace xsilo
