// Tensor compression (docs/compression.md): fewer bytes on a slow link.
//
// A Message's tensors are encoded in place of themselves: each compressed
// tensor travels as a U8 tensor of its encoded bytes under its own name,
// and the message param kCodecParam (a JSON table) says how to decode it.
// Every transport carries such a message unchanged, and a hybrid backend
// stores the compressed object, so it is uploaded once and every receiver
// pulls fewer bytes.
//
// Per tensor, three stages, each optional:
//   1. delta against a reference both parties hold (the round's global
//      model): XOR of the bit patterns when lossless, the difference when
//      lossy;
//   2. quantization (lossy, F32 only): bf16 or fp16 by round-to-nearest-
//      even, or blockwise int8 with one absmax scale per block;
//   3. byte-plane shuffle and zstd, chunk by chunk on several threads.
// Each chunk carries the XXH3-64 of what its decoder must produce (the
// tensor's own bytes when lossless, the quantized values when lossy), so a
// corrupt frame or a wrong reference is refused as Corrupt, never handed
// on. Decoding writes into the output tensor's Buffer through a per-chunk
// scratch: no second copy of the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "xsilo/core/message.h"
#include "xsilo/core/status.h"

namespace xsilo {

class EncodeStream;

// The param that holds the codec table of a compressed message.
inline constexpr const char* kCodecParam = "xsilo.codec";
// Param (int) a sender sets on a message whose tensors are to be sent as
// a delta against the reference of that key: an update (the reference plus
// small changes), or, with kDeltaRefParam besides, the next model after
// that reference, which goes as a delta only to receivers that said they
// hold it (docs/compression.md, "Next models"). The compressing transport
// (xsilo/transport/compression.h) leaves it on the message for the
// receiver.
inline constexpr const char* kDeltaBaseParam = "xsilo.delta_base";
// Param (int) on a message whose tensors are to be kept as the reference
// of that key (by the sender when it sends it, by each receiver when it
// arrives), for later messages that name it in kDeltaBaseParam.
inline constexpr const char* kDeltaRefParam = "xsilo.delta_ref";

// What one tensor becomes. Lossy stages apply to F32 tensors only; other
// dtypes go lossless.
enum class Quant : uint8_t { kNone, kBF16, kFP16, kInt8 };
std::string_view QuantName(Quant q);  // "none", "bf16", "fp16", "int8"

struct TensorRecipe {
  Quant quant = Quant::kNone;
  bool zstd = true;    // shuffle + zstd after quantization
  bool delta = false;  // against the reference (when the message has one)
  // Top-k sparsification of a delta (lossy, F32 tensors whose values, and
  // reference, are finite): about this fraction of each tensor's changes,
  // the largest in magnitude, is kept, the rest sent as no change at all.
  // 0: off. With error feedback (CompressMessage's `residual`) what is
  // dropped is added to the next update instead of lost.
  double topk = 0;
  // A lossy delta on the values' own scale, not the difference's: for a
  // next model, whose receivers need it within the bound of a whole cast
  // of it, not of the change. int8 quantizes the difference with the
  // values' block scale (absmax / 127; a block whose change exceeds 127
  // steps goes whole); bf16 and fp16 send how many codes each value's
  // cast moved from the reference's cast, and decode to the whole cast
  // exactly. Most values keep their code or move by one, which zstd packs
  // tightly. Not with top-k.
  bool value_scale = false;
};

struct CompressOptions {
  int zstd_level = 1;
  // Threads that encode or decode chunks (0: the hardware's, at most 4).
  int threads = 0;
  // Tensors below this many bytes travel as they are.
  uint64_t min_tensor_bytes = 64 << 10;
  // Values per int8 block (64..4096, a power of two).
  uint32_t int8_block = 256;
  // Input bytes per chunk (a multiple of 64 KiB; rounded down to whole
  // int8 blocks).
  uint64_t chunk_bytes = 1 << 20;
  // Largest decoded tensor accepted (a table claiming more is Corrupt
  // before anything is allocated).
  uint64_t max_decoded_bytes = 1ull << 40;
};

// What a compression did, for logs and the bench JSON.
struct CompressStats {
  uint64_t raw_bytes = 0;      // tensor bytes of the compressed tensors
  uint64_t encoded_bytes = 0;  // their encoded bytes
  uint64_t tensors = 0;
  double seconds = 0;
  double ratio() const { return raw_bytes ? double(encoded_bytes) / double(raw_bytes) : 1.0; }
};

// Encodes every eligible tensor of `m` by `recipe` (a delta only where
// `reference` holds a tensor of the same name, dtype and shape) and writes
// the codec table. `reference_key` names the reference in the table.
// Tensors are replaced by their encoded form; a message with nothing
// worth encoding is left unchanged (no table).
//
// Top-k (recipe.topk > 0, delta tensors only): each kept value becomes
// reference + (value - reference + residual), each other one the
// reference's own; the decoder needs nothing new (a kept change is an
// ordinary delta, a dropped one a zero delta). `residual`, when given,
// is the error feedback: its tensor of the same name, dtype and shape is
// added to the update before selection, and is replaced by what the
// receiver's decoded tensor still lacks (value + residual - decoded);
// a tensor that travels without top-k leaves its residual as it was.
//
// `stream` (optional) gets the payload's bytes as they are final
// (EncodeStream); the caller Finish()es it with the message.
Status CompressMessage(Message* m, const TensorRecipe& recipe, const CompressOptions& options,
                       const TensorMap* reference = nullptr, int64_t reference_key = 0,
                       CompressStats* stats = nullptr, TensorMap* residual = nullptr,
                       EncodeStream* stream = nullptr);

// Finds the reference a message's table names (nullptr when none is
// held). Called at most once per message.
using ReferenceLookup = std::function<const TensorMap*(int64_t key)>;

// Decodes a message that carries kCodecParam (no-op without it) and
// removes the table. Corrupt for any malformed table or frame, a chunk
// whose checksum does not match, or a delta whose reference is missing or
// differs from the sender's (FailedPrecondition for a missing one).
// `decoded` (optional) gets the names of the tensors it decoded: each into
// a Buffer of its own that only the message holds, which the caller may
// change in place (the tensors it left alone may share the sender's or a
// transport's read-only Buffers).
//
// `onto` (optional): a lossy difference (a delta not on the values'
// scale) is added to the tensor of the same name, dtype and shape that
// onto(key of the table's reference) holds instead of to the reference's
// (which is still the one checked against the sender's digest); `moved`
// gets the names so decoded. An update made from a lossy cast of ours
// then decodes to ours plus its change in one pass (AddDifference's
// update + (ours - cast), without a second pass over the tensor).
Status DecompressMessage(Message* m, const ReferenceLookup& references = {},
                         const CompressOptions& options = {},
                         std::vector<std::string>* decoded = nullptr,
                         const ReferenceLookup& onto = {},
                         std::vector<std::string>* moved = nullptr);

// The XXH3 digest a codec table records of a reference tensor map.
uint64_t ReferenceDigest(const TensorMap& reference);

// out[i] = update[i] + (ours[i] - cast[i]) for n F32 values, on up to
// `threads` threads (0: the hardware's, at most 4); `out` may be `update`.
// Moves an update made from a lossy cast of `ours` (what its sender held)
// onto `ours` itself (xsilo/transport/compression.h).
void AddDifference(const float* update, const float* ours, const float* cast, float* out,
                   uint64_t n, int threads = 0);

// The documented error bound of a lossy recipe for one value x (whose
// int8 block has absolute maximum `block_absmax`): the largest |x' - x|.
//   bf16: max(|x| 2^-8, 2^-134)     (half an ulp of 8 significant bits)
//   fp16: |x| 2^-11 for |x| >= 2^-14, else 2^-25 (half an fp16 ulp)
//   int8: absmax / 254 (1 + 2^-12) + 2^-126
// For a delta, x is the difference from the reference, and the sum
// reference + decoded difference adds at most half an ulp of the result;
// for an int8 delta on the values' scale (TensorRecipe::value_scale)
// block_absmax is that of the values; a bf16 or fp16 one decodes to the
// whole cast of the value x exactly (its bound, and no more).
double QuantErrorBound(Quant q, float x, float block_absmax);

// Estimated cost of a recipe on a payload, from a sample of its chunks.
struct CodecEstimate {
  TensorRecipe recipe;
  double ratio = 1;       // encoded / raw
  double encode_Bps = 0;  // raw bytes per second of wall time, one thread
  double decode_Bps = 0;
  // The same from the sampling thread's CPU time: the codec's speed on a
  // core of its own. A sample takes a few ms, so one preemption on a busy
  // machine can make its wall time many times its CPU time (at the first
  // broadcast of a geo-distributed job, while seven clients set up, a
  // sample put a bf16 cast of the Big model at 2.68 s; it took 0.25-0.37 s
  // in the rounds after). 0: not measured.
  double encode_cpu_Bps = 0;
  double decode_cpu_Bps = 0;
  uint64_t sampled_bytes = 0;
  // For a delta recipe: whether every sampled piece had a reference to
  // take its difference from (the reference holds a tensor of the same
  // name, dtype and shape). Without it the figures are (partly) the
  // recipe's without a delta, as a message with those tensors would be
  // encoded.
  bool delta_sampled = false;
};
// Encodes and decodes `sample_bytes` (at least one chunk, at most eight)
// in pieces of one chunk taken evenly across the eligible tensors of
// `tensors` (against `reference` for a delta recipe) on one thread, timing
// it: speeds are one thread's.
CodecEstimate EstimateCodec(const TensorMap& tensors, const TensorRecipe& recipe,
                            const CompressOptions& options, const TensorMap* reference = nullptr,
                            uint64_t sample_bytes = 2 << 20);

// Bytes of `tensors` that a recipe would encode (eligible tensors).
uint64_t CompressibleBytes(const TensorMap& tensors, const TensorRecipe& recipe,
                           const CompressOptions& options);

}  // namespace xsilo
