// Conditional writes in the object stores (PutCondition): the test of the
// key and the replacement are one step against every other write and delete
// of the store, in both storage modes. Many writers with If-None-Match "*"
// on one key: exactly one wins, whatever the interleaving, and the key
// holds the winner's bytes and ETag. The S3 behaviour over HTTP is in
// boto3/test_conditional_write.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "s3/errors.h"
#include "s3/object_store.h"
#include "xsilo/s3/errors.h"

namespace xsilo {
namespace {

class ConditionalWriteTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("xsilo-s3-cond-" + std::to_string(::getpid()) + "-" + GetParam());
    std::filesystem::remove_all(root_);
    if (GetParam() == "memory") {
      store_ = s3::NewMemoryObjectStore();
    } else {
      auto s = s3::NewDirectoryObjectStore(root_.string());
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      store_ = std::move(s).value();
    }
    ASSERT_TRUE(store_->CreateBucket("b").ok());
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  static s3::StoredObject Filled(uint64_t size, uint8_t byte) {
    s3::StoredObject o;
    auto b = Buffer::Allocate(size);
    EXPECT_TRUE(b.ok());
    std::memset(b->mutable_data(), byte, size);
    o.size = size;
    o.segments.push_back(std::move(b).value());
    return o;
  }

  std::filesystem::path root_;
  std::unique_ptr<s3::ObjectStore> store_;
};

s3::PutCondition Absent() {
  return [](const s3::ObjectEntry* current) {
    return current ? s3::S3Error("PreconditionFailed", "exists") : Status::OK();
  };
}

TEST_P(ConditionalWriteTest, OneOfManyCreatorsWins) {
  constexpr int kWriters = 8;
  constexpr int kRounds = 20;
  for (int round = 0; round < kRounds; ++round) {
    const std::string key = "k" + std::to_string(round);
    std::atomic<int> won{0}, refused{0}, winner{-1};
    std::vector<std::thread> writers;
    for (int w = 0; w < kWriters; ++w) {
      writers.emplace_back([&, w] {
        Status s = store_->Put("b", key, Filled(4096 + w, static_cast<uint8_t>(w + 1)), Absent());
        if (s.ok()) {
          ++won;
          winner = w;
        } else if (S3ErrorCode(s) == "PreconditionFailed") {
          ++refused;
        }
      });
    }
    for (auto& t : writers) t.join();
    ASSERT_EQ(won.load(), 1) << "round " << round;
    ASSERT_EQ(refused.load(), kWriters - 1) << "round " << round;
    auto got = store_->Get("b", key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const int w = winner.load();
    ASSERT_EQ(got->size, 4096u + w);
    Buffer bytes = got->segments.at(0);
    EXPECT_EQ(bytes.data()[0], w + 1);
    EXPECT_EQ(bytes.data()[got->size - 1], w + 1);
  }
}

TEST_P(ConditionalWriteTest, ARefusedWriteLeavesTheKeyAsItWas) {
  ASSERT_TRUE(store_->Put("b", "k", Filled(100, 7)).ok());
  auto before = store_->Get("b", "k");
  ASSERT_TRUE(before.ok());
  Status s = store_->Put("b", "k", Filled(200, 9), Absent());
  EXPECT_EQ(S3ErrorCode(s), "PreconditionFailed");
  auto after = store_->Get("b", "k");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->size, 100u);
  EXPECT_EQ(after->etag, before->etag);
  EXPECT_EQ(after->segments.at(0).data()[0], 7);
  // The test sees the current object's ETag: a compare-and-swap.
  const std::string etag = before->etag;
  auto same_etag = [&](const s3::ObjectEntry* current) {
    return current && current->etag == etag ? Status::OK()
                                            : s3::S3Error("PreconditionFailed", "changed");
  };
  ASSERT_TRUE(store_->Put("b", "k", Filled(300, 5), same_etag).ok());
  EXPECT_EQ(S3ErrorCode(store_->Put("b", "k", Filled(400, 3), same_etag)), "PreconditionFailed");
  EXPECT_EQ(store_->Get("b", "k")->size, 300u);
  if (GetParam() == "dir") {
    // Nothing of the refused writes is left behind.
    size_t tmp = 0;
    for (const auto& e : std::filesystem::directory_iterator(root_ / "b" / ".xsilo-tmp")) {
      (void)e;
      ++tmp;
    }
    EXPECT_EQ(tmp, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, ConditionalWriteTest, ::testing::Values("memory", "dir"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace xsilo
