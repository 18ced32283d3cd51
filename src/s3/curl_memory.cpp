#include "s3/curl_memory.h"

#include <curl/curl.h>
#include <curl/mprintf.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace xsilo::s3client {
namespace {

// Every block starts with this header; the caller's bytes follow it, so
// they keep malloc's 16-byte alignment.
struct alignas(16) Header {
  size_t mapping;  // length of the block's own mapping, 0 for a malloc'd block
  size_t size;     // bytes asked for
};
static_assert(sizeof(Header) == 16);

using Clock = std::chrono::steady_clock;

struct Cache {
  struct Idle {
    void* base;
    size_t length;
    Clock::time_point since;
  };
  std::mutex mu;
  std::vector<Idle> idle;  // oldest first
  CurlMemoryStats stats;

  // Takes the blocks older than the age limit out (under mu).
  void TakeOld(Clock::time_point now, std::vector<Idle>* drop) {
    while (!idle.empty() &&
           now - idle.front().since > std::chrono::seconds(kCachedBlockAgeSeconds)) {
      stats.cached_bytes -= idle.front().length;
      drop->push_back(idle.front());
      idle.erase(idle.begin());
    }
  }
};

Cache& TheCache() {
  static Cache* cache = new Cache;  // never destroyed: curl may free after static destructors
  return *cache;
}

void Unmap(const std::vector<Cache::Idle>& blocks) {
  for (const Cache::Idle& b : blocks) munmap(b.base, b.length);
}

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

void* AllocateLarge(size_t total) {
  const size_t page = PageSize();
  if (total > SIZE_MAX - page) return nullptr;
  const size_t length = (total + page - 1) / page * page;
  Cache& c = TheCache();
  void* base = nullptr;
  std::vector<Cache::Idle> drop;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.TakeOld(Clock::now(), &drop);
    // The smallest cached block that fits and wastes at most a quarter.
    auto best = c.idle.end();
    for (auto it = c.idle.begin(); it != c.idle.end(); ++it) {
      if (it->length >= length && it->length - length <= length / 4 &&
          (best == c.idle.end() || it->length < best->length))
        best = it;
    }
    size_t got = length;
    if (best != c.idle.end()) {
      base = best->base;
      got = best->length;
      c.stats.cached_bytes -= got;
      c.idle.erase(best);
    }
    ++c.stats.large_allocations;
    if (base == nullptr) ++c.stats.large_maps;
    c.stats.live_large_bytes += got;
    if (base != nullptr) {
      static_cast<Header*>(base)->mapping = got;
    }
  }
  Unmap(drop);
  if (base == nullptr) {
    base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      std::lock_guard<std::mutex> lock(c.mu);
      c.stats.live_large_bytes -= length;
      --c.stats.large_allocations;
      --c.stats.large_maps;
      return nullptr;
    }
    static_cast<Header*>(base)->mapping = length;
  }
  return base;
}

void ReleaseLarge(void* base, size_t length) {
  Cache& c = TheCache();
  std::vector<Cache::Idle> drop;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    const Clock::time_point now = Clock::now();
    c.stats.live_large_bytes -= length;
    c.TakeOld(now, &drop);
    if (length > kMaxCachedBytes) {
      drop.push_back({base, length, now});
    } else {
      while (c.stats.cached_bytes + length > kMaxCachedBytes) {
        c.stats.cached_bytes -= c.idle.front().length;
        drop.push_back(c.idle.front());
        c.idle.erase(c.idle.begin());
      }
      c.idle.push_back({base, length, now});
      c.stats.cached_bytes += length;
    }
  }
  Unmap(drop);
}

Header* HeaderOf(void* p) { return static_cast<Header*>(p) - 1; }

std::atomic<bool> g_installed{false};
std::atomic<uint64_t> g_small_allocations{0};

}  // namespace

void* CurlMalloc(size_t n) {
  if (n > SIZE_MAX - sizeof(Header)) return nullptr;
  const size_t total = n + sizeof(Header);
  Header* h;
  if (total >= kLargeBlock) {
    h = static_cast<Header*>(AllocateLarge(total));
  } else {
    h = static_cast<Header*>(std::malloc(total));
    if (h) h->mapping = 0;
    g_small_allocations.fetch_add(1, std::memory_order_relaxed);
  }
  if (!h) return nullptr;
  h->size = n;
  return h + 1;
}

void CurlFree(void* p) {
  if (!p) return;
  Header* h = HeaderOf(p);
  if (h->mapping == 0) {
    std::free(h);
  } else {
    ReleaseLarge(h, h->mapping);
  }
}

void* CurlRealloc(void* p, size_t n) {
  if (!p) return CurlMalloc(n);
  if (n > SIZE_MAX - sizeof(Header)) return nullptr;
  Header* h = HeaderOf(p);
  if (h->mapping == 0 && n + sizeof(Header) < kLargeBlock) {
    Header* moved = static_cast<Header*>(std::realloc(h, n + sizeof(Header)));
    if (!moved) return nullptr;
    moved->size = n;
    return moved + 1;
  }
  if (h->mapping != 0 && n + sizeof(Header) <= h->mapping && n + sizeof(Header) >= kLargeBlock) {
    h->size = n;  // still fits its mapping
    return p;
  }
  void* q = CurlMalloc(n);
  if (!q) return nullptr;
  std::memcpy(q, p, std::min(n, h->size));
  CurlFree(p);
  return q;
}

char* CurlStrdup(const char* s) {
  const size_t n = std::strlen(s) + 1;
  char* d = static_cast<char*>(CurlMalloc(n));
  if (d) std::memcpy(d, s, n);
  return d;
}

void* CurlCalloc(size_t count, size_t size) {
  if (size != 0 && count > SIZE_MAX / size) return nullptr;
  const size_t n = count * size;
  void* p = CurlMalloc(n);
  // A fresh mapping is zero already; a reused one and malloc's are not.
  if (p) std::memset(p, 0, n);
  return p;
}

void InitCurlWithXsiloMemory() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (kCurlMemoryUnderSanitizer) {
      curl_global_init(CURL_GLOBAL_DEFAULT);
      return;
    }
    curl_global_init_mem(CURL_GLOBAL_DEFAULT, CurlMalloc, CurlFree, CurlRealloc, CurlStrdup,
                         CurlCalloc);
    // curl_global_init_mem only counts a second call and keeps the first
    // one's functions, so ask: does an allocation of curl's come here?
    const uint64_t before = g_small_allocations.load();
    char* probe = curl_maprintf("%s", "xsilo");
    g_installed = probe != nullptr && g_small_allocations.load() > before;
    curl_free(probe);
  });
}

bool CurlMemoryInstalled() { return g_installed; }

CurlMemoryStats GetCurlMemoryStats() {
  Cache& c = TheCache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.stats;
}

void TrimCurlMemory() {
  Cache& c = TheCache();
  std::vector<Cache::Idle> drop;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    drop.swap(c.idle);
    c.stats.cached_bytes = 0;
  }
  Unmap(drop);
}

}  // namespace xsilo::s3client
