// Anonymous memory mappings, and a bounded cache of unused ones for reuse
// (BufferPool's storage, libcurl's per-transfer buffers in src/s3). Fresh
// mappings cost a page fault and the kernel's zeroing per page on first
// touch; a cached one was faulted in already.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace xsilo {

// An anonymous mapping of at least `size` bytes (rounded up to whole pages,
// the length in *mapped) starting at a multiple of `align` (a power of two;
// the page size or less means no extra alignment). Zero-filled; nullptr if
// the kernel refuses or the size overflows.
void* MapAnonymous(uint64_t size, uint64_t align, uint64_t* mapped);

// Unused mappings, oldest first, at most max_idle_bytes in all. Thread-safe.
class MappingCache {
 public:
  struct Block {
    void* base = nullptr;
    uint64_t length = 0;
  };

  // `spill` (optional) takes the blocks the cache drops, for their age or
  // to make room, instead of unmapping them.
  MappingCache(uint64_t max_idle_bytes, std::chrono::steady_clock::duration max_age,
               std::function<void(Block)> spill = nullptr);
  ~MappingCache();  // unmaps every idle block (spills none)
  MappingCache(const MappingCache&) = delete;
  MappingCache& operator=(const MappingCache&) = delete;

  // Takes out the smallest idle block whose length lies in
  // [size, max_length]; a Block with base nullptr when there is none.
  Block Take(uint64_t size, uint64_t max_length);
  // Keeps `b` for reuse, dropping the oldest blocks to make room (or `b`
  // itself when it alone is above the bound).
  void Put(Block b);
  // Drops the blocks idle for longer than max_age.
  void Trim();
  uint64_t idle_bytes() const;

 private:
  void Drop(const std::vector<Block>& blocks) const;
  struct Idle {
    Block block;
    std::chrono::steady_clock::time_point since;
  };
  const uint64_t max_idle_bytes_;
  const std::chrono::steady_clock::duration max_age_;
  const std::function<void(Block)> spill_;
  mutable std::mutex mu_;
  std::vector<Idle> idle_;  // oldest first
  uint64_t idle_bytes_ = 0;
};

}  // namespace xsilo
