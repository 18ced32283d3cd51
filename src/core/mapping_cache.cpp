#include "core/mapping_cache.h"

#include <sys/mman.h>
#include <unistd.h>

namespace xsilo {

void* MapAnonymous(uint64_t size, uint64_t align, uint64_t* mapped) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t length = (size + page - 1) / page * page;
  const uint64_t slack = align > page ? align : 0;
  if (length < size || length + slack < length) return nullptr;
  void* raw =
      mmap(nullptr, length + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  auto start = reinterpret_cast<uintptr_t>(raw);
  auto aligned = slack ? (start + align - 1) / align * align : start;
  // Give back what alignment left over on either side.
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + length + slack;
  if (end > aligned + length)
    munmap(reinterpret_cast<void*>(aligned + length), end - aligned - length);
  *mapped = length;
  return reinterpret_cast<void*>(aligned);
}

MappingCache::MappingCache(uint64_t max_idle_bytes, std::chrono::steady_clock::duration max_age,
                           std::function<void(Block)> spill)
    : max_idle_bytes_(max_idle_bytes), max_age_(max_age), spill_(std::move(spill)) {}

MappingCache::~MappingCache() {
  for (const Idle& i : idle_) munmap(i.block.base, i.block.length);
}

MappingCache::Block MappingCache::Take(uint64_t size, uint64_t max_length) {
  std::lock_guard<std::mutex> lock(mu_);
  auto best = idle_.end();
  for (auto it = idle_.begin(); it != idle_.end(); ++it) {
    const uint64_t length = it->block.length;
    if (length >= size && length <= max_length &&
        (best == idle_.end() || length < best->block.length))
      best = it;
  }
  if (best == idle_.end()) return {};
  const Block b = best->block;
  idle_bytes_ -= b.length;
  idle_.erase(best);
  return b;
}

void MappingCache::Put(Block b) {
  std::vector<Block> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (b.length > max_idle_bytes_) {
      drop.push_back(b);
    } else {
      while (idle_bytes_ + b.length > max_idle_bytes_) {
        idle_bytes_ -= idle_.front().block.length;
        drop.push_back(idle_.front().block);
        idle_.erase(idle_.begin());
      }
      idle_.push_back({b, std::chrono::steady_clock::now()});
      idle_bytes_ += b.length;
    }
  }
  Drop(drop);
}

void MappingCache::Drop(const std::vector<Block>& blocks) const {
  for (const Block& d : blocks) {
    if (spill_) {
      spill_(d);
    } else {
      munmap(d.base, d.length);
    }
  }
}

void MappingCache::Trim() {
  std::vector<Block> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    while (!idle_.empty() && now - idle_.front().since > max_age_) {
      idle_bytes_ -= idle_.front().block.length;
      drop.push_back(idle_.front().block);
      idle_.erase(idle_.begin());
    }
  }
  Drop(drop);
}

uint64_t MappingCache::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_bytes_;
}

}  // namespace xsilo
