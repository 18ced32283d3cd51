// Maps 265 MB (2 MiB-aligned, MADV_HUGEPAGE as Buffer does), touches every
// page, unmaps it, sleeps argv[1] ms; four times. Prints each touch's time.
//   g++ -O2 fault_cost.cpp -o fault_cost && ./fault_cost 0 && ./fault_cost 3000
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  const size_t n = 265ull << 20;
  const int sleep_ms = argc > 1 ? std::atoi(argv[1]) : 0;
  for (int i = 0; i < 4; i++) {
    const auto t0 = std::chrono::steady_clock::now();
    void* raw =
        mmap(nullptr, n + (2 << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return 1;
    char* p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + (2 << 20) - 1) &
                                      ~static_cast<uintptr_t>((2 << 20) - 1));
    madvise(p, n, MADV_HUGEPAGE);
    for (size_t j = 0; j < n; j += 4096) p[j] = 1;
    const auto t1 = std::chrono::steady_clock::now();
    std::printf("touch %.1f ms\n", std::chrono::duration<double, std::milli>(t1 - t0).count());
    munmap(raw, n + (2 << 20));
    usleep(static_cast<useconds_t>(sleep_ms) * 1000);
  }
}
