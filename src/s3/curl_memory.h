// libcurl's memory, given by xsilo (curl_global_init_mem).
//
// curl 7.88 mallocs a transfer's receive buffer (CURLOPT_BUFFERSIZE, 1 MiB
// here) and upload buffer (CURLOPT_UPLOAD_BUFFERSIZE, 2 MiB) for every
// transfer and frees them when it ends. Through glibc's malloc that churn
// grows a process without bound in practice: the first free of such a
// mapped block raises glibc's mmap threshold to its size, and from then on
// the buffers come from the per-thread arenas of whichever threads run
// transfers, which keep the pages and fragment (docs/reliability.md,
// "Soak"). So blocks of kLargeBlock bytes and more are whole mappings, kept
// for reuse in a small bounded cache; smaller ones go to malloc, which never
// maps them and so never moves its threshold.
#pragma once

#include <cstddef>
#include <cstdint>

namespace xsilo::s3client {

// Under AddressSanitizer curl keeps malloc, so that ASan and LSan see its
// buffers (overflows, use after free, leaks) instead of raw mappings.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kCurlMemoryUnderSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kCurlMemoryUnderSanitizer = true;
#else
inline constexpr bool kCurlMemoryUnderSanitizer = false;
#endif
#else
inline constexpr bool kCurlMemoryUnderSanitizer = false;
#endif

// Blocks from this size up are mappings of their own.
inline constexpr size_t kLargeBlock = 128 * 1024;
// At most this many bytes of unused large blocks are kept for reuse;
// a block unused for longer than kCachedBlockAge is unmapped at the next
// large allocation or release.
inline constexpr uint64_t kMaxCachedBytes = 48ull << 20;
inline constexpr int kCachedBlockAgeSeconds = 30;

// curl_global_init_mem with the functions below, once per process. If the
// process initialised curl before (another library), curl keeps its own
// memory functions and these are not used (CurlMemoryInstalled() false);
// likewise under AddressSanitizer (kCurlMemoryUnderSanitizer).
void InitCurlWithXsiloMemory();
bool CurlMemoryInstalled();

// The functions given to curl, exposed for tests.
void* CurlMalloc(size_t n);
void CurlFree(void* p);
void* CurlRealloc(void* p, size_t n);
char* CurlStrdup(const char* s);
void* CurlCalloc(size_t count, size_t size);

struct CurlMemoryStats {
  uint64_t large_allocations = 0;  // large blocks handed out
  uint64_t large_maps = 0;         // of them, fresh mappings (not reused)
  uint64_t cached_bytes = 0;       // unused large blocks kept now
  uint64_t live_large_bytes = 0;   // large blocks in use now
};
CurlMemoryStats GetCurlMemoryStats();
// Unmaps every cached block (tests).
void TrimCurlMemory();

}  // namespace xsilo::s3client
