#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <fstream>

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
