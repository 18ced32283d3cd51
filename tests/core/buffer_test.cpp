#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <cstring>
#include <fstream>
#include <string>
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
TEST(Buffer, LargeBuffersAreUnmappedWhenReleased) {
  constexpr uint64_t kMiB = 1ull << 20;
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

}  // namespace
}  // namespace xsilo
