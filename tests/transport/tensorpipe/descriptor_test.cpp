// The tensorpipe descriptor on its own: round trip, and rejection of bad
// input before any allocation sized by it.
#include "transport/tensorpipe/descriptor.h"

#include <gtest/gtest.h>

#include <cstring>

#include "transport/test_util.h"
#include "xsilo/core/codec.h"

namespace xsilo::tplink {
namespace {

std::vector<uint64_t> Lengths(const OutgoingPlan& plan) {
  std::vector<uint64_t> out;
  for (const auto& p : plan.pieces) out.push_back(p.length);
  return out;
}

TEST(TensorPipeDescriptor, RoundTripsHeaderAndSplitsPieces) {
  Message m = testing::PatternMessage((3 << 20) + 5, 11, 7);
  m.type = "model";
  m.params["lr"] = 0.5;
  m.tensors.emplace("empty", std::move(Tensor::Zeros(DType::kF32, {0, 4})).value());
  OutgoingPlan out = PlanOutgoing(m, 1 << 20, true);
  ASSERT_EQ(out.pieces.size(), 4u);  // 3 MiB + 5 B in 1 MiB pieces; the empty tensor has none
  auto in = PlanIncoming(out.metadata, Lengths(out), 1ull << 40);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ASSERT_EQ(in->pieces.size(), 4u);
  for (size_t i = 0; i < out.pieces.size(); ++i)
    std::memcpy(in->pieces[i].data, out.pieces[i].data, out.pieces[i].length);
  EXPECT_TRUE(VerifyIncoming(*in).ok());
  EXPECT_EQ(in->message.type, "model");
  EXPECT_EQ(in->message.round, 7);
  EXPECT_EQ(*in->message.GetDouble("lr"), 0.5);
  EXPECT_TRUE(in->message.tensors.at("w").data.IsAligned());
  EXPECT_EQ(in->message.tensors.at("empty").shape, (std::vector<int64_t>{0, 4}));
  EXPECT_TRUE(testing::PatternIntact(in->message));
  in->pieces[2].data[9] ^= 1;
  EXPECT_EQ(VerifyIncoming(*in).code(), StatusCode::kCorrupt);
}

TEST(TensorPipeDescriptor, RejectsSizesAboveTheLimit) {
  Message m = testing::PatternMessage(4096, 1);
  OutgoingPlan out = PlanOutgoing(m, 1 << 20, false);
  auto in = PlanIncoming(out.metadata, Lengths(out), 1024);
  EXPECT_EQ(in.status().code(), StatusCode::kResourceExhausted);
}

// The descriptor of `out` with its tensor table replaced by one tensor "t"
// of u8[n] bytes in `pieces` pieces (the sender writes what it likes).
std::string WithTable(const OutgoingPlan& out, uint64_t n, uint32_t pieces) {
  auto prefix = ParseFramePrefix(
      {reinterpret_cast<const uint8_t*>(out.metadata.data()) + 4, out.metadata.size() - 4});
  EXPECT_TRUE(prefix.ok());
  std::string md = out.metadata.substr(0, 4 + prefix->frame_size());
  auto put = [&](const auto& v) { md.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(uint32_t{1});
  put(uint32_t{1});
  md += "t";
  put(static_cast<uint8_t>(DType::kU8));
  put(uint32_t{1});
  put(static_cast<int64_t>(n));
  put(n);
  put(uint64_t{0});
  put(pieces);
  return md;
}

// A peer announcing a 2^62-byte tensor (or 2^63-1, the largest dimension)
// is refused before anything is allocated for it.
TEST(TensorPipeDescriptor, AHugeClaimIsRefusedBeforeAllocation) {
  OutgoingPlan out = PlanOutgoing(testing::PatternMessage(4096, 1), 1 << 20, false);
  const uint64_t live = Buffer::LiveAllocatedBytes();
  Buffer::ResetPeakAllocatedBytes();
  for (uint64_t n : {uint64_t{1} << 62, (uint64_t{1} << 63) - 1, uint64_t{64} << 20}) {
    auto in = PlanIncoming(WithTable(out, n, 1), {n}, 1 << 20);
    EXPECT_EQ(in.status().code(), StatusCode::kResourceExhausted) << in.status().ToString();
    if (n > (1ull << 40)) {  // against the default limit, split in two pieces
      in = PlanIncoming(WithTable(out, n, 2), {n / 2, n - n / 2}, 1ull << 40);
      EXPECT_EQ(in.status().code(), StatusCode::kResourceExhausted) << in.status().ToString();
    }
  }
  EXPECT_LT(Buffer::PeakAllocatedBytes(), live + (1 << 20));
}

// Piece lengths come from the peer too: lengths whose sum wraps around to
// the tensor's size must not pass, or a piece would land past its buffer.
TEST(TensorPipeDescriptor, PieceLengthsThatWrapAroundAreRefused) {
  OutgoingPlan out = PlanOutgoing(testing::PatternMessage(4096, 1), 1 << 20, false);
  const uint64_t half = uint64_t{1} << 63;
  auto in = PlanIncoming(WithTable(out, 4096, 2), {2048 + half, 2048 + half}, 1ull << 40);
  EXPECT_EQ(in.status().code(), StatusCode::kCorrupt) << in.status().ToString();
  in = PlanIncoming(WithTable(out, 4096, 2), {8192, ~uint64_t{0} - 4095}, 1ull << 40);
  EXPECT_EQ(in.status().code(), StatusCode::kCorrupt) << in.status().ToString();
  in = PlanIncoming(WithTable(out, 4096, 2), {1024, 3072}, 1ull << 40);
  ASSERT_TRUE(in.ok()) << in.status().ToString();  // the honest split still parses
  ASSERT_EQ(in->pieces.size(), 2u);
  EXPECT_EQ(in->pieces[1].data - in->pieces[0].data, 1024);
}

TEST(TensorPipeDescriptor, RejectsPiecesThatDisagreeWithTheTable) {
  Message m = testing::PatternMessage(4096, 1);
  OutgoingPlan out = PlanOutgoing(m, 1 << 20, false);
  EXPECT_EQ(PlanIncoming(out.metadata, {4095}, 1ull << 40).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(PlanIncoming(out.metadata, {4096, 1}, 1ull << 40).status().code(),
            StatusCode::kCorrupt);
  EXPECT_EQ(PlanIncoming(out.metadata, {}, 1ull << 40).status().code(), StatusCode::kCorrupt);
}

TEST(TensorPipeDescriptor, EveryTruncationAndByteFlipFailsCleanly) {
  Message m = testing::PatternMessage(64, 3);
  m.tensors.emplace("b", std::move(Tensor::Zeros(DType::kI64, {2, 2})).value());
  OutgoingPlan out = PlanOutgoing(m, 1 << 20, true);
  const auto lengths = Lengths(out);
  for (size_t n = 0; n < out.metadata.size(); ++n) {
    EXPECT_FALSE(
        PlanIncoming(std::string_view(out.metadata).substr(0, n), lengths, 1ull << 40).ok())
        << "truncated to " << n;
  }
  // Flipped bytes must never crash or allocate beyond the limit; most are rejected.
  for (size_t i = 0; i < out.metadata.size(); ++i) {
    std::string bad = out.metadata;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    (void)PlanIncoming(bad, lengths, 1 << 20);
  }
  EXPECT_FALSE(PlanIncoming("garbage", lengths, 1ull << 40).ok());
}

}  // namespace
}  // namespace xsilo::tplink
