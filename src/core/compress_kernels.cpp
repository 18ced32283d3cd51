#include "core/compress_kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

namespace xsilo::compress {
namespace {

uint32_t Bits(float x) { return std::bit_cast<uint32_t>(x); }
float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

// Rounds to the nearest integer, ties to even (the default rounding
// mode's, as std::nearbyint), for |v| < 2^22: added to 1.5 * 2^23 a float
// has no fraction bits left. std::nearbyint is a libm call per value
// without SSE4.1, which made the int8 cast several times slower than zstd.
inline float RoundHalfEven(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

// Byte b of element i goes to plane b (out[b * n + i] = in[i * elem + b])
// or back (kBack). With the element size a constant the compiler turns
// the byte gathers into vector shuffles; with it a variable each byte was
// one load.
template <bool kBack, size_t kElem>
void PlanesOf(const uint8_t* in, uint8_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t b = 0; b < kElem; ++b) {
      if (kBack) {
        out[i * kElem + b] = in[b * n + i];
      } else {
        out[b * n + i] = in[i * kElem + b];
      }
    }
  }
}

template <bool kBack>
void Planes(const uint8_t* in, uint8_t* out, size_t n, size_t elem) {
  switch (elem) {
    case 1:
      std::memcpy(out, in, n);
      return;
    case 2:
      return PlanesOf<kBack, 2>(in, out, n);
    case 4:
      return PlanesOf<kBack, 4>(in, out, n);
    case 8:
      return PlanesOf<kBack, 8>(in, out, n);
  }
  // Other sizes: blocks of 256 elements keep the `elem` planes in cache
  // lines.
  constexpr size_t kBlock = 256;
  for (size_t i0 = 0; i0 < n; i0 += kBlock) {
    const size_t i1 = std::min(n, i0 + kBlock);
    for (size_t b = 0; b < elem; ++b) {
      for (size_t i = i0; i < i1; ++i) {
        if (kBack) {
          out[i * elem + b] = in[b * n + i];
        } else {
          out[b * n + i] = in[i * elem + b];
        }
      }
    }
  }
}

}  // namespace

void Shuffle(const uint8_t* in, uint8_t* out, size_t n, size_t elem) {
  Planes<false>(in, out, n, elem);
}

void Unshuffle(const uint8_t* in, uint8_t* out, size_t n, size_t elem) {
  Planes<true>(in, out, n, elem);
}

void XorBytes(const uint8_t* in, const uint8_t* ref, uint8_t* out, size_t bytes) {
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t a, b;
    std::memcpy(&a, in + i, 8);
    std::memcpy(&b, ref + i, 8);
    a ^= b;
    std::memcpy(out + i, &a, 8);
  }
  for (; i < bytes; ++i) out[i] = in[i] ^ ref[i];
}

namespace {

// The casts compute every case and select, without branches, so that
// the loops over them below vectorize (SSE2 compares and blends); a
// branch per value kept them scalar. They are inlined there: the exported
// functions below may be interposed in a shared build, so a loop calling
// them does so once per value.
inline uint16_t ToBF16(float x) {
  const uint32_t u = Bits(x);
  const uint32_t nan = (u >> 16) | 0x40u;  // quiet
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

inline float FromBF16(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

inline uint16_t ToF16(float x) {
  const uint32_t u = Bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  // Below 2^-14: a half subnormal m * 2^-24. The scaling is exact and
  // rounding is to nearest even; m == 1024 is the least normal. (The
  // clamp keeps the conversion in range for the values not taking it.)
  const uint32_t sub = static_cast<uint32_t>(
      static_cast<int32_t>(RoundHalfEven(FromBits(std::min(a, 0x38800000u)) * 16777216.0f)));
  // Round to nearest even at bit 13, then rebias the exponent (127 -> 15).
  // (Wraps for the values below the normal range, which take `sub`.)
  const uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u) - (112u << 23)) >> 13;
  uint32_t h = a < 0x38800000u ? sub : normal;
  h = a >= 0x477ff000u ? 0x7c00u : h;  // rounds to 65520 or more: infinity
  h = a > 0x7f800000u ? 0x7e00u : h;   // NaN
  return static_cast<uint16_t>(sign | h);
}

inline float FromF16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  const uint32_t sub = Bits(static_cast<float>(mant) * (1.0f / 16777216.0f)) | sign;
  const uint32_t special = sign | 0x7f800000u | (mant << 13);
  const uint32_t normal = sign | ((exp + 112u) << 23) | (mant << 13);
  return FromBits(exp == 0 ? sub : exp == 31 ? special : normal);
}

}  // namespace

uint16_t F32ToBF16(float x) { return ToBF16(x); }
float BF16ToF32(uint16_t h) { return FromBF16(h); }
uint16_t F32ToF16(float x) { return ToF16(x); }
float F16ToF32(uint16_t h) { return FromF16(h); }

// Magnitudes compare as their bit patterns with the sign cleared (as
// integers: inf above every finite value, NaN above inf), which
// vectorizes where a float max reduction does not (it is not associative
// for NaN and signed zeros).
namespace {
constexpr int32_t kInfBits = 0x7f800000;
inline int32_t AbsBits(float x) { return static_cast<int32_t>(Bits(x) & 0x7fffffffu); }

template <bool kErr>
bool DeltaAbsMax(const float* x, const float* ref, const float* err, size_t n, float* absmax) {
  int32_t inputs = 0, m = 0;
  for (size_t i = 0; i < n; ++i) {
    inputs = std::max(inputs, std::max(AbsBits(x[i]), AbsBits(ref[i])));
    const float d = kErr ? x[i] - ref[i] + err[i] : x[i] - ref[i];
    m = std::max(m, AbsBits(d));
  }
  *absmax = FromBits(static_cast<uint32_t>(m));
  return inputs < kInfBits && m < kInfBits;
}

template <bool kRef, bool kBF16>
bool EncodeHalfOf(const float* in, const float* ref, uint16_t* out, size_t n) {
  int32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = kRef ? in[i] - ref[i] : in[i];
    m = std::max(m, AbsBits(v));
    out[i] = kBF16 ? ToBF16(v) : ToF16(v);
  }
  return m < kInfBits;
}

template <bool kRef, bool kBF16>
void DecodeHalfOf(const uint16_t* in, const float* ref, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float v = kBF16 ? FromBF16(in[i]) : FromF16(in[i]);
    out[i] = kRef ? ref[i] + v : v;
  }
}
// The casts' codes of in[] and ref[], their difference (mod 2^16) zigzag
// coded: a value whose cast moved k codes becomes 2k (k >= 0) or -2k - 1,
// so small moves either way leave the high byte 0.
template <bool kBF16>
bool EncodeHalfOnValuesOf(const float* in, const float* ref, uint16_t* out, size_t n) {
  int32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    m = std::max(m, AbsBits(in[i] - ref[i]));
    const uint16_t a = kBF16 ? ToBF16(in[i]) : ToF16(in[i]);
    const uint16_t b = kBF16 ? ToBF16(ref[i]) : ToF16(ref[i]);
    const auto d = static_cast<int16_t>(static_cast<uint16_t>(a - b));
    out[i] =
        static_cast<uint16_t>((static_cast<uint16_t>(d) << 1) ^ static_cast<uint16_t>(d >> 15));
  }
  return m < kInfBits;
}

template <bool kBF16>
void DecodeHalfOnValuesOf(const uint16_t* in, const float* ref, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t z = in[i];
    const auto d = static_cast<uint16_t>((z >> 1) ^ static_cast<uint16_t>(-(z & 1)));
    const uint16_t b = kBF16 ? ToBF16(ref[i]) : ToF16(ref[i]);
    const auto a = static_cast<uint16_t>(b + d);
    out[i] = kBF16 ? FromBF16(a) : FromF16(a);
  }
}
}  // namespace

bool FiniteAbsMax(const float* x, size_t n, float* absmax) {
  int32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, AbsBits(x[i]));
  *absmax = FromBits(static_cast<uint32_t>(m));
  return m < kInfBits;
}

bool FiniteDeltaAbsMax(const float* x, const float* ref, const float* err, size_t n,
                       float* absmax) {
  return err ? DeltaAbsMax<true>(x, ref, err, n, absmax)
             : DeltaAbsMax<false>(x, ref, nullptr, n, absmax);
}

bool EncodeHalf(const float* in, const float* ref, uint16_t* out, size_t n, bool bf16) {
  if (bf16) {
    return ref ? EncodeHalfOf<true, true>(in, ref, out, n)
               : EncodeHalfOf<false, true>(in, ref, out, n);
  }
  return ref ? EncodeHalfOf<true, false>(in, ref, out, n)
             : EncodeHalfOf<false, false>(in, ref, out, n);
}

void DecodeHalf(const uint16_t* in, const float* ref, float* out, size_t n, bool bf16) {
  if (bf16) {
    ref ? DecodeHalfOf<true, true>(in, ref, out, n) : DecodeHalfOf<false, true>(in, ref, out, n);
  } else {
    ref ? DecodeHalfOf<true, false>(in, ref, out, n) : DecodeHalfOf<false, false>(in, ref, out, n);
  }
}

bool EncodeHalfOnValues(const float* in, const float* ref, uint16_t* out, size_t n, bool bf16) {
  return bf16 ? EncodeHalfOnValuesOf<true>(in, ref, out, n)
              : EncodeHalfOnValuesOf<false>(in, ref, out, n);
}

void DecodeHalfOnValues(const uint16_t* in, const float* ref, float* out, size_t n, bool bf16) {
  bf16 ? DecodeHalfOnValuesOf<true>(in, ref, out, n) : DecodeHalfOnValuesOf<false>(in, ref, out, n);
}

bool EncodeInt8(const float* in, const float* ref, float* scales, int8_t* q, size_t n, size_t block,
                bool value_scale) {
  float d[4096];
  value_scale = value_scale && ref;
  // A difference is finite only if its value and reference are (inf - inf
  // and anything with a NaN are NaN, whose bits exceed infinity's).
  for (size_t b0 = 0, k = 0; b0 < n; b0 += block, ++k) {
    const size_t len = std::min(block, n - b0);
    int32_t amax = 0;
    if (ref) {
      for (size_t i = 0; i < len; ++i) d[i] = in[b0 + i] - ref[b0 + i];
    } else {
      std::memcpy(d, in + b0, len * sizeof(float));
    }
    for (size_t i = 0; i < len; ++i) amax = std::max(amax, AbsBits(d[i]));
    if (amax >= kInfBits) return false;  // the tensor goes lossless
    float scale = FromBits(static_cast<uint32_t>(amax)) / 127.0f;
    const float* x = d;
    bool whole = false;
    if (value_scale) {
      int32_t vmax = 0;
      for (size_t i = 0; i < len; ++i) vmax = std::max(vmax, AbsBits(in[b0 + i]));
      const float vscale = FromBits(static_cast<uint32_t>(vmax)) / 127.0f;
      // |d / vscale| <= 127 for every d: the difference's codes fit.
      whole = !(vscale > 0 && FromBits(static_cast<uint32_t>(amax)) / vscale <= 127.0f);
      scale = vscale;
      if (whole) x = in + b0;
    }
    scales[k] = whole ? -scale : scale;
    if (scale == 0) {
      std::memset(q + b0, 0, len);
      continue;
    }
    // |x / scale| <= 127 (plus rounding): within RoundHalfEven's range.
    for (size_t i = 0; i < len; ++i) {
      const float r = RoundHalfEven(x[i] / scale);
      q[b0 + i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
  }
  return true;
}

void DecodeInt8(const float* scales, const int8_t* q, const float* ref, float* out, size_t n,
                size_t block, bool value_scale) {
  for (size_t b0 = 0, k = 0; b0 < n; b0 += block, ++k) {
    const size_t len = std::min(block, n - b0);
    float scale = scales[k];
    const float* r = ref;
    if (value_scale && std::signbit(scale)) {
      scale = -scale;
      r = nullptr;
    }
    for (size_t i = 0; i < len; ++i) {
      const float v = static_cast<float>(q[b0 + i]) * scale;
      out[b0 + i] = r ? r[b0 + i] + v : v;
    }
  }
}

float TopKThreshold(const float* in, const float* ref, const float* err, size_t n,
                    double fraction) {
  constexpr float kLeast = 1.40129846e-45f;  // the least positive float
  if (n == 0 || fraction >= 1) return kLeast;
  constexpr size_t kSample = 65536;
  const size_t stride = std::max<size_t>(1, n / kSample);
  std::vector<float> mag;
  mag.reserve(std::min(n, kSample) + 1);
  for (size_t i = 0; i < n; i += stride) {
    mag.push_back(std::fabs(in[i] - ref[i] + (err ? err[i] : 0.0f)));
  }
  // The value with about `fraction` of the sample at or above it.
  const size_t keep = std::max<size_t>(1, static_cast<size_t>(fraction * double(mag.size())));
  auto kth = mag.begin() + static_cast<std::ptrdiff_t>(mag.size() - keep);
  std::nth_element(mag.begin(), kth, mag.end());
  return std::max(*kth, kLeast);
}

namespace {

template <bool kErr>
void SparsifyTargetOf(const float* in, const float* ref, const float* err, float thr, float* target,
                      size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float d = kErr ? in[i] - ref[i] + err[i] : in[i] - ref[i];
    target[i] = std::fabs(d) >= thr ? ref[i] + d : ref[i];
  }
}

template <bool kErr>
void ResidualOfOf(const float* in, const float* err, const float* decoded, float* err_out,
                  size_t n) {
  for (size_t i = 0; i < n; ++i) err_out[i] = (kErr ? in[i] + err[i] : in[i]) - decoded[i];
}

}  // namespace

void SparsifyTarget(const float* in, const float* ref, const float* err, float thr, float* target,
                    size_t n) {
  err ? SparsifyTargetOf<true>(in, ref, err, thr, target, n)
      : SparsifyTargetOf<false>(in, ref, nullptr, thr, target, n);
}

void ResidualOf(const float* in, const float* err, const float* decoded, float* err_out, size_t n) {
  err ? ResidualOfOf<true>(in, err, decoded, err_out, n)
      : ResidualOfOf<false>(in, nullptr, decoded, err_out, n);
}

void AddDifference(const float* update, const float* ours, const float* cast, float* out,
                   size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = update[i] + (ours[i] - cast[i]);
}

}  // namespace xsilo::compress
