// Private: the element kernels of the tensor codecs (xsilo/core/compress.h):
// byte-plane shuffles, bf16/fp16 casts with round-to-nearest-even and
// blockwise int8 quantization. Plain loops over raw memory, no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

namespace xsilo::compress {

// out[b * n + i] = in[i * elem + b]: byte b of every element together.
void Shuffle(const uint8_t* in, uint8_t* out, size_t n, size_t elem);
void Unshuffle(const uint8_t* in, uint8_t* out, size_t n, size_t elem);

// out[i] = in[i] ^ ref[i].
void XorBytes(const uint8_t* in, const uint8_t* ref, uint8_t* out, size_t bytes);

// Round-to-nearest-even casts of one value; NaN stays NaN (quiet), and
// F32ToF16 turns values beyond the half range into infinities (callers
// compare the absolute maximum with kHalfMax first). Branch-free, so the
// loops below vectorize; tests/core/compress_kernels_test.cpp checks them
// against an independent rounding in double.
uint16_t F32ToBF16(float x);
float BF16ToF32(uint16_t h);
uint16_t F32ToF16(float x);
float F16ToF32(uint16_t h);

// True when every value is finite; *absmax then receives the largest |x|
// (of no use otherwise).
bool FiniteAbsMax(const float* x, size_t n, float* absmax);
// True when every x[i] and ref[i] and every x[i] - ref[i] + err[i] (err
// may be null) is finite; *absmax then receives the largest
// |x - ref + err|.
// One pass where three took 3x the memory traffic on a 265 MB model.
bool FiniteDeltaAbsMax(const float* x, const float* ref, const float* err, size_t n, float* absmax);
// Largest magnitude an fp16 cast keeps finite.
inline constexpr float kHalfMax = 65504.0f;

// A delta on the values' grid: the 16-bit cast of in[i] against that of
// ref[i], as the zigzag code of their difference mod 2^16 (0 when the cast
// is unchanged, 1 and 2 for a move of one code down and up). Decoding
// gives the cast of in[i] exactly, whatever ref holds. Returns whether
// every in[i] - ref[i] was finite (as EncodeHalf, below).
bool EncodeHalfOnValues(const float* in, const float* ref, uint16_t* out, size_t n, bool bf16);
void DecodeHalfOnValues(const uint16_t* in, const float* ref, float* out, size_t n, bool bf16);

// in[i] - ref[i] (ref may be null: in[i]) cast to 16 bits. Returns whether
// every value cast was finite (so every in[i] and ref[i] was too); when
// not, the output is unusable (the tensor must go lossless). An fp16 cast
// also needs the range (kHalfMax), which its caller checks first.
bool EncodeHalf(const float* in, const float* ref, uint16_t* out, size_t n, bool bf16);
// out[i] = cast(in[i]) + ref[i] (ref may be null).
void DecodeHalf(const uint16_t* in, const float* ref, float* out, size_t n, bool bf16);

// Blockwise int8 of in[i] - ref[i] (ref may be null): per block of `block`
// values (the last may be shorter) one float scale absmax / 127 into
// scales[b], then q[i] = round(x / scale). Returns whether every
// difference (every value, without ref) was finite, which also says that
// every value and reference was; when not, the output is unusable (the
// tensor must go lossless), so no separate finite scan is needed first.
//
// `value_scale` (with a ref): the scale is that of the values, the absmax
// of in[] / 127, so the difference lands on the grid a whole cast of in[]
// would use, with that cast's error bound; a block whose difference does
// not fit 127 steps of it is coded whole (q = round(in / scale)) and its
// scale stored negated (-0.0 for a block of zeros, or of subnormals whose
// scale underflows).
bool EncodeInt8(const float* in, const float* ref, float* scales, int8_t* q, size_t n, size_t block,
                bool value_scale = false);
// The inverse; `value_scale` as the encoder's (a negative scale then marks
// a block coded whole, which ignores ref).
void DecodeInt8(const float* scales, const int8_t* q, const float* ref, float* out, size_t n,
                size_t block, bool value_scale = false);

// Top-k sparsification of an update (in - ref + err, err may be null): the
// magnitude at or above which a value of it is kept so that about
// `fraction` of the n values are, from an even sample of at most 65536 of
// them. Never below the least positive float: unchanged values are never
// kept. Callers check the inputs are finite first.
float TopKThreshold(const float* in, const float* ref, const float* err, size_t n, double fraction);
// target[i] = ref[i] + d where d = in[i] - ref[i] + err[i] has |d| >= thr,
// else ref[i] exactly (err may be null).
void SparsifyTarget(const float* in, const float* ref, const float* err, float thr, float* target,
                    size_t n);
// err_out[i] = in[i] + err[i] - decoded[i] (err may be null): what the
// receiver's `decoded` still lacks, carried into the next update.
void ResidualOf(const float* in, const float* err, const float* decoded, float* err_out, size_t n);

// out[i] = update[i] + (ours[i] - cast[i]); out may be update.
void AddDifference(const float* update, const float* ours, const float* cast, float* out, size_t n);

}  // namespace xsilo::compress
