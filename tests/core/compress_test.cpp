// Tensor codecs (xsilo/core/compress.h): lossless round trips bit for bit,
// lossy ones within the documented bound, deltas, and refusal of corrupt
// tables and frames.
#include "xsilo/core/compress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "xsilo/core/codec.h"
#include "xsilo/core/encode_stream.h"

namespace xsilo {
namespace {

using Json = nlohmann::json;

// Weights as a trained layer has them: normal, small, with a spread of
// magnitudes (the exponent bytes compress, the mantissas do not).
std::vector<float> Weights(size_t n, uint32_t seed, float stddev = 0.05f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// `base` after a round of training: every value moved by normal(0, stddev).
std::vector<float> Stepped(const std::vector<float>& base, uint32_t seed, float stddev) {
  std::vector<float> next = base;
  std::mt19937 rng(seed);
  std::normal_distribution<float> step(0, stddev);
  for (auto& x : next) x += step(rng);
  return next;
}

template <typename T>
Tensor TensorOf(DType dtype, const std::vector<T>& v) {
  return *Tensor::Make(dtype, {static_cast<int64_t>(v.size())},
                       Buffer::CopyFrom(v.data(), v.size() * sizeof(T)));
}

// A tensor of any dtype whose bytes have the structure of that dtype:
// small integers, bools, or floats of a few magnitudes.
Tensor Structured(DType dtype, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n * DTypeSize(dtype));
  auto put = [&](size_t i, const void* p) {
    std::memcpy(bytes.data() + i * DTypeSize(dtype), p, DTypeSize(dtype));
  };
  std::normal_distribution<double> d(0, 0.1);
  for (size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF64: {
        double x = d(rng);
        put(i, &x);
        break;
      }
      case DType::kF32: {
        float x = static_cast<float>(d(rng));
        put(i, &x);
        break;
      }
      case DType::kF16:
      case DType::kBF16: {
        float x = static_cast<float>(d(rng));
        uint32_t u;
        std::memcpy(&u, &x, 4);
        uint16_t h = static_cast<uint16_t>(u >> 16);  // a bf16 pattern: fine for both
        put(i, &h);
        break;
      }
      case DType::kI64: {
        int64_t x = static_cast<int64_t>(rng() % 1000) - 500;
        put(i, &x);
        break;
      }
      case DType::kI32: {
        int32_t x = static_cast<int32_t>(rng() % 1000) - 500;
        put(i, &x);
        break;
      }
      case DType::kI16: {
        int16_t x = static_cast<int16_t>(static_cast<int>(rng() % 200) - 100);
        put(i, &x);
        break;
      }
      case DType::kI8:
      case DType::kU8: {
        uint8_t x = static_cast<uint8_t>(rng() % 16);
        put(i, &x);
        break;
      }
      case DType::kBool: {
        uint8_t x = rng() % 7 == 0;
        put(i, &x);
        break;
      }
    }
  }
  return *Tensor::Make(dtype, {static_cast<int64_t>(n)},
                       Buffer::CopyFrom(bytes.data(), bytes.size()));
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data.data(), b.data.data(), a.nbytes()) == 0;
}

const float* Floats(const Tensor& t) { return reinterpret_cast<const float*>(t.data.data()); }

CompressOptions SmallChunks(int threads) {
  CompressOptions o;
  o.chunk_bytes = 64 << 10;  // several chunks per tensor
  o.threads = threads;
  return o;
}

Json TableOf(const Message& m) {
  return Json::parse(std::get<std::string>(m.params.at(kCodecParam)));
}

// What receivers hold of `model` sent as a whole cast by `q`: its decoded
// values.
std::vector<float> DecodedCast(const std::vector<float>& model, Quant q, const CompressOptions& o) {
  Message cast;
  cast.tensors.emplace("w", TensorOf(DType::kF32, model));
  EXPECT_TRUE(CompressMessage(&cast, {.quant = q}, o).ok());
  EXPECT_TRUE(DecompressMessage(&cast, nullptr, o).ok());
  const float* v = Floats(cast.tensors.at("w"));
  return std::vector<float>(v, v + model.size());
}

// `values` as tensor "w", encoded by `r` against `held` (reference `key`).
Message EncodedAgainst(const std::vector<float>& values, const TensorRecipe& r,
                       const CompressOptions& o, const TensorMap& held, int64_t key,
                       CompressStats* st) {
  Message m;
  m.tensors.emplace("w", TensorOf(DType::kF32, values));
  EXPECT_TRUE(CompressMessage(&m, r, o, &held, key, st).ok());
  return m;
}

TEST(Compress, LosslessRoundTripOfEveryDTypeIsBitExact) {
  for (int threads : {1, 3}) {
    Message m;
    m.type = "model";
    m.params["k"] = int64_t{7};
    const DType all[] = {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64,
                         DType::kI32, DType::kI16, DType::kI8,  DType::kU8,   DType::kBool};
    uint32_t seed = 1;
    for (DType d : all) {
      // 300,001 elements: several chunks and a short last one.
      m.tensors.emplace(std::string(DTypeName(d)), Structured(d, 300001, seed++));
    }
    const Message original = m;
    CompressStats st;
    ASSERT_TRUE(CompressMessage(&m, {}, SmallChunks(threads), nullptr, 0, &st).ok());
    ASSERT_TRUE(m.params.count(kCodecParam));
    EXPECT_EQ(st.tensors, std::size(all));
    EXPECT_LT(st.encoded_bytes, st.raw_bytes);
    EXPECT_LT(m.payload_bytes(), original.payload_bytes());
    for (const auto& [name, t] : m.tensors) EXPECT_EQ(t.dtype, DType::kU8) << name;
    ASSERT_TRUE(DecompressMessage(&m, {}, SmallChunks(threads)).ok());
    EXPECT_FALSE(m.params.count(kCodecParam));
    EXPECT_EQ(m.params.at("k"), original.params.at("k"));
    ASSERT_EQ(m.tensors.size(), original.tensors.size());
    for (const auto& [name, t] : original.tensors) {
      EXPECT_TRUE(SameBytes(m.tensors.at(name), t)) << name << " threads " << threads;
    }
  }
}

TEST(Compress, SpecialFloatsSurviveLossless) {
  std::vector<float> v = Weights(100000, 3);
  v[0] = std::numeric_limits<float>::quiet_NaN();
  v[1] = std::numeric_limits<float>::infinity();
  v[2] = -0.0f;
  v[3] = std::numeric_limits<float>::denorm_min();
  uint32_t payload_nan = 0x7fa00001u;  // a signalling NaN with a payload
  std::memcpy(&v[4], &payload_nan, 4);
  Message m;
  m.tensors.emplace("w", TensorOf(DType::kF32, v));
  const Message original = m;
  // Lossy recipes keep a tensor with non-finite values lossless.
  for (Quant q : {Quant::kNone, Quant::kBF16, Quant::kFP16, Quant::kInt8}) {
    Message c = original;
    ASSERT_TRUE(CompressMessage(&c, {.quant = q}, {}).ok());
    ASSERT_TRUE(DecompressMessage(&c).ok());
    EXPECT_TRUE(SameBytes(c.tensors.at("w"), original.tensors.at("w"))) << QuantName(q);
  }
}

TEST(Compress, SmallAndIncompressibleTensorsTravelAsTheyAre) {
  std::mt19937_64 rng(5);
  std::vector<uint64_t> noise(1 << 16);
  for (auto& x : noise) x = rng();
  Message m;
  m.tensors.emplace(
      "noise", TensorOf(DType::kU8, std::vector<uint8_t>(reinterpret_cast<uint8_t*>(noise.data()),
                                                         reinterpret_cast<uint8_t*>(noise.data()) +
                                                             noise.size() * 8)));
  m.tensors.emplace("small", TensorOf(DType::kF32, std::vector<float>(100, 1.0f)));
  const Message original = m;
  ASSERT_TRUE(CompressMessage(&m, {}, {}).ok());
  EXPECT_FALSE(m.params.count(kCodecParam));
  for (const auto& [name, t] : original.tensors) EXPECT_TRUE(SameBytes(m.tensors.at(name), t));
  // Compressing twice is refused rather than nested.
  Message twice;
  twice.tensors.emplace("w", TensorOf(DType::kF32, std::vector<float>(1 << 16, 0.5f)));
  ASSERT_TRUE(CompressMessage(&twice, {}, {}).ok());
  EXPECT_EQ(CompressMessage(&twice, {}, {}).code(), StatusCode::kInvalidArgument);
}

// Every decoded value within QuantErrorBound of its original.
void ExpectWithinBound(Quant q, const std::vector<float>& x, const Tensor& got, uint32_t block) {
  ASSERT_EQ(got.dtype, DType::kF32);
  ASSERT_EQ(got.nbytes(), x.size() * 4);
  const float* y = Floats(got);
  double worst = 0;  // error / bound
  for (size_t b0 = 0; b0 < x.size(); b0 += block) {
    float amax = 0;
    const size_t end = std::min(x.size(), b0 + block);
    for (size_t i = b0; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
    for (size_t i = b0; i < end; ++i) {
      const double err = std::fabs(static_cast<double>(y[i]) - x[i]);
      const double bound = QuantErrorBound(q, x[i], amax);
      ASSERT_LE(err, bound) << QuantName(q) << " value " << i << ": " << x[i] << " -> " << y[i];
      if (bound > 0) worst = std::max(worst, err / bound);
    }
  }
  // The bound is tight: some value comes within a factor 2 of it.
  EXPECT_GT(worst, 0.5) << QuantName(q);
}

TEST(Compress, LossyCodecsStayWithinTheirDocumentedBounds) {
  std::vector<float> x = Weights(200003, 11);
  // A spread of magnitudes, including fp16 subnormals and bf16-only range.
  for (size_t i = 0; i < 1000; ++i) x[i] *= std::ldexp(1.0f, static_cast<int>(i % 40) - 30);
  for (uint32_t block : {64u, 256u, 4096u}) {
    for (Quant q : {Quant::kBF16, Quant::kFP16, Quant::kInt8}) {
      if (q != Quant::kInt8 && block != 256) continue;
      for (bool zstd : {true, false}) {
        Message m;
        m.tensors.emplace("w", TensorOf(DType::kF32, x));
        CompressOptions o = SmallChunks(2);
        o.int8_block = block;
        CompressStats st;
        ASSERT_TRUE(CompressMessage(&m, {.quant = q, .zstd = zstd}, o, nullptr, 0, &st).ok());
        const Json table = TableOf(m);
        EXPECT_EQ(table["t"]["w"]["q"], QuantName(q));
        const double ideal = q == Quant::kInt8 ? (1 + 4.0 / block) / 4 : 0.5;
        EXPECT_LE(st.ratio(), ideal + 1e-3) << QuantName(q) << " zstd " << zstd;
        ASSERT_TRUE(DecompressMessage(&m, {}, o).ok());
        ExpectWithinBound(q, x, m.tensors.at("w"), block);
      }
    }
  }
}

TEST(Compress, Fp16FallsBackToBf16BeyondTheHalfRange) {
  std::vector<float> x = Weights(70000, 13);
  x[17] = 1e6f;  // beyond 65504
  Message m;
  m.tensors.emplace("w", TensorOf(DType::kF32, x));
  ASSERT_TRUE(CompressMessage(&m, {.quant = Quant::kFP16}, {}).ok());
  EXPECT_EQ(TableOf(m)["t"]["w"]["q"], "bf16");
  ASSERT_TRUE(DecompressMessage(&m).ok());
  ExpectWithinBound(Quant::kBF16, x, m.tensors.at("w"), 256);
}

// The caller learns which tensors were decoded (each into a Buffer only
// the message holds, which it may change in place) and which travelled
// as they were, sharing the sender's Buffer.
TEST(Compress, DecompressNamesTheTensorsItDecoded) {
  std::vector<float> x = Weights(70000, 21);
  Message m;
  m.tensors.emplace("w", TensorOf(DType::kF32, x));
  m.tensors.emplace("bias", TensorOf(DType::kF32, Weights(10, 22)));  // under min_tensor_bytes
  ASSERT_TRUE(CompressMessage(&m, {.quant = Quant::kBF16}, {}).ok());
  const uint8_t* bias = m.tensors.at("bias").data.data();
  std::vector<std::string> decoded = {"stale"};
  ASSERT_TRUE(DecompressMessage(&m, {}, {}, &decoded).ok());
  EXPECT_EQ(decoded, std::vector<std::string>{"w"});
  EXPECT_EQ(m.tensors.at("bias").data.data(), bias) << "left as it came";
  EXPECT_EQ(m.tensors.at("w").nbytes(), x.size() * 4);
  // Without a table nothing is decoded, and the list says so.
  ASSERT_TRUE(DecompressMessage(&m, {}, {}, &decoded).ok());
  EXPECT_TRUE(decoded.empty());
}

TEST(Compress, LossyRecipesLeaveOtherDTypesLossless) {
  Message m;
  m.tensors.emplace("steps", Structured(DType::kI64, 20000, 17));
  m.tensors.emplace("half", Structured(DType::kF16, 80000, 19));
  const Message original = m;
  ASSERT_TRUE(CompressMessage(&m, {.quant = Quant::kInt8}, {}).ok());
  const auto table = TableOf(m);  // the range below must not iterate a temporary
  for (const auto& [name, entry] : table["t"].items()) EXPECT_EQ(entry["q"], "none") << name;
  ASSERT_TRUE(DecompressMessage(&m).ok());
  for (const auto& [name, t] : original.tensors) EXPECT_TRUE(SameBytes(m.tensors.at(name), t));
}

TEST(Compress, LosslessDeltaIsExactAndSmallerThanTheTensorAlone) {
  const std::vector<float> base = Weights(250000, 23);
  const std::vector<float> next = Stepped(base, 29, 1e-4f);
  TensorMap reference;
  reference.emplace("w", TensorOf(DType::kF32, base));
  Message plain, delta;
  plain.tensors.emplace("w", TensorOf(DType::kF32, next));
  delta.tensors = plain.tensors;
  CompressStats ps, ds;
  ASSERT_TRUE(CompressMessage(&plain, {}, {}, nullptr, 0, &ps).ok());
  ASSERT_TRUE(CompressMessage(&delta, {.delta = true}, {}, &reference, 4, &ds).ok());
  EXPECT_LT(ds.encoded_bytes, ps.encoded_bytes);
  const Json table = TableOf(delta);
  EXPECT_EQ(table["ref"], 4);
  EXPECT_EQ(table["t"]["w"]["d"], true);
  int64_t asked = -1;
  ASSERT_TRUE(DecompressMessage(&delta, [&](int64_t key) {
                asked = key;
                return &reference;
              }).ok());
  EXPECT_EQ(asked, 4);
  EXPECT_TRUE(SameBytes(delta.tensors.at("w"), TensorOf(DType::kF32, next)));
}

TEST(Compress, LossyDeltaIsBoundedByTheDifference) {
  const std::vector<float> base = Weights(100000, 31);
  std::vector<float> next = base;
  for (size_t i = 0; i < next.size(); ++i) next[i] += 1e-3f * std::sin(static_cast<float>(i));
  TensorMap reference;
  reference.emplace("w", TensorOf(DType::kF32, base));
  for (Quant q : {Quant::kBF16, Quant::kFP16, Quant::kInt8}) {
    Message m;
    m.tensors.emplace("w", TensorOf(DType::kF32, next));
    ASSERT_TRUE(CompressMessage(&m, {.quant = q, .delta = true}, {}, &reference, 1).ok());
    ASSERT_TRUE(DecompressMessage(&m, [&](int64_t) { return &reference; }).ok());
    const float* y = Floats(m.tensors.at("w"));
    for (size_t b0 = 0; b0 < next.size(); b0 += 256) {
      float amax = 0;
      const size_t end = std::min(next.size(), b0 + 256);
      for (size_t i = b0; i < end; ++i) amax = std::max(amax, std::fabs(next[i] - base[i]));
      for (size_t i = b0; i < end; ++i) {
        const float d = next[i] - base[i];
        const double bound = QuantErrorBound(q, d, amax) +
                             std::fabs(static_cast<double>(next[i])) * 0x1p-24 + 0x1p-149;
        ASSERT_LE(std::fabs(static_cast<double>(y[i]) - next[i]), bound) << QuantName(q) << i;
      }
    }
  }
}

// An update made from a cast of ours decodes onto our own tensors: a
// lossy difference is added to `onto`'s tensor instead of the reference's
// (which is still the one checked), so the result is ours plus the change
// within the codec's bound; a lossless (XOR) tensor, and one `onto` lacks,
// decode against the reference as before.
TEST(Compress, ALossyChangeDecodesOntoAnotherBase) {
  const size_t n = 100000;
  const std::vector<float> ours = Weights(n, 81);
  std::vector<float> cast(n);
  for (size_t i = 0; i < n; ++i) cast[i] = ours[i] + 1e-3f * std::sin(float(i));  // "its cast"
  const std::vector<float> update = Stepped(cast, 82, 1e-3f);
  TensorMap reference, mine;
  for (const char* name : {"a", "b", "c"}) reference.emplace(name, TensorOf(DType::kF32, cast));
  mine.emplace("a", TensorOf(DType::kF32, ours));
  mine.emplace("c", TensorOf(DType::kF32, Weights(n / 2, 83)));  // not the same shape
  for (Quant q : {Quant::kInt8, Quant::kBF16, Quant::kNone}) {
    SCOPED_TRACE(std::string(QuantName(q)));
    Message m;
    for (const char* name : {"a", "b", "c"}) m.tensors.emplace(name, TensorOf(DType::kF32, update));
    ASSERT_TRUE(CompressMessage(&m, {.quant = q, .zstd = true, .delta = true}, SmallChunks(2),
                                &reference, 4)
                    .ok());
    std::vector<std::string> decoded, moved;
    int64_t asked = -1;
    ASSERT_TRUE(DecompressMessage(
                    &m, [&](int64_t) { return &reference; }, SmallChunks(2), &decoded,
                    [&](int64_t key) {
                      asked = key;
                      return &mine;
                    },
                    &moved)
                    .ok());
    EXPECT_EQ(decoded.size(), 3u);
    if (q == Quant::kNone) {
      EXPECT_TRUE(moved.empty());
      for (const char* name : {"a", "b", "c"}) {
        EXPECT_EQ(std::memcmp(m.tensors.at(name).data.data(), update.data(), n * 4), 0) << name;
      }
      continue;
    }
    EXPECT_EQ(asked, 4);
    EXPECT_EQ(moved, std::vector<std::string>{"a"});
    const float* a = Floats(m.tensors.at("a"));
    const float* b = Floats(m.tensors.at("b"));
    const size_t block = 256;
    for (size_t b0 = 0; b0 < n; b0 += block) {
      float absmax = 0;
      for (size_t i = b0; i < std::min(n, b0 + block); ++i) {
        absmax = std::max(absmax, std::fabs(update[i] - cast[i]));
      }
      for (size_t i = b0; i < std::min(n, b0 + block); ++i) {
        const float d = update[i] - cast[i];
        const double bound = QuantErrorBound(q, d, absmax) + std::fabs(double(a[i])) * 0x1p-23;
        ASSERT_LE(std::fabs(double(a[i]) - (double(ours[i]) + double(d))), bound) << i;
        ASSERT_LE(std::fabs(double(b[i]) - (double(cast[i]) + double(d))),
                  QuantErrorBound(q, d, absmax) + std::fabs(double(b[i])) * 0x1p-23)
            << i;
      }
    }
  }
  // A delta on the values' scale (a next model's) decodes to the cast of
  // the values themselves: never onto another base.
  Message vs;
  vs.tensors.emplace("a", TensorOf(DType::kF32, update));
  ASSERT_TRUE(CompressMessage(&vs, {.quant = Quant::kInt8, .delta = true, .value_scale = true},
                              SmallChunks(2), &reference, 4)
                  .ok());
  std::vector<std::string> decoded, moved;
  ASSERT_TRUE(DecompressMessage(
                  &vs, [&](int64_t) { return &reference; }, SmallChunks(2), &decoded,
                  [&](int64_t) { return &mine; }, &moved)
                  .ok());
  EXPECT_EQ(decoded, std::vector<std::string>{"a"});
  EXPECT_TRUE(moved.empty());
}

// A next model sent as an int8 delta from the receivers' int8 cast of the
// last one: on the values' scale it keeps the bound of a whole int8 cast
// of the new values, in a fraction of a whole cast's bytes; a block whose
// change exceeds 127 of the values' steps, or whose values are all zero,
// goes whole.
TEST(Compress, AnInt8DeltaOnTheValuesScaleKeepsAWholeCastsBound) {
  const size_t n = 1 << 18;
  const std::vector<float> model = Weights(n, 61);
  CompressOptions o = SmallChunks(2);
  // What the receivers hold: their decoded int8 cast of the last model.
  TensorMap held;
  held.emplace("w", TensorOf(DType::kF32, DecodedCast(model, Quant::kInt8, o)));
  const float* h = Floats(held.at("w"));
  std::vector<float> next = Stepped(model, 67, 2e-4f);     // a round's change
  for (size_t i = 512; i < 768; ++i) next[i] = -2 * h[i];  // block 2: beyond 127 steps
  for (size_t i = 1024; i < 1280; ++i) next[i] = 0;        // block 4: all zero
  auto encode = [&](const TensorRecipe& r, CompressStats* st) {
    return EncodedAgainst(next, r, o, held, 9, st);
  };
  CompressStats whole, diff_scale, value_scale;
  encode({.quant = Quant::kInt8}, &whole);
  EXPECT_EQ(TableOf(encode({.quant = Quant::kInt8, .delta = true}, &diff_scale))["v"], 1)
      << "a table without the values' scale stays version 1";
  Message m = encode({.quant = Quant::kInt8, .delta = true, .value_scale = true}, &value_scale);
  const Json table = TableOf(m);
  EXPECT_EQ(table["v"], 2);
  EXPECT_EQ(table["t"]["w"]["vs"], true);
  EXPECT_EQ(table["ref"], 9);
  // Fewer bytes than a whole cast and than a delta on its own scale
  // (whose codes spread the last cast's error over all 255 values).
  EXPECT_LT(value_scale.encoded_bytes * 2, whole.encoded_bytes)
      << value_scale.encoded_bytes << " vs " << whole.encoded_bytes;
  EXPECT_LT(value_scale.encoded_bytes * 2, diff_scale.encoded_bytes)
      << value_scale.encoded_bytes << " vs " << diff_scale.encoded_bytes;
  // A version 1 table, or a "vs" that is no boolean, is refused.
  for (auto edit : {+[](Json& j) { j["v"] = 1; }, +[](Json& j) { j["t"]["w"]["vs"] = 1; }}) {
    Message bad = m;
    Json j = table;
    edit(j);
    bad.params[kCodecParam] = j.dump();
    Status s = DecompressMessage(
        &bad, [&](int64_t) { return &held; }, o);
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << j.dump().substr(0, 80) << ": " << s.ToString();
  }
  ASSERT_TRUE(DecompressMessage(
                  &m, [&](int64_t) { return &held; }, o)
                  .ok());
  const float* y = Floats(m.tensors.at("w"));
  size_t moved = 0;
  for (size_t b0 = 0; b0 < n; b0 += 256) {
    float amax = 0;
    for (size_t i = b0; i < b0 + 256; ++i) amax = std::max(amax, std::fabs(next[i]));
    for (size_t i = b0; i < b0 + 256; ++i) {
      const double bound = QuantErrorBound(Quant::kInt8, next[i], amax) +
                           std::fabs(static_cast<double>(next[i])) * 0x1p-24 + 0x1p-149;
      ASSERT_LE(std::fabs(static_cast<double>(y[i]) - next[i]), bound) << i;
      moved += y[i] != h[i];
    }
  }
  for (size_t i = 1024; i < 1280; ++i) ASSERT_EQ(y[i], 0.0f) << i;
  EXPECT_GT(moved, 512u);  // not just the whole blocks: changes reach the receiver
}

// bf16 and fp16 deltas on the values' scale send how many codes each
// value's cast moved from the reference's: the receiver gets the whole
// cast of the new values bit for bit, in fewer bytes than the cast whole
// or the cast of the difference, whatever its reference (a cast of the
// last model, or values no cast would give, far or of the other sign).
TEST(Compress, AHalfDeltaOnTheValuesScaleDecodesToTheWholeCast) {
  const size_t n = 1 << 18;
  const std::vector<float> model = Weights(n, 71);
  const CompressOptions o = SmallChunks(2);
  for (Quant q : {Quant::kBF16, Quant::kFP16}) {
    std::vector<float> ref = DecodedCast(model, q, o);
    for (size_t i = 0; i < 1000; ++i) ref[i] = -3 * ref[i] + 1e-7f;  // far, not a cast
    TensorMap held;
    held.emplace("w", TensorOf(DType::kF32, ref));
    const std::vector<float> next = Stepped(model, 73, 1e-4f);
    auto encode = [&](const TensorRecipe& r, CompressStats* st) {
      return EncodedAgainst(next, r, o, held, 3, st);
    };
    CompressStats whole_st, diff_st, values_st;
    Message whole = encode({.quant = q}, &whole_st);
    encode({.quant = q, .delta = true}, &diff_st);
    Message m = encode({.quant = q, .delta = true, .value_scale = true}, &values_st);
    EXPECT_EQ(TableOf(m)["v"], 2);
    EXPECT_EQ(TableOf(m)["t"]["w"]["vs"], true);
    EXPECT_LT(values_st.encoded_bytes * 2, whole_st.encoded_bytes)
        << QuantName(q) << ": " << values_st.encoded_bytes << " vs " << whole_st.encoded_bytes;
    EXPECT_LT(values_st.encoded_bytes * 2, diff_st.encoded_bytes)
        << QuantName(q) << ": " << values_st.encoded_bytes << " vs " << diff_st.encoded_bytes;
    ASSERT_TRUE(DecompressMessage(&whole, nullptr, o).ok());
    ASSERT_TRUE(DecompressMessage(
                    &m, [&](int64_t) { return &held; }, o)
                    .ok());
    EXPECT_TRUE(SameBytes(m.tensors.at("w"), whole.tensors.at("w"))) << QuantName(q);
  }
  // A value beyond fp16's range, whose difference from the reference is
  // within it: cast on the values' scale, it goes bf16 (fp16 would be inf).
  std::vector<float> big = model, big_ref = model;
  big[7] = 70000.0f;
  big_ref[7] = 69990.0f;
  TensorMap held;
  held.emplace("w", TensorOf(DType::kF32, big_ref));
  Message m;
  m.tensors.emplace("w", TensorOf(DType::kF32, big));
  ASSERT_TRUE(
      CompressMessage(&m, {.quant = Quant::kFP16, .delta = true, .value_scale = true}, o, &held, 3)
          .ok());
  EXPECT_EQ(TableOf(m)["t"]["w"]["q"], "bf16");
  ASSERT_TRUE(DecompressMessage(
                  &m, [&](int64_t) { return &held; }, o)
                  .ok());
  EXPECT_NEAR(Floats(m.tensors.at("w"))[7], 70000.0f, 70000.0 * 0x1p-8);
}

// int8 rounds x / scale to the nearest integer, ties to even: with the
// block's absmax 127 the scale is 1, so the halves show the rounding.
TEST(Compress, Int8RoundsHalvesToEven) {
  const std::vector<float> halves = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f};
  const std::vector<float> rounded = {0.0f, 2.0f, 2.0f, 0.0f, -2.0f, -2.0f, 126.0f, -126.0f};
  std::vector<float> v(64 << 10, 0.25f);  // 0.25 -> 0
  v[0] = 127.0f;
  std::copy(halves.begin(), halves.end(), v.begin() + 1);
  Message m;
  m.tensors.emplace("w", TensorOf(DType::kF32, v));
  CompressOptions o;
  o.int8_block = 64;
  ASSERT_TRUE(CompressMessage(&m, {.quant = Quant::kInt8}, o).ok());
  ASSERT_TRUE(DecompressMessage(&m, nullptr, o).ok());
  const float* y = Floats(m.tensors.at("w"));
  EXPECT_EQ(y[0], 127.0f);
  for (size_t i = 0; i < halves.size(); ++i) EXPECT_EQ(y[i + 1], rounded[i]) << halves[i];
  EXPECT_EQ(y[halves.size() + 1], 0.0f);
}

// A lossy delta needs finite values, a finite reference and a finite
// difference; otherwise the tensor goes lossless, bit for bit.
TEST(Compress, ALossyDeltaOfNonFiniteValuesGoesLossless) {
  const std::vector<float> base = Weights(100000, 37);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float big = std::numeric_limits<float>::max();
  struct Case {
    const char* what;
    size_t at;
    float value, ref;
  };
  for (const Case& c :
       {Case{"inf value", 10, inf, 0.0f}, Case{"nan value", 99999, nan, 0.0f},
        Case{"inf reference", 500, 0.0f, -inf}, Case{"nan reference", 501, 0.0f, nan},
        Case{"overflowing difference", 7, big, -big}}) {
    SCOPED_TRACE(c.what);
    std::vector<float> next = Stepped(base, 38, 1e-3f), ref = base;
    next[c.at] = c.value;
    ref[c.at] = c.ref;
    TensorMap reference;
    reference.emplace("w", TensorOf(DType::kF32, ref));
    // (int8 finds out as it encodes, on several threads, then encodes the
    // tensor again losslessly; the others scan first.)
    for (Quant q : {Quant::kBF16, Quant::kInt8}) {
      for (bool value_scale : {false, true}) {
        Message m;
        m.tensors.emplace("w", TensorOf(DType::kF32, next));
        const Tensor sent = m.tensors.at("w");
        const TensorRecipe recipe{
            .quant = q, .zstd = true, .delta = true, .value_scale = value_scale};
        ASSERT_TRUE(CompressMessage(&m, recipe, SmallChunks(2), &reference, 1).ok());
        EXPECT_EQ(TableOf(m)["t"]["w"]["q"], "none") << QuantName(q);
        ASSERT_TRUE(DecompressMessage(&m, [&](int64_t) { return &reference; }).ok());
        EXPECT_TRUE(SameBytes(m.tensors.at("w"), sent)) << QuantName(q) << " " << value_scale;
      }
    }
  }
}

// The message's payload bytes (safetensors payload order), concatenated.
std::string PayloadBytes(const TensorMap& tensors) {
  std::string out;
  for (const auto* e : PayloadOrder(tensors)) out.append(e->second.data.view());
  return out;
}

std::vector<const Tensor*> InPayloadOrder(const TensorMap& tensors) {
  std::vector<const Tensor*> order;
  for (const auto* e : PayloadOrder(tensors)) order.push_back(&e->second);
  return order;
}

// A stream gets the encoded message's payload in payload order, the first
// chunk before the next is encoded, and the bytes it handed out are the
// final tensors' own.
TEST(Compress, AStreamGetsThePayloadChunkByChunkInPayloadOrder) {
  const std::vector<float> base = Weights(200000, 51);
  TensorMap reference;
  reference.emplace("b.weight", TensorOf(DType::kF32, base));
  for (Quant q : {Quant::kNone, Quant::kBF16, Quant::kInt8}) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(QuantName(q)) + " on " + std::to_string(threads) + " threads");
      Message m;
      // Payload order is by dtype size, the encoded tensors counting as
      // U8, then by name: c.steps (I64), a.bias (F32, small: as it is),
      // then b.weight, d.weight (encoded) and e.mask (U8, as it is).
      m.tensors.emplace("a.bias", TensorOf(DType::kF32, Weights(100, 52)));
      m.tensors.emplace("b.weight", TensorOf(DType::kF32, Stepped(base, 53, 1e-3f)));
      m.tensors.emplace("c.steps", TensorOf(DType::kI64, std::vector<int64_t>{7, 8, 9}));
      m.tensors.emplace("d.weight", TensorOf(DType::kF32, Weights(150000, 54)));
      m.tensors.emplace("e.mask", TensorOf(DType::kU8, std::vector<uint8_t>(300, 1)));
      m.tensors.emplace("f.empty", TensorOf(DType::kF32, std::vector<float>{}));
      const TensorMap sent = m.tensors;
      EncodeStream stream;
      std::vector<uint64_t> seen;
      stream.on_append = [&](uint64_t ready) { seen.push_back(ready); };
      const TensorRecipe recipe{.quant = q, .zstd = true, .delta = true};
      ASSERT_TRUE(CompressMessage(&m, recipe, SmallChunks(threads), &reference, 1, nullptr, nullptr,
                                  &stream)
                      .ok());
      stream.Finish(m);
      ASSERT_EQ(TableOf(m)["t"].size(), 2u);
      EXPECT_FALSE(stream.Now().abandoned);
      EXPECT_TRUE(stream.Holds(InPayloadOrder(m.tensors)));
      const std::string payload = PayloadBytes(m.tensors);
      ASSERT_EQ(stream.Now().ready, payload.size());
      auto all = stream.Range(0, payload.size()).Flatten();
      ASSERT_TRUE(all.ok());
      EXPECT_EQ(all->view(), payload);
      // A piece from the middle, across appends.
      auto mid = stream.Range(1000, 70000).Flatten();
      ASSERT_TRUE(mid.ok());
      EXPECT_EQ(mid->view(), payload.substr(1000, 70000));
      // The three tensors as they are, and chunk after chunk (each a
      // separate append): 2 tensors of 800 KB and 600 KB in 64 KiB chunks.
      EXPECT_GE(seen.size(), 3u + 13u + 10u);
      EXPECT_EQ(seen.back(), payload.size());
      auto taken = stream.TakeMessage();
      ASSERT_TRUE(taken.ok());
      ASSERT_TRUE(DecompressMessage(&*taken, [&](int64_t) { return &reference; }).ok());
      EXPECT_TRUE(SameBytes(taken->tensors.at("a.bias"), sent.at("a.bias")));
      EXPECT_TRUE(SameBytes(taken->tensors.at("c.steps"), sent.at("c.steps")));
      if (q == Quant::kNone) {
        EXPECT_TRUE(SameBytes(taken->tensors.at("d.weight"), sent.at("d.weight")));
      }
    }
  }
}

// A tensor that does not go as planned abandons the stream: one that did
// not get smaller, and a lossy delta that was not finite (encoded again
// losslessly); the message itself is still right.
TEST(Compress, AStreamIsAbandonedWhenATensorGoesAnotherWay) {
  {
    Message m;
    std::vector<uint32_t> noise(100000);
    std::mt19937 rng(61);
    for (auto& x : noise) x = rng();
    m.tensors.emplace("w", TensorOf(DType::kI32, noise));
    const Tensor sent = m.tensors.at("w");
    EncodeStream stream;
    ASSERT_TRUE(
        CompressMessage(&m, {.zstd = true}, SmallChunks(2), nullptr, 0, nullptr, nullptr, &stream)
            .ok());
    EXPECT_TRUE(stream.Now().abandoned);
    EXPECT_EQ(m.params.count(kCodecParam), 0u);
    EXPECT_TRUE(SameBytes(m.tensors.at("w"), sent));
    EXPECT_FALSE(stream.Holds(InPayloadOrder(m.tensors)));
  }
  {
    const std::vector<float> base = Weights(100000, 62);
    std::vector<float> next = Stepped(base, 63, 1e-3f);
    next[90000] = std::numeric_limits<float>::infinity();  // late: chunks went out before it
    TensorMap reference;
    reference.emplace("w", TensorOf(DType::kF32, base));
    Message m;
    m.tensors.emplace("w", TensorOf(DType::kF32, next));
    const Tensor sent = m.tensors.at("w");
    EncodeStream stream;
    const TensorRecipe recipe{.quant = Quant::kInt8, .zstd = true, .delta = true};
    ASSERT_TRUE(
        CompressMessage(&m, recipe, SmallChunks(1), &reference, 1, nullptr, nullptr, &stream).ok());
    EXPECT_TRUE(stream.Now().abandoned);
    EXPECT_GT(stream.Now().ready, 0u);
    EXPECT_EQ(TableOf(m)["t"]["w"]["q"], "none");
    ASSERT_TRUE(DecompressMessage(&m, [&](int64_t) { return &reference; }).ok());
    EXPECT_TRUE(SameBytes(m.tensors.at("w"), sent));
  }
}

// Top-k keeps the largest changes exactly and leaves every other value
// at the reference's own bits; the residual is what the receiver lacks.
TEST(Compress, TopKKeepsTheLargestChangesExactlyAndTheResidualHoldsTheRest) {
  const std::vector<float> base = Weights(200000, 41);
  const std::vector<float> next = Stepped(base, 43, 1e-3f);
  TensorMap reference, residual;
  reference.emplace("w", TensorOf(DType::kF32, base));
  Message m;
  m.tensors.emplace("w", TensorOf(DType::kF32, next));
  CompressStats st;
  ASSERT_TRUE(CompressMessage(&m, {.delta = true, .topk = 0.02}, SmallChunks(2), &reference, 7, &st,
                              &residual)
                  .ok());
  const Json table = TableOf(m);
  EXPECT_EQ(table["t"]["w"]["topk"], 0.02);
  EXPECT_EQ(table["t"]["w"]["q"], "none");
  // About 2% of the values, each a few bytes after zstd.
  EXPECT_LT(st.ratio(), 0.08) << st.encoded_bytes;
  ASSERT_TRUE(DecompressMessage(&m, [&](int64_t) { return &reference; }).ok());
  ASSERT_EQ(residual.count("w"), 1u);
  const float* y = Floats(m.tensors.at("w"));
  const float* e = Floats(residual.at("w"));
  size_t kept = 0;
  float least_kept = std::numeric_limits<float>::infinity(), most_dropped = 0;
  for (size_t i = 0; i < next.size(); ++i) {
    const float d = next[i] - base[i];
    if (std::memcmp(&y[i], &base[i], 4) == 0 && d != 0) {
      most_dropped = std::max(most_dropped, std::fabs(d));
    } else {
      ASSERT_EQ(y[i], base[i] + d) << i;  // kept: exactly what the sender computed
      least_kept = std::min(least_kept, std::fabs(d));
      ++kept;
    }
    ASSERT_EQ(e[i], next[i] - y[i]) << i;
  }
  EXPECT_GE(least_kept, most_dropped);
  // The threshold comes from a sample: about 2%.
  EXPECT_GT(kept, next.size() * 15 / 1000);
  EXPECT_LT(kept, next.size() * 25 / 1000);
}

// With error feedback, what one update drops rides on the next ones: the
// changes delivered plus the residual add up to every change made, and
// the same repeated change reaches most values, where without feedback
// the same tenth is sent every time.
TEST(Compress, ErrorFeedbackDeliversWhatTopKDropped) {
  const std::vector<float> base = Weights(50000, 47);
  const std::vector<float> next = Stepped(base, 53, 1e-3f);
  TensorMap reference;
  reference.emplace("w", TensorOf(DType::kF32, base));
  for (bool feedback : {true, false}) {
    TensorMap residual;
    std::vector<double> delivered(next.size(), 0);
    std::vector<bool> ever(next.size(), false);
    constexpr int kRounds = 30;
    for (int r = 0; r < kRounds; ++r) {
      Message m;
      m.tensors.emplace("w", TensorOf(DType::kF32, next));
      ASSERT_TRUE(CompressMessage(&m, {.delta = true, .topk = 0.1}, SmallChunks(2), &reference, 1,
                                  nullptr, feedback ? &residual : nullptr)
                      .ok());
      ASSERT_TRUE(DecompressMessage(&m, [&](int64_t) { return &reference; }).ok());
      const float* y = Floats(m.tensors.at("w"));
      for (size_t i = 0; i < next.size(); ++i) {
        delivered[i] += double(y[i]) - double(base[i]);
        if (y[i] != base[i]) ever[i] = true;
      }
    }
    const size_t reached = static_cast<size_t>(std::count(ever.begin(), ever.end(), true));
    if (feedback) {
      const float* e = Floats(residual.at("w"));
      for (size_t i = 0; i < next.size(); ++i) {
        const double made = kRounds * (double(next[i]) - double(base[i]));
        ASSERT_NEAR(delivered[i] + e[i], made, 1e-6) << i;
      }
      // 0.81 of them here after 30 rounds (the smallest changes need
      // many rounds to add up to the threshold), against 0.10 without.
      EXPECT_GT(reached, next.size() * 60 / 100);
    } else {
      EXPECT_LT(reached, next.size() * 12 / 100);
    }
  }
}

// Top-k with a cast on the kept changes: dropped values stay the
// reference's bits (a zero block quantizes to zero), kept ones are within
// the cast's bound, and the residual accounts for both.
TEST(Compress, TopKWithACastBoundsTheKeptAndAccountsForTheRest) {
  const std::vector<float> base = Weights(100000, 59);
  std::vector<float> next = base;
  for (size_t i = 0; i < next.size(); ++i) next[i] += 1e-3f * std::sin(0.37f * float(i));
  TensorMap reference;
  reference.emplace("w", TensorOf(DType::kF32, base));
  for (Quant q : {Quant::kBF16, Quant::kInt8}) {
    TensorMap residual;
    Message m;
    m.tensors.emplace("w", TensorOf(DType::kF32, next));
    ASSERT_TRUE(CompressMessage(&m, {.quant = q, .delta = true, .topk = 0.05}, SmallChunks(2),
                                &reference, 1, nullptr, &residual)
                    .ok());
    EXPECT_EQ(TableOf(m)["t"]["w"]["q"], QuantName(q));
    ASSERT_TRUE(DecompressMessage(&m, [&](int64_t) { return &reference; }).ok());
    const float* y = Floats(m.tensors.at("w"));
    const float* e = Floats(residual.at("w"));
    size_t at_reference = 0;
    for (size_t i = 0; i < next.size(); ++i) {
      if (std::memcmp(&y[i], &base[i], 4) == 0) ++at_reference;
      const double d = double(next[i]) - double(base[i]);
      // Kept: within the cast's bound of the change (2e-3 bounds every
      // block's absmax); dropped: the reference itself.
      ASSERT_TRUE(y[i] == base[i] || std::fabs(double(y[i]) - double(next[i])) <=
                                         QuantErrorBound(q, static_cast<float>(d), 2e-3f) + 1e-8)
          << QuantName(q) << " " << i;
      ASSERT_NEAR(double(y[i]) + double(e[i]), double(next[i]), 1e-8) << QuantName(q) << i;
    }
    EXPECT_GT(at_reference, next.size() * 90 / 100) << QuantName(q);
  }
}

// A tensor with a non-finite value, or with no reference, takes no top-k:
// it arrives exactly, and leaves no residual.
TEST(Compress, TopKSkipsNonFiniteTensorsAndTensorsWithoutAReference) {
  std::vector<float> base = Weights(70000, 61), next = base;
  for (auto& x : next) x += 1e-3f;
  next[123] = std::numeric_limits<float>::quiet_NaN();
  TensorMap reference, residual;
  reference.emplace("w", TensorOf(DType::kF32, base));
  Message m;
  m.tensors.emplace("w", TensorOf(DType::kF32, next));
  m.tensors.emplace("v", TensorOf(DType::kF32, Weights(70000, 67)));  // no reference
  const TensorMap sent = m.tensors;
  ASSERT_TRUE(
      CompressMessage(&m, {.delta = true, .topk = 0.01}, {}, &reference, 1, nullptr, &residual)
          .ok());
  ASSERT_TRUE(DecompressMessage(&m, [&](int64_t) { return &reference; }).ok());
  EXPECT_TRUE(SameBytes(m.tensors.at("w"), sent.at("w")));
  EXPECT_TRUE(SameBytes(m.tensors.at("v"), sent.at("v")));
  EXPECT_TRUE(residual.empty());
}

TEST(Compress, DeltaWithoutTheReferenceIsRefusedAndLeavesTheMessage) {
  TensorMap reference;
  reference.emplace("w", TensorOf(DType::kF32, Weights(70000, 37)));
  Message m;
  m.tensors.emplace("w", TensorOf(DType::kF32, Weights(70000, 41)));
  ASSERT_TRUE(CompressMessage(&m, {.delta = true}, {}, &reference, 9).ok());
  const Message sent = m;
  Status s = DecompressMessage(&m);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  s = DecompressMessage(&m, [](int64_t) { return nullptr; });
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  // A reference that differs from the sender's (another round's model).
  TensorMap other;
  other.emplace("w", TensorOf(DType::kF32, Weights(70000, 43)));
  s = DecompressMessage(&m, [&](int64_t) { return &other; });
  EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
  EXPECT_TRUE(m.params.count(kCodecParam));
  EXPECT_TRUE(SameBytes(m.tensors.at("w"), sent.tensors.at("w")));
}

class CompressCorrupt : public ::testing::Test {
 protected:
  void SetUp() override {
    m_.tensors.emplace("a", TensorOf(DType::kF32, Weights(200000, 47)));
    m_.tensors.emplace("b", Structured(DType::kI32, 100000, 53));
    ASSERT_TRUE(CompressMessage(&m_, {}, SmallChunks(2)).ok());
  }
  // Decoding `m` fails as Corrupt and leaves it unchanged.
  void ExpectCorrupt(Message m, const std::string& what) {
    const Message before = m;
    Status s = DecompressMessage(&m, {}, SmallChunks(2));
    EXPECT_EQ(s.code(), StatusCode::kCorrupt) << what << ": " << s.ToString();
    EXPECT_EQ(m.params, before.params) << what;
    for (const auto& [name, t] : before.tensors) EXPECT_TRUE(SameBytes(m.tensors.at(name), t));
  }
  Message WithTable(const Json& table) {
    Message m = m_;
    m.params[kCodecParam] = table.dump();
    return m;
  }
  Message m_;
};

TEST_F(CompressCorrupt, AFlippedByteInAnyChunkIsRefused) {
  const uint64_t n = m_.tensors.at("a").nbytes();
  for (uint64_t at : {uint64_t{0}, n / 3, n / 2, n - 1}) {
    Message m = m_;
    Tensor& t = m.tensors.at("a");
    Buffer copy = Buffer::CopyFrom(t.data.data(), t.nbytes());
    copy.mutable_data()[at] ^= 0x10;
    t.data = copy;
    ExpectCorrupt(m, "flip at " + std::to_string(at));
  }
}

TEST_F(CompressCorrupt, MalformedTablesAreRefused) {
  const Json good = TableOf(m_);
  ExpectCorrupt(WithTable(Json::array()), "not an object");
  Message text = m_;
  text.params[kCodecParam] = std::string("{\"v\":1,");
  ExpectCorrupt(text, "truncated json");
  Message number = m_;
  number.params[kCodecParam] = int64_t{1};
  ExpectCorrupt(number, "not a string");
  auto edit = [&](auto fn, const std::string& what) {
    Json j = good;
    fn(j);
    ExpectCorrupt(WithTable(j), what);
  };
  edit([](Json& j) { j["v"] = 3; }, "version");
  edit([](Json& j) { j["t"]["a"]["vs"] = true; }, "a values' scale in a version 1 table");
  edit(
      [](Json& j) {
        j["v"] = 2;
        j["t"]["a"]["vs"] = true;
      },
      "a values' scale without an int8 delta");
  edit([](Json& j) { j["t"]["missing"] = j["t"]["a"]; }, "names a tensor not there");
  edit([](Json& j) { j["t"]["a"]["chunks"].erase(0); }, "a chunk dropped");
  edit([](Json& j) { j["t"]["a"]["chunks"][0][0] = 1; }, "a chunk length");
  edit([](Json& j) { j["t"]["a"]["chunks"][1][2] = 12345; }, "a checksum");
  edit([](Json& j) { j["t"]["a"]["shape"] = Json::array({1, -1}); }, "a negative dim");
  edit([](Json& j) { j["t"]["a"]["shape"] = Json::array({1ll << 40, 1ll << 20}); }, "huge shape");
  edit([](Json& j) { j["t"]["a"]["ce"] = 0; }, "zero chunk");
  edit([](Json& j) { j["t"]["a"]["dtype"] = "F33"; }, "dtype");
  edit([](Json& j) { j["t"]["a"]["q"] = "int4"; }, "quantization");
  edit([](Json& j) { j["t"]["b"]["q"] = "bf16"; }, "lossy on an integer tensor");
  edit([](Json& j) { j["t"]["a"]["q"] = "int8"; }, "int8 without a block");
  edit([](Json& j) { j["t"]["a"]["d"] = true; }, "delta without a reference");
  edit([](Json& j) { j["t"]["a"]["chunks"][0] = "x"; }, "a chunk not an array");
  // The encoded tensor must be the U8 the table describes.
  Message wrong = m_;
  wrong.tensors.at("a").dtype = DType::kI8;
  ExpectCorrupt(wrong, "encoded tensor's dtype");
}

TEST(Compress, EstimateSeesCompressibility) {
  Message weights;
  weights.tensors.emplace("w", TensorOf(DType::kF32, Weights(1 << 20, 59)));
  std::mt19937_64 rng(61);
  std::vector<uint64_t> noise(1 << 19);
  for (auto& x : noise) x = rng();
  TensorMap random;
  random.emplace("n", *Tensor::Make(DType::kU8, {static_cast<int64_t>(noise.size() * 8)},
                                    Buffer::CopyFrom(noise.data(), noise.size() * 8)));
  const CodecEstimate w = EstimateCodec(weights.tensors, {}, {});
  const CodecEstimate r = EstimateCodec(random, {}, {});
  const CodecEstimate q = EstimateCodec(weights.tensors, {.quant = Quant::kInt8}, {});
  EXPECT_GT(w.sampled_bytes, 0u);
  EXPECT_LT(w.ratio, 0.97);   // shuffled float exponents compress
  EXPECT_GE(r.ratio, 0.999);  // noise does not
  EXPECT_LT(q.ratio, 0.27);
  EXPECT_GT(w.encode_Bps, 0);
  EXPECT_GT(w.decode_Bps, 0);
  // One thread's CPU time over an interval is at most its wall time (the
  // two clocks are read a few calls apart: 50 us of slack).
  for (const CodecEstimate* e : {&w, &r, &q}) {
    const double bytes = static_cast<double>(e->sampled_bytes);
    ASSERT_GT(e->encode_cpu_Bps, 0);
    ASSERT_GT(e->decode_cpu_Bps, 0);
    EXPECT_LE(bytes / e->encode_cpu_Bps, bytes / e->encode_Bps + 50e-6);
    EXPECT_LE(bytes / e->decode_cpu_Bps, bytes / e->decode_Bps + 50e-6);
  }
  // And the estimate agrees with a full compression of the payload.
  CompressStats st;
  ASSERT_TRUE(CompressMessage(&weights, {}, {}, nullptr, 0, &st).ok());
  EXPECT_NEAR(w.ratio, st.ratio(), 0.02);
}

TEST(Compress, AnEstimateSaysWhetherItsDeltaHadAReference) {
  const std::vector<float> base = Weights(1 << 20, 63);
  Message update;
  update.tensors.emplace("w", TensorOf(DType::kF32, Stepped(base, 64, 1e-3f)));
  TensorMap same, other;
  same.emplace("w", TensorOf(DType::kF32, base));
  other.emplace("v", TensorOf(DType::kF32, base));
  const TensorRecipe delta{.delta = true};
  const CodecEstimate with = EstimateCodec(update.tensors, delta, {}, &same);
  const CodecEstimate without = EstimateCodec(update.tensors, delta, {}, &other);
  const CodecEstimate none = EstimateCodec(update.tensors, delta, {});
  EXPECT_TRUE(with.delta_sampled);
  EXPECT_FALSE(without.delta_sampled) << "no tensor of the reference has the update's name";
  EXPECT_FALSE(none.delta_sampled);
  EXPECT_FALSE(EstimateCodec(update.tensors, {}, {}, &same).delta_sampled) << "not a delta recipe";
  // The delta's ratio is the update's change, the other the whole tensor's.
  EXPECT_LT(with.ratio, without.ratio - 0.05);
}

// The finite scan and the correction of a cast run in pieces of 2^20
// values on several threads: what only a later piece holds must count.
TEST(Compress, ScansAndCorrectionsSeeEveryPieceOfALargeTensor) {
  const size_t n = (1u << 20) * 2 + 5;
  const std::vector<float> w = Weights(n, 67);
  for (size_t at : {size_t{1} << 20, n - 1}) {
    SCOPED_TRACE(at);
    // A value beyond fp16's range only there: fp16 falls back to bf16.
    std::vector<float> big = w;
    big[at] = 70000.0f;
    Message m;
    m.tensors.emplace("w", TensorOf(DType::kF32, big));
    ASSERT_TRUE(CompressMessage(&m, {.quant = Quant::kFP16}, {.threads = 2}).ok());
    const Json table = Json::parse(std::get<std::string>(m.params.at(kCodecParam)));
    EXPECT_EQ(table["t"]["w"]["q"], "bf16");
    // A NaN only there: the tensor goes lossless, bit for bit (int8 and
    // bf16 find it as they encode, fp16 by its scan).
    std::vector<float> nan = w;
    nan[at] = std::numeric_limits<float>::quiet_NaN();
    for (Quant quant : {Quant::kInt8, Quant::kBF16, Quant::kFP16}) {
      Message q;
      q.tensors.emplace("w", TensorOf(DType::kF32, nan));
      ASSERT_TRUE(CompressMessage(&q, {.quant = quant}, {.threads = 2}).ok());
      ASSERT_TRUE(DecompressMessage(&q).ok());
      EXPECT_EQ(std::memcmp(q.tensors.at("w").data.data(), nan.data(), n * 4), 0)
          << QuantName(quant);
    }
  }
  // update + (ours - cast), in place, against the sum value by value.
  const std::vector<float> ours = Weights(n, 68), cast = Weights(n, 69);
  std::vector<float> update = w, want(n);
  for (size_t i = 0; i < n; ++i) want[i] = w[i] + (ours[i] - cast[i]);
  AddDifference(update.data(), ours.data(), cast.data(), update.data(), n, 2);
  EXPECT_EQ(std::memcmp(update.data(), want.data(), n * 4), 0);
}

TEST(Compress, TensorOver2GiB) {
  // 2 GiB + 3 bytes of mostly zeros: 64-bit offsets and chunk counts.
  const uint64_t n = (2ull << 30) + 3;
  auto buf = Buffer::Allocate(n);
  ASSERT_TRUE(buf.ok());
  std::memset(buf->mutable_data(), 0, n);
  buf->mutable_data()[n - 1] = 42;
  buf->mutable_data()[1ull << 31] = 7;
  Message m;
  m.tensors.emplace("big", *Tensor::Make(DType::kU8, {static_cast<int64_t>(n)}, *buf));
  CompressStats st;
  ASSERT_TRUE(CompressMessage(&m, {}, {}, nullptr, 0, &st).ok());
  EXPECT_LT(st.encoded_bytes, n / 1000);
  ASSERT_TRUE(DecompressMessage(&m).ok());
  const Tensor& t = m.tensors.at("big");
  ASSERT_EQ(t.nbytes(), n);
  EXPECT_EQ(t.data.data()[n - 1], 42);
  EXPECT_EQ(t.data.data()[1ull << 31], 7);
  EXPECT_EQ(t.data.data()[n / 2], 0);
}

}  // namespace
}  // namespace xsilo
