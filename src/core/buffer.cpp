#include "xsilo/core/buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace xsilo {

namespace {

std::atomic<uint64_t> g_live_bytes{0};
std::atomic<uint64_t> g_peak_bytes{0};

void AddLive(uint64_t n) {
  uint64_t now = g_live_bytes.fetch_add(n, std::memory_order_relaxed) + n;
  uint64_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !g_peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

}  // namespace

struct BufferPool::State {
  struct Idle {
    void* base;
    uint64_t length;
    std::chrono::steady_clock::time_point since;
  };
  uint64_t max_idle_bytes = 0;
  std::chrono::steady_clock::duration max_idle_age{};
  mutable std::mutex mu;
  std::vector<Idle> idle;  // oldest first
  uint64_t idle_bytes = 0;

  ~State() {
    for (const Idle& i : idle) munmap(i.base, i.length);
  }

  // Keeps the mapping for reuse, making room by unmapping the oldest.
  void Return(void* base, uint64_t length) {
    std::vector<Idle> drop;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (length > max_idle_bytes) {
        drop.push_back({base, length, {}});
      } else {
        while (idle_bytes + length > max_idle_bytes) {
          idle_bytes -= idle.front().length;
          drop.push_back(idle.front());
          idle.erase(idle.begin());
        }
        idle.push_back({base, length, std::chrono::steady_clock::now()});
        idle_bytes += length;
      }
    }
    for (const Idle& i : drop) munmap(i.base, i.length);
  }
};

struct Buffer::Storage {
  enum class Kind { kHeap, kAnonymous, kWrapped, kMapped, kPooled };
  Kind kind;
  void* base = nullptr;
  uint64_t length = 0;
  std::function<void()> release;
  // kPooled: where the mapping goes back to once Recycle marked it.
  std::weak_ptr<BufferPool::State> pool;
  std::atomic<bool> recycle{false};

  ~Storage() {
    switch (kind) {
      case Kind::kHeap:
        std::free(base);
        g_live_bytes.fetch_sub(length, std::memory_order_relaxed);
        break;
      case Kind::kAnonymous:
        munmap(base, length);
        g_live_bytes.fetch_sub(length, std::memory_order_relaxed);
        break;
      case Kind::kWrapped:
        if (release) release();
        break;
      case Kind::kMapped:
        if (base != nullptr && length > 0) munmap(base, length);
        break;
      case Kind::kPooled: {
        g_live_bytes.fetch_sub(length, std::memory_order_relaxed);
        auto state = recycle.load() ? pool.lock() : nullptr;
        if (state) {
          state->Return(base, length);
        } else {
          munmap(base, length);
        }
        break;
      }
    }
  }
};

namespace {
constexpr uint64_t kHugePageBytes = 2ull << 20;
constexpr uint64_t kHugePageThreshold = 8ull << 20;
}  // namespace

namespace {

// Buffers of this size and more get a private anonymous mapping instead of
// malloc memory, so that their pages go back to the kernel the moment the
// last view dies. From malloc they did not: glibc raises its mmap threshold
// to the largest block freed, after which multi-MB blocks came from (per
// thread) arenas and stayed there. A 300-round FedAvg soak (bench/soak,
// Small tier, 7 clients) grew the server from 180 MB to 734 MB that way
// while the live Buffers stayed at 4.7 MB.
constexpr uint64_t kMapThreshold = 1ull << 20;

// An anonymous mapping of at least `size` bytes starting at a multiple of
// `align` (a power of two, at least the page size). Zero-filled.
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

// Large buffers are 2 MiB-aligned and marked for transparent huge pages:
// the first touch of fresh memory costs a page fault per page, and with
// 4 KiB pages that dominated moving a model (265 MB took 1.2 s to fault in
// on the development VM, under 0.1 s in huge pages when the kernel has
// them free).
void* MapBuffer(uint64_t size, uint64_t* mapped) {
  const bool huge = size >= kHugePageThreshold;
  void* p = MapAnonymous(size, huge ? kHugePageBytes : kBufferAlignment, mapped);
  if (p != nullptr && huge) (void)madvise(p, *mapped, MADV_HUGEPAGE);  // a hint; fine to fail
  return p;
}

}  // namespace

Result<Buffer> Buffer::Allocate(uint64_t size) {
  if (size == 0) return Buffer();
  auto storage = std::make_shared<Storage>();
  if (size >= kMapThreshold) {
    uint64_t mapped = 0;
    void* p = MapBuffer(size, &mapped);
    if (p == nullptr) {
      return ResourceExhausted("cannot map " + std::to_string(size) + " bytes");
    }
    storage->kind = Storage::Kind::kAnonymous;
    storage->base = p;
    storage->length = mapped;
    AddLive(mapped);
    return Buffer(std::move(storage), static_cast<uint8_t*>(p), size);
  }
  // aligned_alloc requires size to be a multiple of the alignment.
  uint64_t rounded = (size + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  void* p = std::aligned_alloc(kBufferAlignment, rounded);
  if (p == nullptr) {
    return ResourceExhausted("cannot allocate " + std::to_string(size) + " bytes");
  }
  storage->kind = Storage::Kind::kHeap;
  storage->base = p;
  storage->length = rounded;
  AddLive(rounded);
  return Buffer(std::move(storage), static_cast<uint8_t*>(p), size);
}

Result<Buffer> Buffer::AllocateZeroed(uint64_t size) {
  XSILO_ASSIGN_OR_RETURN(Buffer b, Allocate(size));
  // Fresh anonymous mappings are zero already; touching them would only
  // fault their pages in.
  if (size > 0 && size < kMapThreshold) std::memset(b.mutable_data(), 0, size);
  return b;
}

Buffer Buffer::CopyFrom(const void* data, uint64_t size) {
  auto r = Allocate(size);
  if (!r.ok()) std::abort();  // a copy of caller memory that cannot be allocated is fatal
  if (size > 0) std::memcpy(r->mutable_data(), data, size);
  return std::move(r).value();
}

std::span<const uint8_t> Buffer::storage_span() const {
  if (!storage_) return {};
  return {static_cast<const uint8_t*>(storage_->base), static_cast<size_t>(storage_->length)};
}

Buffer Buffer::Wrap(void* data, uint64_t size, std::function<void()> release) {
  auto storage = std::make_shared<Storage>();
  storage->kind = Storage::Kind::kWrapped;
  storage->base = data;
  storage->length = size;
  storage->release = std::move(release);
  return Buffer(std::move(storage), static_cast<uint8_t*>(data), size);
}

Result<Buffer> Buffer::MapFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    std::string msg = "open " + path + ": " + std::strerror(e);
    return e == ENOENT ? NotFound(msg) : (e == EACCES ? PermissionDenied(msg) : Internal(msg));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string msg = "fstat " + path + ": " + std::strerror(errno);
    ::close(fd);
    return Internal(msg);
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return Buffer();
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) return Internal("mmap " + path + ": " + std::strerror(e));
  auto storage = std::make_shared<Storage>();
  storage->kind = Storage::Kind::kMapped;
  storage->base = p;
  storage->length = size;
  return Buffer(std::move(storage), static_cast<uint8_t*>(p), size);
}

Result<Buffer> Buffer::Slice(uint64_t offset, uint64_t length) const {
  if (offset > size_ || length > size_ - offset) {
    return OutOfRange("slice [" + std::to_string(offset) + ", +" + std::to_string(length) +
                      ") outside buffer of " + std::to_string(size_) + " bytes");
  }
  return SliceUnchecked(offset, length);
}

Buffer Buffer::SliceUnchecked(uint64_t offset, uint64_t length) const {
  if (length == 0) return Buffer(storage_, data_ + (data_ ? offset : 0), 0);
  return Buffer(storage_, data_ + offset, length);
}

BufferPool::BufferPool(uint64_t max_idle_bytes, std::chrono::milliseconds max_idle_age)
    : state_(std::make_shared<State>()) {
  state_->max_idle_bytes = max_idle_bytes;
  state_->max_idle_age = max_idle_age;
}

BufferPool::~BufferPool() = default;

Result<Buffer> BufferPool::Allocate(uint64_t size) {
  if (size < kHugePageThreshold) return Buffer::Allocate(size);
  void* base = nullptr;
  uint64_t length = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto& idle = state_->idle;
    auto best = idle.end();
    for (auto it = idle.begin(); it != idle.end(); ++it) {
      if (it->length >= size && it->length / 2 <= size &&
          (best == idle.end() || it->length < best->length))
        best = it;
    }
    if (best != idle.end()) {
      base = best->base;
      length = best->length;
      state_->idle_bytes -= length;
      idle.erase(best);
    }
  }
  if (base == nullptr) {
    base = MapBuffer(size, &length);
    if (base == nullptr) return ResourceExhausted("cannot map " + std::to_string(size) + " bytes");
  }
  auto storage = std::make_shared<Buffer::Storage>();
  storage->kind = Buffer::Storage::Kind::kPooled;
  storage->base = base;
  storage->length = length;
  storage->pool = state_;
  AddLive(length);
  return Buffer(std::move(storage), static_cast<uint8_t*>(base), size);
}

void BufferPool::Recycle(const Buffer& b) {
  if (b.storage_ && b.storage_->kind == Buffer::Storage::Kind::kPooled)
    b.storage_->recycle.store(true);
}

void BufferPool::Trim() {
  std::vector<State::Idle> drop;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    const auto now = std::chrono::steady_clock::now();
    auto& idle = state_->idle;
    while (!idle.empty() && now - idle.front().since > state_->max_idle_age) {
      state_->idle_bytes -= idle.front().length;
      drop.push_back(idle.front());
      idle.erase(idle.begin());
    }
  }
  for (const State::Idle& i : drop) munmap(i.base, i.length);
}

uint64_t BufferPool::idle_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->idle_bytes;
}

uint64_t Buffer::LiveAllocatedBytes() { return g_live_bytes.load(std::memory_order_relaxed); }
uint64_t Buffer::PeakAllocatedBytes() { return g_peak_bytes.load(std::memory_order_relaxed); }
void Buffer::ResetPeakAllocatedBytes() {
  g_peak_bytes.store(g_live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

}  // namespace xsilo
