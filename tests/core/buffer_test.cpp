#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "xsilo/core/buffer.h"

namespace xsilo {
namespace {

TEST(Buffer, AllocationIsAlignedAndCounted) {
  uint64_t before = Buffer::LiveAllocatedBytes();
  {
    auto b = Buffer::Allocate(1000);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->size(), 1000u);
    EXPECT_TRUE(b->IsAligned(64));
    EXPECT_GE(Buffer::LiveAllocatedBytes(), before + 1000);
  }
  EXPECT_EQ(Buffer::LiveAllocatedBytes(), before);
  EXPECT_TRUE(Buffer::Allocate(0)->empty());
}

// Large buffers give their pages back to the kernel the moment the last view
// dies: their range is unmapped (mincore says ENOMEM). From malloc they
// stayed mapped in an arena: after a multi-MB block was freed, glibc served
// multi-MB blocks from its heaps and kept them (a FedAvg server's RSS grew
// by 2 MB a round in bench/soak).
// Sets the process's idle cache for one test and restores the default.
class IdleCacheForTest {
 public:
  IdleCacheForTest(uint64_t bytes, std::chrono::milliseconds age) {
    Buffer::ConfigureIdleCache(bytes, age);
  }
  ~IdleCacheForTest() {
    Buffer::ConfigureIdleCache(Buffer::kDefaultIdleCacheBytes,
                               std::chrono::seconds(Buffer::kDefaultIdleCacheSeconds));
  }
};

// Whether [p, p + length) is still mapped in this process.
bool Mapped(const void* p, uint64_t length) {
  const auto pagesize = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t page = reinterpret_cast<uintptr_t>(p) / pagesize * pagesize;
  std::vector<unsigned char> resident(length / pagesize + 2);
  return mincore(reinterpret_cast<void*>(page), length, resident.data()) == 0;
}

TEST(Buffer, LargeBuffersAreUnmappedWhenReleased) {
  constexpr uint64_t kMiB = 1ull << 20;
  IdleCacheForTest off(0, std::chrono::milliseconds(0));
  // Freeing a 7 MiB malloc block raised glibc's mmap threshold to 7 MiB.
  { auto warm = Buffer::Allocate(7 * kMiB); }
  for (uint64_t size : {1 * kMiB, 3 * kMiB + 5, 6 * kMiB, 16 * kMiB + 4096}) {
    uintptr_t page = 0;
    size_t length = 0;
    {
      auto b = Buffer::Allocate(size);
      ASSERT_TRUE(b.ok());
      std::memset(b->mutable_data(), 1, b->size());
      const auto pagesize = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
      page = reinterpret_cast<uintptr_t>(b->data()) / pagesize * pagesize;
      length = static_cast<size_t>(size);
      std::vector<unsigned char> resident(length / pagesize + 2);
      ASSERT_EQ(mincore(reinterpret_cast<void*>(page), length, resident.data()), 0);
    }
    std::vector<unsigned char> resident(length / 4096 + 2);
    errno = 0;
    EXPECT_EQ(mincore(reinterpret_cast<void*>(page), length, resident.data()), -1)
        << size << " bytes: still mapped after release";
    EXPECT_EQ(errno, ENOMEM);
  }
  auto zeroed = Buffer::AllocateZeroed(2 * kMiB);  // fresh mappings are zero-filled
  ASSERT_TRUE(zeroed.ok());
  for (uint64_t i = 0; i < zeroed->size(); i += 4096) ASSERT_EQ(zeroed->data()[i], 0);
}

// Large storage whose last view died is reused by a later allocation of
// about its size, within the cache's bytes and age; the rest is unmapped.
TEST(Buffer, TheIdleCacheReusesLargeStorageWithinItsBounds) {
  constexpr uint64_t kMiB = 1ull << 20;
  IdleCacheForTest cache(40 * kMiB, std::chrono::seconds(60));
  const uint64_t live = Buffer::LiveAllocatedBytes();
  const uint8_t* first = nullptr;
  {
    auto b = Buffer::Allocate(16 * kMiB);
    ASSERT_TRUE(b.ok());
    std::memset(b->mutable_data(), 1, b->size());
    first = b->data();
  }
  EXPECT_EQ(Buffer::IdleCachedBytes(), 16 * kMiB);
  EXPECT_EQ(Buffer::LiveAllocatedBytes(), live);  // idle is not live
  EXPECT_TRUE(Mapped(first, 16 * kMiB));
  {
    auto smaller = Buffer::Allocate(10 * kMiB);  // 16 is more than 10 and a quarter
    ASSERT_TRUE(smaller.ok());
    EXPECT_NE(smaller->data(), first);
    EXPECT_EQ(Buffer::IdleCachedBytes(), 16 * kMiB);
    auto again = Buffer::Allocate(13 * kMiB);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->data(), first);
    EXPECT_EQ(again->size(), 13 * kMiB);
    EXPECT_EQ(again->data()[0], 1);  // reused as it was: Allocate does not clear
    EXPECT_EQ(Buffer::LiveAllocatedBytes(), live + 16 * kMiB + 10 * kMiB);
  }
  // Both went idle (26 MiB); a reused block asked for zeroed is cleared.
  EXPECT_EQ(Buffer::IdleCachedBytes(), 26 * kMiB);
  {
    auto zeroed = Buffer::AllocateZeroed(16 * kMiB);
    ASSERT_TRUE(zeroed.ok());
    EXPECT_EQ(zeroed->data(), first);
    for (uint64_t i = 0; i < zeroed->size(); i += 512) ASSERT_EQ(zeroed->data()[i], 0) << i;
  }
  // Over the bytes: the oldest idle block goes first, and one above the
  // bound by itself is never kept.
  const uint8_t* big = nullptr;
  {
    auto b = Buffer::Allocate(48 * kMiB);
    ASSERT_TRUE(b.ok());
    big = b->data();
  }
  EXPECT_FALSE(Mapped(big, 48 * kMiB));
  EXPECT_EQ(Buffer::IdleCachedBytes(), 26 * kMiB);
  const uint8_t* twenty = nullptr;
  {
    auto b = Buffer::Allocate(20 * kMiB);
    ASSERT_TRUE(b.ok());
    twenty = b->data();
  }
  // 10 MiB went idle first, then 16: the 10 made room for the 20.
  EXPECT_EQ(Buffer::IdleCachedBytes(), 36 * kMiB);
  EXPECT_TRUE(Mapped(twenty, 20 * kMiB));
  EXPECT_TRUE(Mapped(first, 16 * kMiB));
  // From 1 MiB (a mapping of its own) storage is kept; below it, heap
  // memory, it is not.
  {
    auto b = Buffer::Allocate(1 * kMiB);
    auto heap = Buffer::Allocate(kMiB - 4096);
    ASSERT_TRUE(b.ok() && heap.ok());
  }
  EXPECT_EQ(Buffer::IdleCachedBytes(), 37 * kMiB);
}

TEST(Buffer, TheIdleCacheUnmapsStoragePastItsAge) {
  constexpr uint64_t kMiB = 1ull << 20;
  IdleCacheForTest cache(40 * kMiB, std::chrono::milliseconds(0));
  EXPECT_EQ(Buffer::IdleCacheMaxAge(), std::chrono::milliseconds(0));
  const uint8_t* p = nullptr;
  {
    auto b = Buffer::Allocate(8 * kMiB);
    ASSERT_TRUE(b.ok());
    p = b->data();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  Buffer::TrimIdleCache();
  EXPECT_EQ(Buffer::IdleCachedBytes(), 0u);
  EXPECT_FALSE(Mapped(p, 8 * kMiB));
}

TEST(Buffer, ImpossibleAllocationIsAnError) {
  auto b = Buffer::Allocate(uint64_t{1} << 62);
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
}

TEST(Buffer, SlicesShareStorageWithoutCopying) {
  Buffer b = Buffer::CopyFrom("hello world");
  auto s = b.Slice(6, 5);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->view(), "world");
  EXPECT_TRUE(s->SharesStorageWith(b));
  EXPECT_EQ(s->data(), b.data() + 6);
  EXPECT_EQ(b.use_count(), 2);
  s->mutable_data()[0] = 'W';
  EXPECT_EQ(b.view(), "hello World");
}

TEST(Buffer, SliceOutOfRangeIsRejected) {
  Buffer b = Buffer::CopyFrom("abc");
  EXPECT_EQ(b.Slice(2, 2).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(b.Slice(4, 0).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(b.Slice(UINT64_MAX, 2).status().code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(b.Slice(3, 0).ok());
}

TEST(Buffer, StorageOutlivesOriginalView) {
  Buffer slice;
  {
    Buffer b = Buffer::CopyFrom("keep me alive");
    slice = b.SliceUnchecked(5, 2);
  }
  EXPECT_EQ(slice.view(), "me");
  EXPECT_EQ(slice.use_count(), 1);
}

TEST(Buffer, WrapCallsReleaseOnceWhenLastViewDies) {
  static char data[] = "caller owned";
  int released = 0;
  {
    Buffer b = Buffer::Wrap(data, sizeof(data) - 1, [&] { ++released; });
    Buffer copy = b;
    Buffer s = b.SliceUnchecked(0, 6);
    EXPECT_EQ(s.view(), "caller");
    EXPECT_EQ(released, 0);
  }
  EXPECT_EQ(released, 1);
}

TEST(Buffer, MapsFiles) {
  std::string path = ::testing::TempDir() + "/xsilo_buffer_map_" + std::to_string(getpid());
  {
    std::ofstream out(path, std::ios::binary);
    out << "mapped bytes";
  }
  auto b = Buffer::MapFile(path);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->view(), "mapped bytes");
  EXPECT_EQ(b->SliceUnchecked(7, 5).view(), "bytes");
  ::unlink(path.c_str());
  EXPECT_EQ(b->view(), "mapped bytes");  // the mapping survives the unlink
  EXPECT_EQ(Buffer::MapFile(path).status().code(), StatusCode::kNotFound);
}

// A pool reuses only storage marked for recycling, within its byte budget,
// and gives idle storage back to the kernel once it is older than its age.
TEST(BufferPool, ReusesRecycledStorageOnly) {
  constexpr uint64_t kMiB = 1ull << 20;
  BufferPool pool(40 * kMiB, std::chrono::milliseconds(0));
  const uint8_t* first = nullptr;
  {
    auto b = pool.Allocate(16 * kMiB);
    ASSERT_TRUE(b.ok());
    first = b->data();
    BufferPool::Recycle(*b);
    EXPECT_EQ(pool.idle_bytes(), 0u);
  }
  EXPECT_EQ(pool.idle_bytes(), 16 * kMiB);
  const uint64_t live = Buffer::LiveAllocatedBytes();
  {
    auto again = pool.Allocate(12 * kMiB);  // fits, and not under half of it
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->data(), first);
    EXPECT_EQ(again->size(), 12 * kMiB);
    EXPECT_EQ(pool.idle_bytes(), 0u);
    EXPECT_EQ(Buffer::LiveAllocatedBytes(), live + 16 * kMiB);
    // Not marked: unmapped when it dies.
  }
  EXPECT_EQ(pool.idle_bytes(), 0u);
  EXPECT_EQ(Buffer::LiveAllocatedBytes(), live);
  {
    auto big = pool.Allocate(48 * kMiB);  // over the budget: never kept
    ASSERT_TRUE(big.ok());
    BufferPool::Recycle(*big);
    auto small = pool.Allocate(100);  // below 8 MiB: a plain Buffer
    ASSERT_TRUE(small.ok());
    BufferPool::Recycle(*small);
  }
  EXPECT_EQ(pool.idle_bytes(), 0u);
  {
    auto b = pool.Allocate(8 * kMiB);
    ASSERT_TRUE(b.ok());
    BufferPool::Recycle(*b);
  }
  EXPECT_EQ(pool.idle_bytes(), 8 * kMiB);
  {
    auto tiny = pool.Allocate(3 * kMiB);  // not pooled; leaves the idle one alone
    ASSERT_TRUE(tiny.ok());
  }
  EXPECT_EQ(pool.idle_bytes(), 8 * kMiB);
  pool.Trim();  // age 0: everything idle goes
  EXPECT_EQ(pool.idle_bytes(), 0u);
}

// What a pool gives up (past its age, or never marked for it) goes on to
// the process's idle cache, where a plain Allocate finds it.
TEST(BufferPool, WhatItDropsGoesToTheProcesssIdleCache) {
  constexpr uint64_t kMiB = 1ull << 20;
  IdleCacheForTest cache(64 * kMiB, std::chrono::seconds(60));
  BufferPool pool(40 * kMiB, std::chrono::milliseconds(0));
  const uint8_t* recycled = nullptr;
  const uint8_t* unmarked = nullptr;
  {
    auto a = pool.Allocate(16 * kMiB);
    auto b = pool.Allocate(12 * kMiB);
    ASSERT_TRUE(a.ok() && b.ok());
    recycled = a->data();
    unmarked = b->data();
    BufferPool::Recycle(*a);
  }
  EXPECT_EQ(pool.idle_bytes(), 16 * kMiB);
  EXPECT_EQ(Buffer::IdleCachedBytes(), 12 * kMiB);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  pool.Trim();
  EXPECT_EQ(pool.idle_bytes(), 0u);
  EXPECT_EQ(Buffer::IdleCachedBytes(), 28 * kMiB);
  auto x = Buffer::Allocate(16 * kMiB);
  auto y = Buffer::Allocate(12 * kMiB);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(x->data(), recycled);
  EXPECT_EQ(y->data(), unmarked);
  EXPECT_EQ(Buffer::IdleCachedBytes(), 0u);
}

TEST(BufferPool, BuffersMayOutliveThePool) {
  Buffer kept;
  {
    BufferPool pool(64ull << 20, std::chrono::seconds(10));
    auto b = pool.Allocate(9ull << 20);
    ASSERT_TRUE(b.ok());
    BufferPool::Recycle(*b);
    kept = *b;
  }
  kept.mutable_data()[0] = 1;  // still mapped; unmapped when `kept` dies
}

}  // namespace
}  // namespace xsilo
