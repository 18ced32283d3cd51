// What each update codec costs on this machine, idle: one F32 tensor of a
// model's size (Big by default) whose every value moved by normal(0, 1e-3)
// from a reference of normal(0, 0.05) weights, encoded as a delta against
// the reference and decoded back, by recipe (docs/compression.md); and
// the model itself without a delta (what a server's first broadcast of it
// takes).
//
//   compress_speed [--elements 66362880] [--repeats 3] [--threads 0]
//                  [--topk 0.01] [--json compress_speed.json]
//
// Top-k recipes keep their residual between repeats, as a client's
// successive updates do. The two "from a cast" rows time what a server
// does with an update made from the lossy cast it sent (the reference
// here) rather than from its own model: decode, then move the update onto
// its own tensors (AddDifference, "corrected after"), or decode the
// difference straight onto them (DecompressMessage's `onto`). Prints a
// table (min and max over the repeats) and writes JSON.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "xsilo/core/compress.h"

namespace {

using namespace xsilo;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// How an update made from a cast is brought onto the server's own model.
enum class Correct { kNone, kAfter, kOnto };

struct Recipe {
  std::string name;
  TensorRecipe recipe;
  Correct correct = Correct::kNone;
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t elements = 66362880;
  int repeats = 3;
  CompressOptions options;
  double topk = 0.01;
  std::string json_path = "compress_speed.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--elements") {
      elements = std::stoull(v);
    } else if (k == "--repeats") {
      repeats = std::max(1, std::stoi(v));
    } else if (k == "--threads") {
      options.threads = std::stoi(v);
    } else if (k == "--topk") {
      topk = std::stod(v);
    } else if (k == "--json") {
      json_path = v;
    } else {
      std::fprintf(stderr, "compress_speed: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "compress_speed: every option takes a value\n");
    return 2;
  }
  std::vector<float> base(elements), next(elements);
  std::mt19937 rng(1);
  std::normal_distribution<float> weight(0, 0.05f), step(0, 1e-3f);
  for (uint64_t i = 0; i < elements; ++i) {
    base[i] = weight(rng);
    next[i] = base[i] + step(rng);
  }
  TensorMap reference, ours;
  reference["w"] = *Tensor::Make(DType::kF32, {static_cast<int64_t>(elements)},
                                 Buffer::CopyFrom(base.data(), elements * 4));
  {
    // The server's own model, of which `reference` stands for the cast.
    std::vector<float> own(base);
    std::normal_distribution<float> cast_error(0, 1e-4f);
    for (auto& v : own) v += cast_error(rng);
    ours["w"] = *Tensor::Make(DType::kF32, {static_cast<int64_t>(elements)},
                              Buffer::CopyFrom(own.data(), elements * 4));
  }
  const std::string k = "top-" + std::to_string(topk).substr(0, 6);
  const std::vector<Recipe> recipes = {
      {"lossless delta", {Quant::kNone, true, true, 0}},
      {"bf16+zstd delta", {Quant::kBF16, true, true, 0}},
      {"int8+zstd delta", {Quant::kInt8, true, true, 0}},
      {"lossless " + k + " delta", {Quant::kNone, true, true, topk}},
      {"int8+zstd " + k + " delta", {Quant::kInt8, true, true, topk}},
      {"lossless model", {Quant::kNone, true, false, 0}},
      {"bf16+zstd model", {Quant::kBF16, true, false, 0}},
      {"int8+zstd model", {Quant::kInt8, true, false, 0}},
      {"int8+zstd from a cast, corrected after", {Quant::kInt8, true, true, 0}, Correct::kAfter},
      {"int8+zstd from a cast, onto ours", {Quant::kInt8, true, true, 0}, Correct::kOnto},
  };
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-40s %8s %18s %18s\n", "recipe", "ratio", "encode ms", "decode ms");
  for (const auto& r : recipes) {
    TensorMap residual;
    std::vector<double> enc, dec, ratio;
    for (int i = 0; i < repeats; ++i) {
      Message m;
      m.tensors["w"] = *Tensor::Make(DType::kF32, {static_cast<int64_t>(elements)},
                                     Buffer::CopyFrom(next.data(), elements * 4));
      CompressStats st;
      const auto t0 = Clock::now();
      Status s = CompressMessage(&m, r.recipe, options, &reference, 1, &st, &residual);
      const auto t1 = Clock::now();
      if (s.ok()) {
        std::vector<std::string> decoded, moved;
        ReferenceLookup onto;
        if (r.correct == Correct::kOnto) onto = [&](int64_t) { return &ours; };
        s = DecompressMessage(
            &m, [&](int64_t) { return &reference; }, options, &decoded, onto, &moved);
        if (s.ok() && r.correct == Correct::kAfter) {
          float* w = reinterpret_cast<float*>(m.tensors["w"].data.mutable_data());
          AddDifference(w, reinterpret_cast<const float*>(ours["w"].data.data()),
                        reinterpret_cast<const float*>(reference["w"].data.data()), w, elements,
                        options.threads);
        }
        if (s.ok() && r.correct == Correct::kOnto && moved.size() != 1) {
          s = Internal("the update was not decoded onto ours");
        }
      }
      const auto t2 = Clock::now();
      if (!s.ok()) {
        std::fprintf(stderr, "compress_speed: %s: %s\n", r.name.c_str(), s.ToString().c_str());
        return 1;
      }
      enc.push_back(Ms(t1 - t0));
      dec.push_back(Ms(t2 - t1));
      ratio.push_back(st.ratio());
    }
    auto range = [](const std::vector<double>& v) {
      return std::make_pair(*std::min_element(v.begin(), v.end()),
                            *std::max_element(v.begin(), v.end()));
    };
    const auto [e0, e1] = range(enc);
    const auto [d0, d1] = range(dec);
    const auto [r0, r1] = range(ratio);
    std::printf("%-40s %.3f-%.3f %8.0f-%-8.0f %8.0f-%-8.0f\n", r.name.c_str(), r0, r1, e0, e1, d0,
                d1);
    rows.push_back({{"recipe", r.name}, {"ratio", ratio}, {"encode_ms", enc}, {"decode_ms", dec}});
  }
  nlohmann::json out = {{"benchmark", "compress_speed"},
                        {"elements", elements},
                        {"threads", options.threads},
                        {"repeats", repeats},
                        {"rows", rows}};
  std::ofstream(json_path) << out.dump(1) << "\n";
  std::printf("JSON: %s\n", json_path.c_str());
  return 0;
}
