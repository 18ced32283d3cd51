// The codecs' element kernels (src/core/compress_kernels.h) against
// independent references: the 16-bit casts against rounding done in
// double arithmetic, every loop against its per-value function, and the
// finiteness scans against a plain scalar scan, with the odd value at
// every position a vector loop could miss (its head, its tail).
#include "core/compress_kernels.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace xsilo::compress {
namespace {

uint32_t Bits(float x) { return std::bit_cast<uint32_t>(x); }
float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

// |x| rounded to nearest, ties to even, on a grid of `mant_bits` bits
// below the leading one and no finer than 2^(emin - mant_bits) (the
// subnormals); infinity above `max_finite`. Exact in double: a float
// divided by a power of two, and nearbyint in the default rounding mode.
double RoundedMagnitude(float x, int mant_bits, int emin, double max_finite) {
  const double a = std::fabs(static_cast<double>(x));
  if (a == 0) return 0;
  int e = 0;
  std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1): the leading bit is 2^(e-1)
  const double q = std::ldexp(1.0, std::max(e - 1, emin) - mant_bits);
  const double r = std::nearbyint(a / q) * q;
  return r > max_finite ? std::numeric_limits<double>::infinity() : r;
}

float Signed(float x, double magnitude) {
  const float m = static_cast<float>(magnitude);  // exact: 8 or 11 bits
  return std::signbit(x) ? -m : m;
}

float RefBF16(float x) { return Signed(x, RoundedMagnitude(x, 7, -126, 0x1.fep127)); }
float RefF16(float x) { return Signed(x, RoundedMagnitude(x, 10, -14, 65504.0)); }

// The value of a half's bit pattern, from its definition.
float RefF16Value(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exp == 31) {
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return static_cast<float>((h & 0x8000) ? -v : v);
}

// Floats with every sign and exponent, and low bits at and around each
// cast's rounding point (bit 16 for bf16, bit 13 for fp16), the ties
// between fp16 subnormals, and random patterns.
std::vector<float> CastInputs() {
  std::vector<float> v;
  // (0xe000 and 0xf000 make 65504 and 65520, fp16's largest value and
  // the tie above it that rounds to infinity.)
  const uint32_t lows[] = {0,      1,      0x0fff, 0x1000, 0x1001, 0x2fff, 0x3000, 0x3001, 0x7fff,
                           0x8000, 0x8001, 0x9000, 0xc000, 0xe000, 0xefff, 0xf000, 0xffff};
  for (uint32_t hi = 0; hi < 0x10000; ++hi)
    for (uint32_t lo : lows) v.push_back(FromBits(hi << 16 | lo));
  for (int k = 0; k < 2048; ++k) v.push_back(std::ldexp(2.0f * k + 1, -25));  // fp16 ties
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) v.push_back(FromBits(static_cast<uint32_t>(rng())));
  return v;
}

TEST(CompressKernels, Bf16CastRoundsToNearestEvenLikeAReference) {
  for (float x : CastInputs()) {
    const uint16_t h = F32ToBF16(x);
    const float got = BF16ToF32(h);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << Bits(x);
      ASSERT_TRUE(h & 0x40) << "a NaN must stay quiet: " << std::hex << Bits(x);
      continue;
    }
    ASSERT_EQ(Bits(got), Bits(RefBF16(x))) << std::hex << "input bits " << Bits(x);
  }
}

TEST(CompressKernels, Fp16CastRoundsToNearestEvenLikeAReference) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float want = RefF16Value(static_cast<uint16_t>(h));
    const float got = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(Bits(got), Bits(want)) << std::hex << "half bits " << h;
    }
  }
  for (float x : CastInputs()) {
    const uint16_t h = F32ToF16(x);
    if (std::isnan(x)) {
      ASSERT_EQ(h & 0x7fff, 0x7e00) << std::hex << Bits(x);
      continue;
    }
    ASSERT_EQ(Bits(F16ToF32(h)), Bits(RefF16(x))) << std::hex << "input bits " << Bits(x);
  }
}

// Lengths that leave a tail after any vector width.
constexpr size_t kN = 4099;

std::vector<float> RandomPatterns(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = FromBits(static_cast<uint32_t>(rng()));
  return v;
}

TEST(CompressKernels, HalfLoopsCastEveryValueAsTheScalarCastDoes) {
  const std::vector<float> in = RandomPatterns(kN, 1), ref = RandomPatterns(kN, 2);
  for (bool bf16 : {true, false}) {
    for (const float* r : {static_cast<const float*>(nullptr), ref.data()}) {
      std::vector<uint16_t> out(kN);
      EncodeHalf(in.data(), r, out.data(), kN, bf16);
      for (size_t i = 0; i < kN; ++i) {
        const float v = r ? in[i] - r[i] : in[i];
        ASSERT_EQ(out[i], bf16 ? F32ToBF16(v) : F32ToF16(v)) << "value " << i << " bf16 " << bf16;
      }
      std::vector<float> back(kN);
      EncodeHalf(in.data(), nullptr, out.data(), kN, bf16);
      DecodeHalf(out.data(), r, back.data(), kN, bf16);
      for (size_t i = 0; i < kN; ++i) {
        const float v = bf16 ? BF16ToF32(out[i]) : F16ToF32(out[i]);
        const float want = r ? r[i] + v : v;
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(back[i]));
        } else {
          ASSERT_EQ(Bits(back[i]), Bits(want)) << "value " << i << " bf16 " << bf16;
        }
      }
    }
  }
}

TEST(CompressKernels, ShufflePutsByteBOfEveryElementTogether) {
  std::mt19937 rng(9);
  for (size_t elem : {size_t{1}, size_t{2}, size_t{3}, size_t{4}, size_t{8}}) {
    const size_t n = 1031;  // elements: a tail after any vector width
    std::vector<uint8_t> in(n * elem), out(n * elem), back(n * elem);
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    Shuffle(in.data(), out.data(), n, elem);
    for (size_t i = 0; i < n; ++i)
      for (size_t b = 0; b < elem; ++b)
        ASSERT_EQ(out[b * n + i], in[i * elem + b]) << "elem " << elem << " i " << i << " b " << b;
    Unshuffle(out.data(), back.data(), n, elem);
    ASSERT_EQ(back, in) << "elem " << elem;
  }
}

std::vector<float> Normal(size_t n, uint32_t seed, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(CompressKernels, FiniteScansFindTheLargestMagnitudeAndEveryNonFiniteValue) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = Normal(kN, 3, 1), ref = Normal(kN, 4, 1), err = Normal(kN, 5, 0.1f);
  float want = 0, want_d = 0, want_e = 0;
  for (size_t i = 0; i < kN; ++i) {
    want = std::max(want, std::fabs(x[i]));
    want_d = std::max(want_d, std::fabs(x[i] - ref[i]));
    want_e = std::max(want_e, std::fabs(x[i] - ref[i] + err[i]));
  }
  float got = -1;
  ASSERT_TRUE(FiniteAbsMax(x.data(), kN, &got));
  EXPECT_EQ(got, want);
  ASSERT_TRUE(FiniteDeltaAbsMax(x.data(), ref.data(), nullptr, kN, &got));
  EXPECT_EQ(got, want_d);
  ASSERT_TRUE(FiniteDeltaAbsMax(x.data(), ref.data(), err.data(), kN, &got));
  EXPECT_EQ(got, want_e);
  // The largest magnitude of a negative value (a scan that kept the sign
  // bit would take 1 for the larger).
  const std::vector<float> signs = {1.0f, -2.0f, 0.5f};
  ASSERT_TRUE(FiniteAbsMax(signs.data(), signs.size(), &got));
  EXPECT_EQ(got, 2.0f);
  // Signed zeros and subnormals are finite.
  const std::vector<float> tiny = {-0.0f, 0.0f, 1e-45f, -1e-40f};
  ASSERT_TRUE(FiniteAbsMax(tiny.data(), tiny.size(), &got));
  EXPECT_EQ(got, 1e-40f);

  for (size_t pos : {size_t{0}, size_t{1}, size_t{7}, size_t{2048}, kN - 2, kN - 1}) {
    for (float bad : {inf, -inf, nan, -nan}) {
      std::vector<float> xb = x, rb = ref, eb = err;
      xb[pos] = bad;
      EXPECT_FALSE(FiniteAbsMax(xb.data(), kN, &got)) << pos << " " << bad;
      EXPECT_FALSE(FiniteDeltaAbsMax(xb.data(), ref.data(), nullptr, kN, &got)) << pos;
      rb[pos] = bad;
      EXPECT_FALSE(FiniteDeltaAbsMax(x.data(), rb.data(), nullptr, kN, &got)) << pos;
      eb[pos] = bad;
      EXPECT_FALSE(FiniteDeltaAbsMax(x.data(), ref.data(), eb.data(), kN, &got)) << pos;
    }
    // Finite inputs whose difference overflows.
    std::vector<float> xb = x, rb = ref;
    xb[pos] = 3e38f;
    rb[pos] = -3e38f;
    EXPECT_FALSE(FiniteDeltaAbsMax(xb.data(), rb.data(), nullptr, kN, &got)) << pos;
  }
}

}  // namespace
}  // namespace xsilo::compress
