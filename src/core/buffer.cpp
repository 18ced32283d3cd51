#include "xsilo/core/buffer.h"

#include "core/mapping_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
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

constexpr uint64_t kHugePageBytes = 2ull << 20;
constexpr uint64_t kHugePageThreshold = 8ull << 20;

// The process's idle large mappings (Buffer::ConfigureIdleCache).
struct IdleCache {
  std::mutex mu;  // guards cache (replaced by ConfigureIdleCache)
  std::unique_ptr<MappingCache> cache;
  std::chrono::milliseconds max_age{0};
};

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  return end != nullptr && *end == '\0' ? static_cast<uint64_t>(n) : fallback;
}

IdleCache* g_idle_cache = nullptr;

// Never destroyed: Buffers held by static objects die after main returns.
// Its lock is held across fork, so that a child never inherits it locked
// by a thread that does not exist there.
IdleCache& TheIdleCache() {
  static IdleCache* c = [] {
    auto* ic = new IdleCache;
    g_idle_cache = ic;
    pthread_atfork([] { g_idle_cache->mu.lock(); }, [] { g_idle_cache->mu.unlock(); },
                   [] { g_idle_cache->mu.unlock(); });
    const uint64_t bytes = EnvOr("XSILO_BUFFER_CACHE_BYTES", Buffer::kDefaultIdleCacheBytes);
    ic->max_age = std::chrono::milliseconds(
        1000 * EnvOr("XSILO_BUFFER_CACHE_SECONDS", Buffer::kDefaultIdleCacheSeconds));
    if (bytes > 0) ic->cache = std::make_unique<MappingCache>(bytes, ic->max_age);
    return ic;
  }();
  return *c;
}

// Takes an idle mapping of at least `size` bytes and at most a quarter
// more, dropping the ones past their age first; base nullptr when none.
MappingCache::Block TakeIdle(uint64_t size) {
  IdleCache& ic = TheIdleCache();
  std::lock_guard<std::mutex> lock(ic.mu);
  if (!ic.cache) return {};
  ic.cache->Trim();
  const uint64_t slack = size / 4;
  return ic.cache->Take(size, size > UINT64_MAX - slack ? UINT64_MAX : size + slack);
}

// Keeps a large mapping for reuse, or unmaps it when the cache is off.
void PutIdle(void* base, uint64_t length) {
  IdleCache& ic = TheIdleCache();
  {
    std::lock_guard<std::mutex> lock(ic.mu);
    if (ic.cache) {
      ic.cache->Trim();
      ic.cache->Put({base, length});
      return;
    }
  }
  munmap(base, length);
}

}  // namespace

// A pool's blocks past its bounds go on to the process's idle cache.
struct BufferPool::State {
  State(uint64_t max_idle_bytes, std::chrono::milliseconds max_idle_age)
      : cache(max_idle_bytes, max_idle_age,
              [](MappingCache::Block b) { PutIdle(b.base, b.length); }) {}
  MappingCache cache;
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
        g_live_bytes.fetch_sub(length, std::memory_order_relaxed);
        PutIdle(base, length);
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
          state->cache.Put({base, length});
        } else {
          PutIdle(base, length);
        }
        break;
      }
    }
  }
};

namespace {

// Buffers of this size and more get a private anonymous mapping instead of
// malloc memory, so that their pages go back to the kernel the moment the
// last view dies. From malloc they did not: glibc raises its mmap threshold
// to the largest block freed, after which multi-MB blocks came from (per
// thread) arenas and stayed there. A 300-round FedAvg soak (bench/soak,
// Small tier, 7 clients) grew the server from 180 MB to 734 MB that way
// while the live Buffers stayed at 4.7 MB.
constexpr uint64_t kMapThreshold = 1ull << 20;

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

Result<Buffer> Buffer::AllocateStorage(uint64_t size, bool* reused) {
  *reused = false;
  if (size == 0) return Buffer();
  auto storage = std::make_shared<Storage>();
  if (size >= kMapThreshold) {
    MappingCache::Block b = TakeIdle(size);
    *reused = b.base != nullptr;
    if (b.base == nullptr) b.base = MapBuffer(size, &b.length);
    if (b.base == nullptr) {
      return ResourceExhausted("cannot map " + std::to_string(size) + " bytes");
    }
    storage->kind = Storage::Kind::kAnonymous;
    storage->base = b.base;
    storage->length = b.length;
    AddLive(b.length);
    return Buffer(std::move(storage), static_cast<uint8_t*>(b.base), size);
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

Result<Buffer> Buffer::Allocate(uint64_t size) {
  bool reused = false;
  return AllocateStorage(size, &reused);
}

Result<Buffer> Buffer::AllocateZeroed(uint64_t size) {
  bool reused = false;
  XSILO_ASSIGN_OR_RETURN(Buffer b, AllocateStorage(size, &reused));
  // Fresh anonymous mappings are zero already; touching them would only
  // fault their pages in.
  if (size > 0 && (size < kMapThreshold || reused)) std::memset(b.mutable_data(), 0, size);
  return b;
}

void Buffer::ConfigureIdleCache(uint64_t max_idle_bytes, std::chrono::milliseconds max_age) {
  IdleCache& ic = TheIdleCache();
  std::unique_ptr<MappingCache> old;
  {
    std::lock_guard<std::mutex> lock(ic.mu);
    old = std::move(ic.cache);  // unmapped below, outside the lock
    ic.max_age = max_age;
    if (max_idle_bytes > 0) ic.cache = std::make_unique<MappingCache>(max_idle_bytes, max_age);
  }
}

std::chrono::milliseconds Buffer::IdleCacheMaxAge() {
  IdleCache& ic = TheIdleCache();
  std::lock_guard<std::mutex> lock(ic.mu);
  return ic.max_age;
}

void Buffer::TrimIdleCache() {
  IdleCache& ic = TheIdleCache();
  std::lock_guard<std::mutex> lock(ic.mu);
  if (ic.cache) ic.cache->Trim();
}

uint64_t Buffer::IdleCachedBytes() {
  IdleCache& ic = TheIdleCache();
  std::lock_guard<std::mutex> lock(ic.mu);
  return ic.cache ? ic.cache->idle_bytes() : 0;
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
    : state_(std::make_shared<State>(max_idle_bytes, max_idle_age)) {}

BufferPool::~BufferPool() = default;

Result<Buffer> BufferPool::Allocate(uint64_t size) {
  if (size < kHugePageThreshold) return Buffer::Allocate(size);
  // The smallest idle storage that holds `size` and is at most twice it,
  // else the process's idle cache's.
  MappingCache::Block b =
      state_->cache.Take(size, size > UINT64_MAX / 2 ? UINT64_MAX : 2 * size + 1);
  if (b.base == nullptr) b = TakeIdle(size);
  if (b.base == nullptr) {
    b.base = MapBuffer(size, &b.length);
    if (b.base == nullptr)
      return ResourceExhausted("cannot map " + std::to_string(size) + " bytes");
  }
  auto storage = std::make_shared<Buffer::Storage>();
  storage->kind = Buffer::Storage::Kind::kPooled;
  storage->base = b.base;
  storage->length = b.length;
  storage->pool = state_;
  AddLive(b.length);
  return Buffer(std::move(storage), static_cast<uint8_t*>(b.base), size);
}

void BufferPool::Recycle(const Buffer& b) {
  if (b.storage_ && b.storage_->kind == Buffer::Storage::Kind::kPooled)
    b.storage_->recycle.store(true);
}

void BufferPool::Trim() { state_->cache.Trim(); }

uint64_t BufferPool::idle_bytes() const { return state_->cache.idle_bytes(); }

uint64_t Buffer::LiveAllocatedBytes() { return g_live_bytes.load(std::memory_order_relaxed); }
uint64_t Buffer::PeakAllocatedBytes() { return g_peak_bytes.load(std::memory_order_relaxed); }
void Buffer::ResetPeakAllocatedBytes() {
  g_peak_bytes.store(g_live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

}  // namespace xsilo
