// The directory store's recycled files (DirectoryStoreOptions): a deleted
// big object's file is reused by the next PUT that fits it, never while a
// reader still maps it, within the byte budget and the age limit; and two
// direct puts of one process at once never share a temporary file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "s3/object_store.h"
#include "xsilo/s3/server.h"

namespace xsilo {
namespace {

constexpr uint64_t kBig = 9ull << 20;  // above the 8 MiB recycling floor

class DirectoryRecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("xsilo-s3-recycle-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::unique_ptr<s3::ObjectStore> Open(uint64_t recycle_bytes,
                                        std::chrono::seconds age = std::chrono::seconds(30)) {
    s3::DirectoryStoreOptions o;
    o.recycle_bytes = recycle_bytes;
    o.recycle_max_age = age;
    auto s = s3::NewDirectoryObjectStore(root_.string(), o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    (void)(*s)->CreateBucket("b");  // made by an earlier Open of the test, or now
    EXPECT_TRUE((*s)->HeadBucket("b").ok());
    return std::move(s).value();
  }

  static s3::StoredObject Filled(uint64_t size, uint8_t byte) {
    s3::StoredObject o;
    auto b = Buffer::Allocate(size);
    EXPECT_TRUE(b.ok());
    std::memset(b->mutable_data(), byte, size);
    o.size = size;
    o.segments.push_back(std::move(b).value());
    return o;
  }

  // Inode of the file holding object `key`, or 0.
  ino_t InodeOf(const std::string& key) const {
    struct stat st {};
    return ::stat((root_ / "b" / key).c_str(), &st) == 0 ? st.st_ino : 0;
  }
  size_t FreeFiles() const {
    size_t n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(root_ / "b" / ".xsilo-free", ec)) {
      (void)e;
      ++n;
    }
    return n;
  }
  static bool AllBytes(const Buffer& b, uint8_t byte) {
    for (uint64_t i = 0; i < b.size(); ++i)
      if (b.data()[i] != byte) return false;
    return true;
  }

  std::filesystem::path root_;
};

TEST_F(DirectoryRecycleTest, ADeletedFileIsReusedByTheNextPutThatFitsIt) {
  auto store = Open(1ull << 30);
  ASSERT_TRUE(store->Put("b", "one", Filled(kBig, 1)).ok());
  const ino_t first = InodeOf("one");
  ASSERT_NE(first, 0u);
  ASSERT_TRUE(store->Delete("b", "one").ok());
  EXPECT_EQ(InodeOf("one"), 0u);
  EXPECT_EQ(store->Get("b", "one").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(FreeFiles(), 1u);
  // Smaller than the free file: reused and cut to size.
  ASSERT_TRUE(store->Put("b", "two", Filled(kBig - 4096, 2)).ok());
  EXPECT_EQ(InodeOf("two"), first);
  EXPECT_EQ(FreeFiles(), 0u);
  auto two = store->Get("b", "two");
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  ASSERT_EQ(two->size, kBig - 4096);
  EXPECT_TRUE(AllBytes(two->segments.at(0), 2));
}

TEST_F(DirectoryRecycleTest, AFileAReaderStillMapsIsNeverOverwritten) {
  auto store = Open(1ull << 30);
  ASSERT_TRUE(store->Put("b", "one", Filled(kBig, 1)).ok());
  const ino_t first = InodeOf("one");
  auto held = store->Get("b", "one");  // a GET in progress
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  ASSERT_TRUE(store->Delete("b", "one").ok());
  EXPECT_EQ(FreeFiles(), 1u);
  ASSERT_TRUE(store->Put("b", "two", Filled(kBig, 2)).ok());
  EXPECT_NE(InodeOf("two"), first) << "the mapped file was reused";
  EXPECT_EQ(FreeFiles(), 0u) << "the mapped file is unlinked, not kept";
  EXPECT_TRUE(AllBytes(held->segments.at(0), 1)) << "the reader's bytes changed";
  auto two = store->Get("b", "two");
  ASSERT_TRUE(two.ok());
  EXPECT_TRUE(AllBytes(two->segments.at(0), 2));
}

TEST_F(DirectoryRecycleTest, AReleasedReaderLetsTheFileBeReused) {
  auto store = Open(1ull << 30);
  ASSERT_TRUE(store->Put("b", "one", Filled(kBig, 1)).ok());
  const ino_t first = InodeOf("one");
  { ASSERT_TRUE(store->Get("b", "one").ok()); }  // mapped, then dropped
  ASSERT_TRUE(store->Delete("b", "one").ok());
  ASSERT_TRUE(store->Put("b", "two", Filled(kBig, 2)).ok());
  EXPECT_EQ(InodeOf("two"), first);
}

TEST_F(DirectoryRecycleTest, SmallObjectsBudgetAndSizeMismatchAreNotRecycled) {
  auto store = Open(kBig + kBig / 2);  // room for one big file
  ASSERT_TRUE(store->Put("b", "small", Filled(1 << 20, 1)).ok());
  ASSERT_TRUE(store->Delete("b", "small").ok());
  EXPECT_EQ(FreeFiles(), 0u) << "below 8 MiB a delete unlinks";
  ASSERT_TRUE(store->Put("b", "x", Filled(kBig, 1)).ok());
  ASSERT_TRUE(store->Put("b", "y", Filled(kBig, 1)).ok());
  ASSERT_TRUE(store->Delete("b", "x").ok());
  ASSERT_TRUE(store->Delete("b", "y").ok());
  EXPECT_EQ(FreeFiles(), 1u) << "the second file is over the budget";
  // A free file more than twice the object's size is left for a bigger one.
  auto roomy = Open(1ull << 30);
  ASSERT_TRUE(roomy->Put("b", "huge", Filled(2 * kBig + 4096, 5)).ok());
  const ino_t huge = InodeOf("huge");
  ASSERT_TRUE(roomy->Delete("b", "huge").ok());
  EXPECT_EQ(FreeFiles(), 2u);
  ASSERT_TRUE(roomy->Put("b", "z", Filled(kBig, 3)).ok());
  EXPECT_NE(InodeOf("z"), huge);
  EXPECT_EQ(FreeFiles(), 1u) << "the 9 MiB file was reused, the 18 MiB one kept";
  // Without a budget, a store reuses free files but keeps none.
  auto plain = Open(0);
  ASSERT_TRUE(plain->Put("b", "w", Filled(2 * kBig, 4)).ok());
  EXPECT_EQ(FreeFiles(), 0u);
  ASSERT_TRUE(plain->Delete("b", "w").ok());
  EXPECT_EQ(FreeFiles(), 0u);
}

TEST_F(DirectoryRecycleTest, TrimDropsFreeFilesPastTheirAge) {
  auto store = Open(1ull << 30, std::chrono::seconds(0));
  ASSERT_TRUE(store->Put("b", "one", Filled(kBig, 1)).ok());
  ASSERT_TRUE(store->Delete("b", "one").ok());
  ASSERT_EQ(FreeFiles(), 1u);
  // The age is whole seconds of the free file's ctime: past it once the
  // clock has passed that second. The file's own ctime, not the clock read
  // after the delete: a kernel with fine-grained ("multigrain") timestamps
  // (6.13 on) can stamp a rename ahead of time(), which read the coarse
  // clock (failed once in a full ctest run, 2026-12-02, with the clock read).
  std::time_t deleted = 0;
  for (const auto& e : std::filesystem::directory_iterator(root_ / "b" / ".xsilo-free")) {
    struct stat st {};
    ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
    deleted = st.st_ctime;
  }
  while (std::time(nullptr) <= deleted) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  store->Trim();
  EXPECT_EQ(FreeFiles(), 0u);
}

// Two direct puts of one process at once (the hybrid's workers) each get
// their own temporary file, whatever store object they go through.
TEST_F(DirectoryRecycleTest, ConcurrentDirectPutsOfOneProcessDoNotCollide) {
  Open(0);
  constexpr int kThreads = 4, kRounds = 20;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        GatherList body;
        body.Append(Buffer::CopyFrom(std::string(64 << 10, static_cast<char>('a' + t))));
        ASSERT_TRUE(PutObjectInDirectory(root_.string(), "b", "k" + std::to_string(t), body).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    auto got = GetObjectFromDirectory(root_.string(), "b", "k" + std::to_string(t));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->view(), std::string(64 << 10, static_cast<char>('a' + t)));
  }
}

}  // namespace
}  // namespace xsilo

namespace xsilo {
namespace {

// A server killed mid-PUT leaves its temporary file behind; the next store
// opened on the directory removes it, and keeps those of live writers.
TEST(DirectoryStore, TheTemporariesOfADeadWriterGoWhenTheStoreOpens) {
  const auto root =
      std::filesystem::temp_directory_path() / ("xsilo-dead-tmp-" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  {
    auto first = s3::NewDirectoryObjectStore(root.string());
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE((*first)->CreateBucket("b").ok());
  }
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const auto tmp = root / "b" / ".xsilo-tmp";
  auto touch = [&](const std::string& name) {
    std::ofstream(tmp / name) << std::string(4096, 'x');
    return tmp / name;
  };
  const auto of_dead = touch(std::to_string(dead) + "-0");
  const auto of_mine = touch(std::to_string(::getpid()) + "-7");
  const auto of_init = touch("1-3");  // pid 1 lives
  const auto other = touch("not-a-writer");
  auto second = s3::NewDirectoryObjectStore(root.string());
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(std::filesystem::exists(of_dead)) << "the dead writer's file stayed";
  EXPECT_TRUE(std::filesystem::exists(of_mine));
  EXPECT_TRUE(std::filesystem::exists(of_init));
  EXPECT_TRUE(std::filesystem::exists(other));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace xsilo
