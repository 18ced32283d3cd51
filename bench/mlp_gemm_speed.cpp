// What the MLP trainer's three matrix products cost on this machine, one
// thread, under every instruction set this build and CPU support
// (src/fl/mlp_gemm.h): the forward W a, the weight gradient dz a^T and the
// backward W^T dz of one layer (the Big tier's middle one by default),
// for a training batch and an evaluation batch.
//
//   mlp_gemm_speed [--out 5950] [--in 7373] [--batches 32,256] [--repeats 3]
//                  [--json mlp_gemm_speed.json]
//
// Prints the least time of the repeats per product in ms, and GFLOP/s,
// and writes the same as JSON.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fl/mlp_gemm.h"

namespace {

using namespace xsilo::fl;
using Clock = std::chrono::steady_clock;

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t out = 5950, in = 7373;
  std::vector<int64_t> batches = {32, 256};
  int repeats = 3;
  std::string json_path = "mlp_gemm_speed.json";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--out") {
      out = std::stoll(next());
    } else if (a == "--in") {
      in = std::stoll(next());
    } else if (a == "--repeats") {
      repeats = std::stoi(next());
    } else if (a == "--json") {
      json_path = next();
    } else if (a == "--batches") {
      batches.clear();
      std::stringstream ss(next());
      for (std::string b; std::getline(ss, b, ',');) batches.push_back(std::stoll(b));
    } else {
      std::fprintf(stderr,
                   "usage: mlp_gemm_speed [--out N] [--in N] [--batches 32,256] [--repeats N] "
                   "[--json FILE]\n");
      return 2;
    }
  }
  if (out < 1 || in < 1 || repeats < 1 || batches.empty() ||
      *std::min_element(batches.begin(), batches.end()) < 1) {
    std::fprintf(stderr, "sizes, batches and repeats must be >= 1\n");
    return 2;
  }
  std::mt19937 rng(1);
  const auto w = Random(out * in, rng);
  nlohmann::json rows = nlohmann::json::array();
  std::printf("layer %lld x %lld, one thread; least of %d repeats\n", (long long)out, (long long)in,
              repeats);
  std::printf("%-8s %6s %10s %10s %10s %12s\n", "isa", "batch", "W a ms", "dz a^T ms", "W^T dz ms",
              "GFLOP/s");
  for (int64_t n : batches) {
    const auto a = Random(in * n, rng);
    const auto d = Random(out * n, rng);
    std::vector<float> z(out * n), g(out * in), y(in * n);
    for (auto isa : {gemm::Isa::kGeneric, gemm::Isa::kAvx2, gemm::Isa::kAvx512}) {
      if (!gemm::IsaSupported(isa)) continue;
      const gemm::Kernels& k = gemm::KernelsFor(isa);
      double best[3] = {std::numeric_limits<double>::infinity(),
                        std::numeric_limits<double>::infinity(),
                        std::numeric_limits<double>::infinity()};
      for (int r = 0; r <= repeats; ++r) {  // the first pass warms up, untimed
        const auto t0 = Clock::now();
        k.w_times_a(w.data(), out, in, a.data(), n, z.data());
        const auto t1 = Clock::now();
        k.d_times_at(d.data(), out, a.data(), in, n, g.data());
        const auto t2 = Clock::now();
        k.wt_times_d(w.data(), out, in, d.data(), n, y.data());
        const auto t3 = Clock::now();
        if (r == 0) continue;
        const Clock::time_point t[4] = {t0, t1, t2, t3};
        for (int p = 0; p < 3; ++p) {
          best[p] =
              std::min(best[p], std::chrono::duration<double, std::milli>(t[p + 1] - t[p]).count());
        }
      }
      const double flop = 2.0 * double(out) * double(in) * double(n) * 3;
      const double gflops = flop / ((best[0] + best[1] + best[2]) * 1e6);
      std::printf("%-8s %6lld %10.1f %10.1f %10.1f %12.1f\n",
                  std::string(gemm::IsaName(isa)).c_str(), (long long)n, best[0], best[1], best[2],
                  gflops);
      rows.push_back({{"isa", gemm::IsaName(isa)},
                      {"out", out},
                      {"in", in},
                      {"batch", n},
                      {"w_times_a_ms", best[0]},
                      {"d_times_at_ms", best[1]},
                      {"wt_times_d_ms", best[2]},
                      {"gflops", gflops}});
    }
  }
  std::ofstream f(json_path);
  f << nlohmann::json{{"benchmark", "mlp_gemm_speed"}, {"repeats", repeats}, {"rows", rows}}.dump(2)
    << "\n";
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
    return 1;
  }
  std::printf("wrote %s\n", json_path.c_str());
  return 0;
}
