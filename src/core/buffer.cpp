#include "xsilo/core/buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

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

struct Buffer::Storage {
  enum class Kind { kHeap, kWrapped, kMapped };
  Kind kind;
  void* base = nullptr;
  uint64_t length = 0;
  std::function<void()> release;

  ~Storage() {
    switch (kind) {
      case Kind::kHeap:
        std::free(base);
        g_live_bytes.fetch_sub(length, std::memory_order_relaxed);
        break;
      case Kind::kWrapped:
        if (release) release();
        break;
      case Kind::kMapped:
        if (base != nullptr && length > 0) munmap(base, length);
        break;
    }
  }
};

namespace {
constexpr uint64_t kHugePageBytes = 2ull << 20;
constexpr uint64_t kHugePageThreshold = 8ull << 20;
}  // namespace

Result<Buffer> Buffer::Allocate(uint64_t size) {
  if (size == 0) return Buffer();
  // aligned_alloc requires size to be a multiple of the alignment.
  // Large buffers are 2 MiB-aligned and marked for transparent huge pages:
  // the first touch of fresh memory costs a page fault per page, and with
  // 4 KiB pages that dominated moving a model (265 MB took 1.2 s to fault in
  // on the development VM, under 0.1 s in huge pages when the kernel has
  // them free).
  const bool huge = size >= kHugePageThreshold;
  const uint64_t align = huge ? kHugePageBytes : kBufferAlignment;
  uint64_t rounded = (size + align - 1) / align * align;
  if (rounded < size) return ResourceExhausted("buffer size overflows: " + std::to_string(size));
  void* p = std::aligned_alloc(align, rounded);
  if (p == nullptr) {
    return ResourceExhausted("cannot allocate " + std::to_string(size) + " bytes");
  }
  if (huge) (void)madvise(p, rounded, MADV_HUGEPAGE);  // a hint; fine to fail
  auto storage = std::make_shared<Storage>();
  storage->kind = Storage::Kind::kHeap;
  storage->base = p;
  storage->length = rounded;
  AddLive(rounded);
  return Buffer(std::move(storage), static_cast<uint8_t*>(p), size);
}

Result<Buffer> Buffer::AllocateZeroed(uint64_t size) {
  XSILO_ASSIGN_OR_RETURN(Buffer b, Allocate(size));
  if (size > 0) std::memset(b.mutable_data(), 0, size);
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

uint64_t Buffer::LiveAllocatedBytes() { return g_live_bytes.load(std::memory_order_relaxed); }
uint64_t Buffer::PeakAllocatedBytes() { return g_peak_bytes.load(std::memory_order_relaxed); }
void Buffer::ResetPeakAllocatedBytes() {
  g_peak_bytes.store(g_live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

}  // namespace xsilo
