// Splits [0, n) into contiguous chunks run on short-lived threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "xsilo/core/cpus.h"

namespace xsilo::fl {

// Runs fn(begin, end) over up to `threads` chunks (0 = the CPUs this process may use, UsableCpus);
// the first chunk runs on the calling thread. Ranges below `min_chunk`
// elements are not split.
inline void ParallelFor(uint64_t n, uint32_t threads, uint64_t min_chunk,
                        const std::function<void(uint64_t, uint64_t)>& fn) {
  if (n == 0) return;
  uint64_t t = threads ? threads : static_cast<uint64_t>(UsableCpus());
  t = std::min<uint64_t>(t, std::max<uint64_t>(1, n / std::max<uint64_t>(1, min_chunk)));
  if (t <= 1) {
    fn(0, n);
    return;
  }
  // Chunk boundaries on 16-element multiples keep SIMD loops aligned.
  uint64_t chunk = ((n + t - 1) / t + 15) / 16 * 16;
  std::vector<std::thread> workers;
  for (uint64_t b = chunk; b < n; b += chunk) {
    workers.emplace_back([&fn, b, chunk, n] { fn(b, std::min(n, b + chunk)); });
  }
  fn(0, std::min(n, chunk));
  for (auto& w : workers) w.join();
}

}  // namespace xsilo::fl
