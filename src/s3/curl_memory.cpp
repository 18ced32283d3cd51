#include "s3/curl_memory.h"

#include "core/mapping_cache.h"

#include <curl/curl.h>
#include <curl/mprintf.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace xsilo::s3client {
namespace {

// Every block starts with this header; the caller's bytes follow it, so
// they keep malloc's 16-byte alignment.
struct alignas(16) Header {
  size_t mapping;  // length of the block's own mapping, 0 for a malloc'd block
  size_t size;     // bytes asked for
};
static_assert(sizeof(Header) == 16);

MappingCache& TheCache() {
  // Never destroyed: curl may free after static destructors ran.
  static MappingCache* cache =
      new MappingCache(kMaxCachedBytes, std::chrono::seconds(kCachedBlockAgeSeconds));
  return *cache;
}

std::atomic<uint64_t> g_large_allocations{0};
std::atomic<uint64_t> g_large_maps{0};
std::atomic<uint64_t> g_live_large_bytes{0};

// A block of `total` bytes (header included): a cached mapping that holds
// it and wastes at most a quarter, or a fresh one.
void* AllocateLarge(size_t total) {
  MappingCache& cache = TheCache();
  cache.Trim();
  MappingCache::Block b = cache.Take(total, total + total / 4);
  if (b.base == nullptr) {
    b.base = MapAnonymous(total, 0, &b.length);
    if (b.base == nullptr) return nullptr;
    g_large_maps.fetch_add(1, std::memory_order_relaxed);
  }
  g_large_allocations.fetch_add(1, std::memory_order_relaxed);
  g_live_large_bytes.fetch_add(b.length, std::memory_order_relaxed);
  static_cast<Header*>(b.base)->mapping = b.length;
  return b.base;
}

void ReleaseLarge(void* base, size_t length) {
  g_live_large_bytes.fetch_sub(length, std::memory_order_relaxed);
  MappingCache& cache = TheCache();
  cache.Trim();
  cache.Put({base, length});
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
  CurlMemoryStats s;
  s.large_allocations = g_large_allocations.load();
  s.large_maps = g_large_maps.load();
  s.cached_bytes = TheCache().idle_bytes();
  s.live_large_bytes = g_live_large_bytes.load();
  return s;
}

void TrimCurlMemory() {
  // Everything idle goes: take each block out and unmap it.
  MappingCache& cache = TheCache();
  for (MappingCache::Block b = cache.Take(0, UINT64_MAX); b.base != nullptr;
       b = cache.Take(0, UINT64_MAX))
    munmap(b.base, b.length);
}

}  // namespace xsilo::s3client
