// Buffer: reference-counted, sliceable bytes.
//
// A Buffer is a (storage, offset, length) view. Copying a Buffer or taking a
// Slice shares the storage and never copies bytes; the storage is released
// when the last view goes away. Storage comes from a 64-byte-aligned heap
// allocation, from caller-owned memory (released through a callback), or
// from a memory-mapped file.
//
// Thread safety: views may be copied and destroyed from any thread. Writing
// through mutable_data() while another thread reads the same bytes is the
// caller's race to avoid.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "xsilo/core/status.h"

namespace xsilo {

inline constexpr uint64_t kBufferAlignment = 64;

class Buffer {
 public:
  Buffer() = default;  // empty, no storage

  // Uninitialized, 64-byte-aligned storage of `size` bytes. Pages are not
  // touched, so untouched memory costs no RSS. ResourceExhausted on failure.
  static Result<Buffer> Allocate(uint64_t size);
  // Zero-filled variant of Allocate.
  static Result<Buffer> AllocateZeroed(uint64_t size);
  // A new aligned Buffer holding a copy of the bytes.
  static Buffer CopyFrom(const void* data, uint64_t size);
  static Buffer CopyFrom(std::string_view bytes) { return CopyFrom(bytes.data(), bytes.size()); }
  // Wraps caller-owned memory; `release` runs once when the last view dies.
  static Buffer Wrap(void* data, uint64_t size, std::function<void()> release);
  // Maps a file (private, copy-on-write) for its full length.
  static Result<Buffer> MapFile(const std::string& path);

  const uint8_t* data() const { return data_; }
  uint8_t* mutable_data() const { return data_; }
  uint64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<const uint8_t> span() const { return {data_, static_cast<size_t>(size_)}; }
  std::string_view view() const {
    return {reinterpret_cast<const char*>(data_), static_cast<size_t>(size_)};
  }

  // A view of [offset, offset + length) sharing this storage. The range must
  // lie inside the view (checked; an out-of-range request yields OutOfRange).
  Result<Buffer> Slice(uint64_t offset, uint64_t length) const;
  // Unchecked variant for callers that already validated the range.
  Buffer SliceUnchecked(uint64_t offset, uint64_t length) const;

  // Number of views sharing the storage (0 for an empty default Buffer).
  long use_count() const { return storage_.use_count(); }
  bool SharesStorageWith(const Buffer& other) const {
    return storage_ != nullptr && storage_ == other.storage_;
  }
  // The whole storage this view lies in (base and length; empty for a
  // default Buffer). For checks that a view shares a received buffer.
  std::span<const uint8_t> storage_span() const;
  bool IsAligned(uint64_t alignment = kBufferAlignment) const {
    return reinterpret_cast<uintptr_t>(data_) % alignment == 0;
  }

  // Bytes of aligned heap storage currently alive in this process, and the
  // peak since the last ResetPeak. Cheap atomic counters, for tests and
  // benchmarks that want to see copies the OS figure cannot attribute.
  static uint64_t LiveAllocatedBytes();
  static uint64_t PeakAllocatedBytes();
  static void ResetPeakAllocatedBytes();

  // The process's idle cache of large storage. Storage of 1 MiB and more
  // (an anonymous mapping of its own) whose last view died is kept, up to
  // max_idle_bytes in all and for at most max_age, and a later Allocate of
  // at most its size and at least four fifths of it reuses it
  // (uninitialized; AllocateZeroed clears it).
  // Memory given back to the kernel costs a page fault and the kernel's
  // zeroing per page when touched again, and on a VM whose balloon takes
  // back free pages (free page reporting) a fault in the host as well:
  // 265 MB touched again 3 s after the same amount was unmapped took
  // 154-471 ms there, against 18-38 ms back to back (docs/fl.md, "The
  // idle buffer cache"). FedAvg frees and allocates the same sizes every
  // round. Blocks past their age go at the next Allocate, release or
  // TrimIdleCache. Idle bytes are not counted by
  // LiveAllocatedBytes, but they are in the process's RSS.
  // Off unless configured: kDefaultIdleCacheBytes is 0, so a library user
  // sees no memory held that it did not ask for; `xsilo fl` turns it on (1
  // GiB, --buffer-cache-bytes). The environment's XSILO_BUFFER_CACHE_BYTES
  // and XSILO_BUFFER_CACHE_SECONDS (whole numbers) replace the defaults
  // (0 bytes: off). Thread-safe.
  static constexpr uint64_t kDefaultIdleCacheBytes = 0;
  static constexpr uint64_t kDefaultIdleCacheSeconds = 60;
  // Replaces the cache's bounds (unmapping what it held).
  static void ConfigureIdleCache(uint64_t max_idle_bytes, std::chrono::milliseconds max_age);
  // The age the cache keeps storage for now (the environment's or the
  // default until ConfigureIdleCache), so a caller can set the bytes alone.
  static std::chrono::milliseconds IdleCacheMaxAge();
  // Unmaps idle storage past its age.
  static void TrimIdleCache();
  static uint64_t IdleCachedBytes();

  struct Storage;  // opaque; defined in buffer.cpp

 private:
  friend class BufferPool;
  // Allocate; *reused: the storage held earlier bytes.
  static Result<Buffer> AllocateStorage(uint64_t size, bool* reused);
  Buffer(std::shared_ptr<Storage> storage, uint8_t* data, uint64_t size)
      : storage_(std::move(storage)), data_(data), size_(size) {}

  std::shared_ptr<Storage> storage_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Recycles the storage of large Buffers for a receiver that allocates one
// buffer per message. Fresh memory costs a page fault and the kernel's
// zeroing per page on first touch: on the development VM that zeroing was
// 59% of a grpc receiver's CPU while moving the Big tier (265 MB), more than
// the transfer itself. A pool hands out storage that earlier messages
// already faulted in.
//
// Only sizes of at least 8 MiB are pooled (smaller ones come from
// Buffer::Allocate), and only storage marked with Recycle goes back to the
// pool when its last view dies; everything else goes where Buffer storage
// goes (the process's idle cache, Buffer::ConfigureIdleCache), as does
// what the pool drops. Idle storage is bounded in bytes and in age (Trim),
// and is not counted by Buffer::LiveAllocatedBytes. A request the pool
// cannot meet tries the process's idle cache. Thread-safe; Buffers may
// outlive the pool.
class BufferPool {
 public:
  BufferPool(uint64_t max_idle_bytes, std::chrono::milliseconds max_idle_age);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // Like Buffer::Allocate (uninitialized bytes). A large request reuses the
  // smallest idle storage that holds it and is at most twice its size.
  Result<Buffer> Allocate(uint64_t size);
  // Returns `b`'s storage to the pool it came from once its last view dies
  // (a no-op for storage from elsewhere).
  static void Recycle(const Buffer& b);
  // Unmaps idle storage older than the maximum age.
  void Trim();
  uint64_t idle_bytes() const;

  struct State;  // opaque; defined in buffer.cpp

 private:
  std::shared_ptr<State> state_;
};

}  // namespace xsilo
