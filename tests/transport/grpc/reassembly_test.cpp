// Receive-side validation of the gRPC link protocol, without gRPC.
#include "transport/grpc/reassembly.h"

#include <gtest/gtest.h>

#include <cstring>

#include "transport/test_util.h"
#include "xsilo/core/codec.h"

namespace xsilo::grpclink {
namespace {

// A real encoded frame, flattened, to cut into chunks.
Buffer FrameBytes(uint64_t payload, uint64_t seed) {
  EncodedFrame f = EncodeMessage(testing::PatternMessage(payload, seed));
  return std::move(f.bytes.Flatten()).value();
}

std::span<const uint8_t> Piece(const Buffer& b, uint64_t off, uint64_t len) {
  return b.span().subspan(off, len);
}

TEST(Reassembly, InOrderChunksMakeTheFrame) {
  Buffer f = FrameBytes(10000, 1);
  Reassembler r({}, 1);
  std::vector<Reassembled> ready;
  for (uint64_t off = 0; off < f.size(); off += 1024) {
    uint64_t len = std::min<uint64_t>(1024, f.size() - off);
    ASSERT_TRUE(r.OnChunk(0, 1, off, f.size(), Piece(f, off, len), &ready).ok());
  }
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_TRUE(ready[0].status.ok());
  ASSERT_EQ(ready[0].frame.size(), f.size());
  EXPECT_EQ(std::memcmp(ready[0].frame.data(), f.data(), f.size()), 0);
  EXPECT_TRUE(DecodeMessage(ready[0].frame).ok());
  EXPECT_EQ(r.open_messages(), 0u);
}

TEST(Reassembly, StripedOutOfOrderChunksAndMessagesReleaseInIdOrder) {
  Buffer a = FrameBytes(5000, 2), b = FrameBytes(300, 3);
  Reassembler r({}, 2);
  std::vector<Reassembled> ready;
  // Stream 1 carries a's tail and all of b; stream 0 carries a's head last.
  ASSERT_TRUE(r.OnChunk(1, 1, 2048, a.size(), Piece(a, 2048, a.size() - 2048), &ready).ok());
  ASSERT_TRUE(r.OnChunk(1, 2, 0, b.size(), Piece(b, 0, b.size()), &ready).ok());
  EXPECT_TRUE(ready.empty()) << "message 2 must wait for message 1";
  ASSERT_TRUE(r.OnChunk(0, 1, 0, a.size(), Piece(a, 0, 2048), &ready).ok());
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].message_id, 1u);
  EXPECT_EQ(ready[1].message_id, 2u);
  EXPECT_TRUE(ready[0].status.ok() && ready[1].status.ok());
}

// The payload checksum is computed while chunks arrive, whatever their
// order and however each chunk is split into pieces, and equals the one the
// sender put in the prefix. Without the prefix whole in the first chunk
// there is none, and decoding hashes the payload itself.
TEST(Reassembly, PayloadChecksumIsComputedOnTheWayIn) {
  Buffer f = FrameBytes(700000, 5);
  auto prefix = ParseFramePrefix(f.span());
  ASSERT_TRUE(prefix.ok());
  const uint64_t third = f.size() / 3;
  std::vector<Reassembled> ready;
  {
    Reassembler r({}, 1);
    for (uint64_t off = 0; off < f.size(); off += 65536) {
      const uint64_t len = std::min<uint64_t>(65536, f.size() - off);
      const std::span<const uint8_t> pieces[3] = {Piece(f, off, 7), Piece(f, off + 7, len / 2 - 7),
                                                  Piece(f, off + len / 2, len - len / 2)};
      ASSERT_TRUE(r.OnChunk(0, 1, off, f.size(), ChunkPieces(pieces), &ready).ok());
    }
  }
  {
    Reassembler r({}, 2);  // the tail first, then the head fills the gap
    ASSERT_TRUE(
        r.OnChunk(1, 1, 2 * third, f.size(), Piece(f, 2 * third, f.size() - 2 * third), &ready)
            .ok());
    ASSERT_TRUE(r.OnChunk(0, 1, 0, f.size(), Piece(f, 0, third), &ready).ok());
    ASSERT_TRUE(r.OnChunk(1, 1, third, f.size(), Piece(f, third, third), &ready).ok());
  }
  {
    Reassembler r({}, 1);  // a first chunk shorter than the prefix
    ASSERT_TRUE(r.OnChunk(0, 1, 0, f.size(), Piece(f, 0, 16), &ready).ok());
    ASSERT_TRUE(r.OnChunk(0, 1, 16, f.size(), Piece(f, 16, f.size() - 16), &ready).ok());
  }
  ASSERT_EQ(ready.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(ready[i].status.ok());
    ASSERT_TRUE(ready[i].payload_checksum.has_value()) << i;
    EXPECT_EQ(*ready[i].payload_checksum, prefix->payload_checksum) << i;
    EXPECT_EQ(std::memcmp(ready[i].frame.data(), f.data(), f.size()), 0) << i;
  }
  EXPECT_FALSE(ready[2].payload_checksum.has_value());
  EXPECT_TRUE(DecodeMessage(ready[2].frame).ok());
}

// A payload of several checksum blocks, chunks cut across block edges and
// arriving out of order: the checksum computed on the way equals the
// prefix's.
TEST(Reassembly, AMultiBlockPayloadIsHashedOnTheWay) {
  Buffer f = FrameBytes(3 * (1ull << 20) + 4321, 9);
  auto prefix = ParseFramePrefix(f.span());
  ASSERT_TRUE(prefix.ok());
  Reassembler r({}, 2);
  std::vector<Reassembled> ready;
  const uint64_t cut = 999999;  // not a multiple of anything
  std::vector<uint64_t> offsets;
  for (uint64_t off = 0; off < f.size(); off += cut) offsets.push_back(off);
  std::swap(offsets[1], offsets[2]);  // the third chunk before the second
  for (uint64_t off : offsets) {
    const uint64_t len = std::min(cut, f.size() - off);
    ASSERT_TRUE(
        r.OnChunk(static_cast<int>(off / cut % 2), 1, off, f.size(), Piece(f, off, len), &ready)
            .ok());
  }
  ASSERT_EQ(ready.size(), 1u);
  ASSERT_TRUE(ready[0].status.ok()) << ready[0].status.ToString();
  ASSERT_TRUE(ready[0].payload_checksum.has_value());
  EXPECT_EQ(*ready[0].payload_checksum, prefix->payload_checksum);
  DecodeLimits known;
  known.payload_checksum = ready[0].payload_checksum;
  EXPECT_TRUE(DecodeMessage(ready[0].frame, known).ok());
}

// Prefix last (the sender hashed while the payload went out): the chunks
// carry the payload offset, so the payload is hashed as it arrives, before
// the prefix that holds its checksum; a flipped byte is then caught by
// comparing that sum with the prefix's.
TEST(Reassembly, APrefixLastFrameIsHashedBeforeItsPrefixArrives) {
  Buffer f = FrameBytes(3 * (1ull << 20) + 777, 12);
  auto prefix = ParseFramePrefix(f.span());
  ASSERT_TRUE(prefix.ok());
  const uint64_t head = prefix->payload_offset();
  auto send = [&](Reassembler& r, const Buffer& bytes, std::vector<Reassembled>* ready) {
    const uint64_t cut = 300000;
    for (uint64_t off = head; off < bytes.size(); off += cut) {
      const uint64_t len = std::min(cut, bytes.size() - off);
      ASSERT_TRUE(r.OnChunk(0, 1, off, bytes.size(), Piece(bytes, off, len), ready, head).ok());
      ASSERT_TRUE(ready->empty());
    }
    ASSERT_TRUE(r.OnChunk(0, 1, 0, bytes.size(), Piece(bytes, 0, head), ready, head).ok());
  };
  std::vector<Reassembled> ready;
  Reassembler r({}, 1);
  send(r, f, &ready);
  ASSERT_EQ(ready.size(), 1u);
  ASSERT_TRUE(ready[0].status.ok()) << ready[0].status.ToString();
  ASSERT_TRUE(ready[0].payload_checksum.has_value());
  EXPECT_EQ(*ready[0].payload_checksum, prefix->payload_checksum);
  EXPECT_EQ(std::memcmp(ready[0].frame.data(), f.data(), f.size()), 0);

  Buffer bad = std::move(Buffer::Allocate(f.size())).value();
  std::memcpy(bad.mutable_data(), f.data(), f.size());
  bad.mutable_data()[head + 2 * (1 << 20) + 5] ^= 0x10;
  Reassembler r2({}, 1);
  std::vector<Reassembled> got;
  send(r2, bad, &got);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0].payload_checksum.has_value());
  DecodeLimits known;
  known.payload_checksum = got[0].payload_checksum;
  auto decoded = DecodeMessage(got[0].frame, known);
  EXPECT_EQ(decoded.status().code(), StatusCode::kCorrupt) << decoded.status().ToString();
}

// A payload offset that is impossible, changes between chunks, or
// disagrees with the prefix drops the message with Corrupt.
TEST(Reassembly, AWrongPayloadOffsetDropsTheMessage) {
  Buffer f = FrameBytes(100000, 13);
  auto prefix = ParseFramePrefix(f.span());
  ASSERT_TRUE(prefix.ok());
  const uint64_t head = prefix->payload_offset(), size = f.size();
  struct Case {
    const char* what;
    std::vector<std::pair<uint64_t, uint64_t>> chunks;  // offset, payload offset
    const char* error;
  } cases[] = {
      {"below the prefix", {{head, 8}}, "outside its frame"},
      {"beyond the frame", {{head, size + 1}}, "outside its frame"},
      {"changes", {{head, head}, {head + 1000, head + 64}}, "earlier chunks at"},
      {"disagrees with the prefix", {{head + 64, head + 64}, {0, head + 64}}, "frame prefix puts"},
  };
  for (const Case& c : cases) {
    Reassembler r({}, 1);
    std::vector<Reassembled> ready;
    uint64_t at = c.chunks.front().first;
    for (auto [off, po] : c.chunks) {
      const uint64_t len = off == 0 ? at : (off == c.chunks.front().first ? 1000 : 2000);
      ASSERT_TRUE(r.OnChunk(0, 1, off, size, Piece(f, off, len), &ready, po).ok()) << c.what;
    }
    ASSERT_EQ(ready.size(), 1u) << c.what;
    EXPECT_EQ(ready[0].status.code(), StatusCode::kCorrupt) << c.what;
    EXPECT_NE(ready[0].status.message().find(c.error), std::string::npos)
        << c.what << ": " << ready[0].status.ToString();
    EXPECT_EQ(r.open_bytes(), 0u) << c.what;
  }
}

TEST(Reassembly, ChunkBeyondTotalDropsTheMessage) {
  Buffer f = FrameBytes(4000, 4);
  Reassembler r({}, 1);
  std::vector<Reassembled> ready;
  ASSERT_TRUE(r.OnChunk(0, 1, 0, f.size(), Piece(f, 0, 100), &ready).ok());
  ASSERT_TRUE(r.OnChunk(0, 1, f.size() - 10, f.size(), Piece(f, 0, 100), &ready).ok());
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].status.code(), StatusCode::kCorrupt);
  EXPECT_NE(ready[0].status.message().find("exceeds the announced total"), std::string::npos)
      << ready[0].status.ToString();
  EXPECT_TRUE(ready[0].frame.empty());
  EXPECT_EQ(r.open_bytes(), 0u) << "the partial buffer must be freed";
  // Later chunks of the dropped message are ignored; the next message works.
  ready.clear();
  ASSERT_TRUE(r.OnChunk(0, 1, 100, f.size(), Piece(f, 100, 100), &ready).ok());
  EXPECT_TRUE(ready.empty());
  ASSERT_TRUE(r.OnChunk(0, 2, 0, f.size(), Piece(f, 0, f.size()), &ready).ok());
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_TRUE(ready[0].status.ok());
}

TEST(Reassembly, OffsetPastTotalDoesNotWrapAround) {
  Reassembler r({}, 1);
  std::vector<Reassembled> ready;
  uint8_t bytes[16] = {};
  ASSERT_TRUE(r.OnChunk(0, 1, ~uint64_t{0} - 4, 1000, bytes, &ready).ok());
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].status.code(), StatusCode::kCorrupt);
}

TEST(Reassembly, TotalAboveLimitFailsBeforeAllocating) {
  ReassemblyLimits limits;
  limits.max_message_bytes = 1 << 20;
  Reassembler r(limits, 1);
  std::vector<Reassembled> ready;
  uint8_t bytes[64] = {};
  const uint64_t live = Buffer::LiveAllocatedBytes();
  ASSERT_TRUE(r.OnChunk(0, 1, 0, uint64_t{1} << 50, bytes, &ready).ok());
  EXPECT_EQ(Buffer::LiveAllocatedBytes(), live);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(ready[0].status.message().find("max_message_bytes"), std::string::npos);
}

TEST(Reassembly, DuplicateChunkDropsTheMessage) {
  Buffer f = FrameBytes(4000, 5);
  Reassembler r({}, 1);
  std::vector<Reassembled> ready;
  ASSERT_TRUE(r.OnChunk(0, 1, 0, f.size(), Piece(f, 0, 1000), &ready).ok());
  ASSERT_TRUE(r.OnChunk(0, 1, 1000, f.size(), Piece(f, 1000, 1000), &ready).ok());
  ASSERT_TRUE(r.OnChunk(0, 1, 1500, f.size(), Piece(f, 1500, 1000), &ready).ok());
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].status.code(), StatusCode::kCorrupt);
  EXPECT_NE(ready[0].status.message().find("duplicate chunk"), std::string::npos);
  EXPECT_EQ(r.open_bytes(), 0u);
}

TEST(Reassembly, ChunkOfFinishedMessageIsADuplicate) {
  Buffer f = FrameBytes(100, 6);
  Reassembler r({}, 1);
  std::vector<Reassembled> ready;
  ASSERT_TRUE(r.OnChunk(0, 1, 0, f.size(), Piece(f, 0, f.size()), &ready).ok());
  Status s = r.OnChunk(0, 1, 0, f.size(), Piece(f, 0, f.size()), &ready);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("duplicate"), std::string::npos);
}

TEST(Reassembly, MissingChunkIsDetectedWhenTheStreamMovesOn) {
  Buffer f = FrameBytes(4000, 7);
  Reassembler r({}, 1);
  std::vector<Reassembled> ready;
  ASSERT_TRUE(r.OnChunk(0, 1, 0, f.size(), Piece(f, 0, 1000), &ready).ok());
  // 1000..2000 never comes; the stream continues with the rest, then message 2.
  ASSERT_TRUE(r.OnChunk(0, 1, 2000, f.size(), Piece(f, 2000, f.size() - 2000), &ready).ok());
  EXPECT_TRUE(ready.empty());
  ASSERT_TRUE(r.OnChunk(0, 2, 0, f.size(), Piece(f, 0, f.size()), &ready).ok());
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].status.code(), StatusCode::kCorrupt);
  EXPECT_NE(ready[0].status.message().find("missing chunk"), std::string::npos);
  EXPECT_TRUE(ready[1].status.ok());
  EXPECT_EQ(r.open_bytes(), 0u);
}

TEST(Reassembly, SkippedMessageIdIsReportedMissing) {
  Buffer f = FrameBytes(100, 8);
  Reassembler r({}, 1);
  std::vector<Reassembled> ready;
  ASSERT_TRUE(r.OnChunk(0, 2, 0, f.size(), Piece(f, 0, f.size()), &ready).ok());
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].message_id, 1u);
  EXPECT_EQ(ready[0].status.code(), StatusCode::kCorrupt);
  EXPECT_TRUE(ready[1].status.ok());
}

TEST(Reassembly, FarAheadIdAndTooManyOpenMessagesAreBounded) {
  ReassemblyLimits limits;
  limits.max_open_messages = 2;
  limits.id_window = 8;
  Reassembler r(limits, 4);  // several streams: nothing is declared missing
  std::vector<Reassembled> ready;
  Buffer f = FrameBytes(1000, 9);
  EXPECT_EQ(r.OnChunk(0, 100, 0, f.size(), Piece(f, 0, 64), &ready).code(), StatusCode::kCorrupt);
  ASSERT_TRUE(r.OnChunk(0, 1, 0, f.size(), Piece(f, 0, 64), &ready).ok());
  ASSERT_TRUE(r.OnChunk(1, 2, 0, f.size(), Piece(f, 0, 64), &ready).ok());
  ASSERT_TRUE(r.OnChunk(2, 3, 0, f.size(), Piece(f, 0, 64), &ready).ok());
  EXPECT_EQ(r.open_messages(), 2u);
  ASSERT_TRUE(r.OnChunk(0, 1, 64, f.size(), Piece(f, 64, f.size() - 64), &ready).ok());
  ASSERT_TRUE(r.OnChunk(1, 2, 64, f.size(), Piece(f, 64, f.size() - 64), &ready).ok());
  ASSERT_EQ(ready.size(), 3u);
  EXPECT_EQ(ready[2].status.code(), StatusCode::kResourceExhausted);
}

TEST(Reassembly, BadPrefixIsRejectedOnTheFirstChunk) {
  Buffer f = FrameBytes(1000, 10);
  Buffer bad = Buffer::CopyFrom(f.data(), f.size());
  bad.mutable_data()[0] ^= 0xff;  // magic
  Reassembler r({}, 1);
  std::vector<Reassembled> ready;
  ASSERT_TRUE(r.OnChunk(0, 1, 0, bad.size(), Piece(bad, 0, 512), &ready).ok());
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].status.code(), StatusCode::kCorrupt);
}

TEST(Reassembly, ResetFreesPartialMessages) {
  Buffer f = FrameBytes(1 << 20, 11);
  Reassembler r({}, 1);
  std::vector<Reassembled> ready;
  ASSERT_TRUE(r.OnChunk(0, 1, 0, f.size(), Piece(f, 0, 4096), &ready).ok());
  EXPECT_EQ(r.open_bytes(), f.size());
  r.Reset();
  EXPECT_EQ(r.open_bytes(), 0u);
  ASSERT_TRUE(r.OnChunk(0, 1, 0, f.size(), Piece(f, 0, f.size()), &ready).ok());
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_TRUE(ready[0].status.ok());
}

}  // namespace
}  // namespace xsilo::grpclink
