#include "core/compress_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace xsilo::compress {
namespace {

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

float FromBits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Rounds to the nearest integer, ties to even (the default rounding
// mode's, as std::nearbyint), for |v| < 2^22: added to 1.5 * 2^23 a float
// has no fraction bits left. std::nearbyint is a libm call per value
// without SSE4.1, which made the int8 cast several times slower than zstd.
inline float RoundHalfEven(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

}  // namespace

void Shuffle(const uint8_t* in, uint8_t* out, size_t n, size_t elem) {
  if (elem == 1) {
    std::memcpy(out, in, n);
    return;
  }
  // Blocks of 256 elements keep the `elem` output streams in cache lines.
  constexpr size_t kBlock = 256;
  for (size_t i0 = 0; i0 < n; i0 += kBlock) {
    const size_t i1 = std::min(n, i0 + kBlock);
    for (size_t b = 0; b < elem; ++b) {
      uint8_t* o = out + b * n;
      const uint8_t* p = in + b;
      for (size_t i = i0; i < i1; ++i) o[i] = p[i * elem];
    }
  }
}

void Unshuffle(const uint8_t* in, uint8_t* out, size_t n, size_t elem) {
  if (elem == 1) {
    std::memcpy(out, in, n);
    return;
  }
  constexpr size_t kBlock = 256;
  for (size_t i0 = 0; i0 < n; i0 += kBlock) {
    const size_t i1 = std::min(n, i0 + kBlock);
    for (size_t b = 0; b < elem; ++b) {
      const uint8_t* s = in + b * n;
      uint8_t* p = out + b;
      for (size_t i = i0; i < i1; ++i) p[i * elem] = s[i];
    }
  }
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

uint16_t F32ToBF16(float x) {
  const uint32_t u = Bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float BF16ToF32(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

uint16_t F32ToF16(float x) {
  const uint32_t u = Bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;   // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;  // rounds to 65520 or more: infinity
  if (a < 0x38800000u) {
    // Below 2^-14: a half subnormal m * 2^-24. The scaling is exact and
    // rounding is to nearest even; m == 1024 is the least normal.
    const float m = RoundHalfEven(std::fabs(x) * 16777216.0f);
    return sign | static_cast<uint16_t>(m);
  }
  // Round to nearest even at bit 13, then rebias the exponent (127 -> 15).
  const uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
  return sign | static_cast<uint16_t>(r >> 13);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return FromBits(Bits(v) | sign);
  }
  if (exp == 31) return FromBits(sign | 0x7f800000u | (mant << 13));
  return FromBits(sign | ((exp + 112u) << 23) | (mant << 13));
}

bool FiniteAbsMax(const float* x, size_t n, float* absmax) {
  float m = 0;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    finite &= a <= 3.4028234663852886e38f;  // false for inf and NaN
    m = std::max(m, a);
  }
  *absmax = m;
  return finite;
}

bool FiniteDeltaAbsMax(const float* x, const float* ref, const float* err, size_t n,
                       float* absmax) {
  constexpr float kMax = 3.4028234663852886e38f;
  float m = 0;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    finite &= std::fabs(x[i]) <= kMax && std::fabs(ref[i]) <= kMax;  // false for inf and NaN
    m = std::max(m, std::fabs(x[i] - ref[i] + (err ? err[i] : 0.0f)));
  }
  *absmax = m;
  return finite && m <= kMax;
}

void EncodeHalf(const float* in, const float* ref, uint16_t* out, size_t n, bool bf16) {
  for (size_t i = 0; i < n; ++i) {
    const float v = ref ? in[i] - ref[i] : in[i];
    out[i] = bf16 ? F32ToBF16(v) : F32ToF16(v);
  }
}

void DecodeHalf(const uint16_t* in, const float* ref, float* out, size_t n, bool bf16) {
  for (size_t i = 0; i < n; ++i) {
    const float v = bf16 ? BF16ToF32(in[i]) : F16ToF32(in[i]);
    out[i] = ref ? ref[i] + v : v;
  }
}

void EncodeInt8(const float* in, const float* ref, float* scales, int8_t* q, size_t n,
                size_t block) {
  float d[4096];
  for (size_t b0 = 0, k = 0; b0 < n; b0 += block, ++k) {
    const size_t len = std::min(block, n - b0);
    float amax = 0;
    for (size_t i = 0; i < len; ++i) {
      d[i] = ref ? in[b0 + i] - ref[b0 + i] : in[b0 + i];
      amax = std::max(amax, std::fabs(d[i]));
    }
    const float scale = amax / 127.0f;
    scales[k] = scale;
    if (scale == 0) {
      std::memset(q + b0, 0, len);
      continue;
    }
    // |d / scale| <= 127 (plus rounding): within RoundHalfEven's range.
    for (size_t i = 0; i < len; ++i) {
      const float r = RoundHalfEven(d[i] / scale);
      q[b0 + i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
  }
}

void DecodeInt8(const float* scales, const int8_t* q, const float* ref, float* out, size_t n,
                size_t block) {
  for (size_t b0 = 0, k = 0; b0 < n; b0 += block, ++k) {
    const size_t len = std::min(block, n - b0);
    const float scale = scales[k];
    for (size_t i = 0; i < len; ++i) {
      const float v = static_cast<float>(q[b0 + i]) * scale;
      out[b0 + i] = ref ? ref[b0 + i] + v : v;
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

void SparsifyTarget(const float* in, const float* ref, const float* err, float thr, float* target,
                    size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float d = in[i] - ref[i] + (err ? err[i] : 0.0f);
    target[i] = std::fabs(d) >= thr ? ref[i] + d : ref[i];
  }
}

void ResidualOf(const float* in, const float* err, const float* decoded, float* err_out, size_t n) {
  for (size_t i = 0; i < n; ++i) err_out[i] = in[i] + (err ? err[i] : 0.0f) - decoded[i];
}

}  // namespace xsilo::compress
