#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/json_depth.h"
#include "xsilo/core/codec.h"

namespace xsilo {
namespace {

Tensor Iota(DType dtype, std::vector<int64_t> shape) {
  Tensor t = *Tensor::Zeros(dtype, std::move(shape));
  for (uint64_t i = 0; i < t.nbytes(); ++i) t.data.mutable_data()[i] = static_cast<uint8_t>(i * 7);
  return t;
}

Message Sample() {
  Message m;
  m.type = "model";
  m.round = 3;
  m.sender = 0;
  m.receivers = {1, 2};
  m.params["lr"] = 0.01;
  m.params["name"] = std::string("mlp");
  m.params["blob"] = Bytes{9, 8, 7};
  m.tensors.emplace("a.bias", Iota(DType::kI8, {3}));
  m.tensors.emplace("a.weight", Iota(DType::kF32, {4, 5}));
  m.tensors.emplace("b.weight", Iota(DType::kF64, {2, 2}));
  m.tensors.emplace("flags", Iota(DType::kBool, {0}));
  return m;
}

Buffer Encode(const Message& m) { return *EncodeMessage(m).bytes.Flatten(); }

TEST(Codec, RoundTripIsZeroCopy) {
  Message m = Sample();
  EncodedFrame frame = EncodeMessage(m);
  // The tensors' own buffers are in the gather list, not copies.
  bool found = false;
  for (const Buffer& seg : frame.bytes.segments)
    found |= seg.data() == m.tensors.at("a.weight").data.data();
  EXPECT_TRUE(found);
  Buffer flat = *frame.bytes.Flatten();
  auto d = DecodeMessage(flat);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->type, "model");
  EXPECT_EQ(d->round, 3);
  EXPECT_EQ(d->receivers, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(*d->GetDouble("lr"), 0.01);
  EXPECT_EQ(*d->GetBytes("blob"), (Bytes{9, 8, 7}));
  ASSERT_EQ(d->tensors.size(), 4u);
  for (const auto& [name, t] : m.tensors) {
    const Tensor& got = d->tensors.at(name);
    EXPECT_EQ(got.dtype, t.dtype) << name;
    EXPECT_EQ(got.shape, t.shape) << name;
    ASSERT_EQ(got.nbytes(), t.nbytes()) << name;
    if (got.nbytes() > 0) {
      // (memcmp of an empty tensor would pass it null pointers: UBSan.)
      EXPECT_EQ(0, std::memcmp(got.data.data(), t.data.data(), t.nbytes())) << name;
      EXPECT_TRUE(got.data.SharesStorageWith(flat)) << name << " was copied on decode";
      EXPECT_EQ(reinterpret_cast<uintptr_t>(got.data.data()) % DTypeSize(got.dtype), 0u);
    }
  }
}

TEST(Codec, PayloadIsASafetensorsFile) {
  Message m = Sample();
  EncodedFrame frame = EncodeMessage(m);
  Buffer flat = *frame.bytes.Flatten();
  Buffer payload = flat.SliceUnchecked(frame.payload_offset, flat.size() - frame.payload_offset);
  uint64_t n = 0;
  std::memcpy(&n, payload.data(), 8);
  EXPECT_EQ((8 + n) % 64, 0u) << "data region aligned to 64";
  auto h = nlohmann::json::parse(payload.data() + 8, payload.data() + 8 + n);
  EXPECT_EQ(h["a.weight"]["dtype"], "F32");
  EXPECT_EQ(h["a.weight"]["shape"], nlohmann::json::array({4, 5}));
  // Largest elements first: F64 at offset 0.
  EXPECT_EQ(h["b.weight"]["data_offsets"], nlohmann::json::array({0, 32}));
  EXPECT_EQ(frame.payload_offset % 64, 0u);
  auto tensors = DecodeSafetensors(payload);
  ASSERT_TRUE(tensors.ok()) << tensors.status().ToString();
  EXPECT_EQ(tensors->size(), 4u);
  EXPECT_EQ(PayloadChecksum(payload.span()), frame.payload_checksum);
}

TEST(Codec, EmptyMessage) {
  Message m;
  auto d = DecodeMessage(Encode(m));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->tensors.empty());
}

TEST(Codec, NonFiniteDoublesSurvive) {
  Message m;
  m.params["inf"] = HUGE_VAL;
  m.params["nan"] = std::nan("");
  auto d = DecodeMessage(Encode(m));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(std::isinf(*d->GetDouble("inf")));
  EXPECT_TRUE(std::isnan(*d->GetDouble("nan")));
}

TEST(Codec, PrefixAnnouncesFrameSize) {
  Buffer flat = Encode(Sample());
  auto p = ParseFramePrefix(flat.span());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->frame_size(), flat.size());
  DecodeLimits tight;
  tight.max_payload_bytes = 16;
  EXPECT_EQ(ParseFramePrefix(flat.span(), tight).status().code(), StatusCode::kResourceExhausted);
}

// ---- every decode failure is a clear Status ----

void ExpectCorrupt(const Buffer& b, const std::string& needle, const DecodeLimits& limits = {}) {
  auto d = DecodeMessage(b, limits);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kCorrupt) << d.status().ToString();
  EXPECT_NE(d.status().message().find(needle), std::string::npos) << d.status().ToString();
}

TEST(CodecErrors, TruncatedFrame) {
  Buffer flat = Encode(Sample());
  ExpectCorrupt(flat.SliceUnchecked(0, 10), "truncated");
  ExpectCorrupt(flat.SliceUnchecked(0, flat.size() - 1), "size mismatch");
}

TEST(CodecErrors, BadMagicAndVersion) {
  Buffer flat = Encode(Sample());
  Buffer copy = Buffer::CopyFrom(flat.data(), flat.size());
  copy.mutable_data()[0] ^= 0xff;
  ExpectCorrupt(copy, "magic");
  copy = Buffer::CopyFrom(flat.data(), flat.size());
  copy.mutable_data()[4] = 9;
  ExpectCorrupt(copy, "version");
}

TEST(CodecErrors, HeaderLengthBeyondInput) {
  Buffer copy = Encode(Sample());
  uint64_t huge = uint64_t{1} << 40;
  std::memcpy(copy.mutable_data() + 8, &huge, 8);
  auto d = DecodeMessage(copy);
  EXPECT_EQ(d.status().code(), StatusCode::kCorrupt);
}

// A frame prefix claiming 2^62 payload bytes (or 2^64-1) is refused by the
// prefix parser every transport calls before allocating, and by the decoder;
// a header length of 2^62 cannot wrap the payload offset around.
TEST(CodecErrors, HugeClaimsAreRefusedBeforeAllocation) {
  Buffer flat = Encode(Sample());
  const uint64_t live = Buffer::LiveAllocatedBytes();
  Buffer::ResetPeakAllocatedBytes();
  for (uint64_t claim : {uint64_t{1} << 62, ~uint64_t{0}, (uint64_t{1} << 42) + 1}) {
    Buffer copy = Buffer::CopyFrom(flat.data(), flat.size());
    std::memcpy(copy.mutable_data() + 16, &claim, 8);
    EXPECT_EQ(ParseFramePrefix(copy.span()).status().code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(DecodeMessage(copy).status().code(), StatusCode::kResourceExhausted);
    copy = Buffer::CopyFrom(flat.data(), flat.size());
    std::memcpy(copy.mutable_data() + 8, &claim, 8);
    EXPECT_EQ(DecodeMessage(copy).status().code(), StatusCode::kCorrupt);
  }
  // Two copies of the sample frame, nothing sized by a claim.
  EXPECT_LE(Buffer::PeakAllocatedBytes(), live + 2 * flat.size() + 8192);
}

TEST(CodecErrors, ChecksumMismatch) {
  Message m = Sample();
  EncodedFrame f = EncodeMessage(m);
  Buffer copy = *f.bytes.Flatten();
  copy.mutable_data()[copy.size() - 1] ^= 1;
  ExpectCorrupt(copy, "checksum");
  DecodeLimits no_verify;
  no_verify.verify_checksum = false;
  EXPECT_TRUE(DecodeMessage(copy, no_verify).ok());
}

// A checksum computed while the bytes arrived replaces the second pass: a
// wrong one is a mismatch, the right one decodes.
TEST(CodecErrors, PrecomputedChecksumIsCompared) {
  EncodedFrame f = EncodeMessage(Sample());
  Buffer flat = *f.bytes.Flatten();
  PayloadChecksumStream pieces(flat.size() - f.payload_offset);
  const uint64_t half = f.payload_offset + (flat.size() - f.payload_offset) / 2;
  pieces.Update(flat.span().subspan(f.payload_offset, half - f.payload_offset));
  pieces.Update(flat.span().subspan(half));
  EXPECT_EQ(pieces.Digest(), f.payload_checksum);
  DecodeLimits known;
  known.payload_checksum = pieces.Digest();
  EXPECT_TRUE(DecodeMessage(flat, known).ok());
  known.payload_checksum = pieces.Digest() ^ 1;
  ExpectCorrupt(flat, "checksum", known);
}

// Builds a safetensors payload from a raw header string and data size.
Buffer RawPayload(const std::string& header, uint64_t data_bytes) {
  Buffer b = *Buffer::AllocateZeroed(8 + header.size() + data_bytes);
  uint64_t n = header.size();
  std::memcpy(b.mutable_data(), &n, 8);
  std::memcpy(b.mutable_data() + 8, header.data(), header.size());
  return b;
}

void ExpectPayloadCorrupt(const std::string& header, uint64_t data_bytes,
                          const std::string& needle) {
  auto t = DecodeSafetensors(RawPayload(header, data_bytes));
  ASSERT_FALSE(t.ok()) << header;
  EXPECT_EQ(t.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().ToString();
}

TEST(CodecErrors, SafetensorsValidation) {
  ExpectPayloadCorrupt("{not json", 0, "JSON");
  ExpectPayloadCorrupt("[1,2]", 0, "JSON object");
  ExpectPayloadCorrupt(R"({"x":{"dtype":"F7","shape":[1],"data_offsets":[0,4]}})", 4, "dtype");
  ExpectPayloadCorrupt(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4, "disagree");
  ExpectPayloadCorrupt(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "negative");
  ExpectPayloadCorrupt(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", 4, "outside");
  ExpectPayloadCorrupt(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4, "outside");
  ExpectPayloadCorrupt(
      R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
      8, "overlaps");
  ExpectPayloadCorrupt(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "hole");
  ExpectPayloadCorrupt(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 6, "trailing");
  ExpectPayloadCorrupt(R"({"x":{"dtype":"F32","shape":[1]}})", 4, "data_offsets");
  ExpectPayloadCorrupt(R"({"__metadata__":{"k":1}})", 0, "__metadata__");
  // Shape product overflowing 64 bits must not wrap into a valid size.
  ExpectPayloadCorrupt(
      R"({"x":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0,
      "disagree");
}

TEST(CodecErrors, SafetensorsHeaderLengthChecks) {
  Buffer tiny = *Buffer::AllocateZeroed(4);
  EXPECT_EQ(DecodeSafetensors(tiny).status().code(), StatusCode::kCorrupt);
  Buffer b = RawPayload("{}", 0);
  uint64_t n = 1000;
  std::memcpy(b.mutable_data(), &n, 8);
  EXPECT_NE(DecodeSafetensors(b).status().message().find("runs past"), std::string::npos);
  DecodeLimits limits;
  limits.max_header_bytes = 1;
  EXPECT_NE(DecodeSafetensors(RawPayload("{}", 0), limits).status().message().find("limit"),
            std::string::npos);
}

TEST(CodecErrors, MalformedMessageHeader) {
  // Re-encode a frame with a hand-written header and matching checksums.
  auto build = [](const std::string& header) {
    Message empty;
    EncodedFrame f = EncodeMessage(empty);
    Buffer orig = *f.bytes.Flatten();
    Buffer payload = orig.SliceUnchecked(f.payload_offset, orig.size() - f.payload_offset);
    uint64_t off = (kFramePrefixSize + header.size() + 63) / 64 * 64;
    Buffer b = *Buffer::AllocateZeroed(off + payload.size());
    std::memcpy(b.mutable_data(), orig.data(), kFramePrefixSize);
    uint64_t hl = header.size();
    std::memcpy(b.mutable_data() + 8, &hl, 8);
    uint64_t hc = Checksum({reinterpret_cast<const uint8_t*>(header.data()), header.size()});
    std::memcpy(b.mutable_data() + 32, &hc, 8);
    std::memcpy(b.mutable_data() + kFramePrefixSize, header.data(), header.size());
    std::memcpy(b.mutable_data() + off, payload.data(), payload.size());
    return b;
  };
  ExpectCorrupt(build("nope"), "JSON");
  ExpectCorrupt(build(R"({"type":1,"round":0,"sender":0,"receivers":[],"params":{}})"), "type");
  ExpectCorrupt(build(R"({"type":"x","round":0,"sender":0,"receivers":[],"params":{"p":{"q":1}}})"),
                "parameter 'p'");
  ExpectCorrupt(build(R"({"type":"x","round":0,"sender":99999999999,"receivers":[],"params":{}})"),
                "sender");
  ASSERT_TRUE(
      DecodeMessage(build(R"({"type":"x","round":1,"sender":0,"receivers":[2],"params":{}})"))
          .ok());
}

// Block checksums: each block is the XXH3-64 of its bytes wherever the
// gather list's segments cut it, on any number of threads; the digest
// changes with any block.
TEST(BlockChecksums, EachBlockHashesItsBytesAcrossSegmentsOnAnyThreads) {
  std::string bytes(5 * 1000 + 123, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 31 + 7);
  // Segments of odd sizes (and an empty one) that straddle block edges.
  GatherList g;
  for (size_t at = 0, k = 0; at < bytes.size(); ++k) {
    const size_t n = std::min<size_t>(bytes.size() - at, 1 + (k * 977) % 2500);
    g.Append(Buffer::CopyFrom(bytes.data() + at, n));
    g.segments.push_back(Buffer());
    at += n;
  }
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  for (int threads : {1, 2, 3, 8}) {
    const auto sums = BlockChecksums(g, 1000, threads);
    ASSERT_EQ(sums.size(), 6u);
    for (size_t b = 0; b < sums.size(); ++b) {
      const size_t n = std::min<size_t>(1000, bytes.size() - b * 1000);
      EXPECT_EQ(sums[b], Checksum(std::span<const uint8_t>(data + b * 1000, n)))
          << "block " << b << ", " << threads << " threads";
    }
    EXPECT_EQ(BlockChecksums(std::span<const uint8_t>(data, bytes.size()), 1000, threads), sums);
  }
  EXPECT_TRUE(BlockChecksums(GatherList{}, 1000).empty());
  const auto sums = BlockChecksums(g, 1000);
  auto changed = sums;
  changed[3] ^= 1;
  EXPECT_NE(BlockDigest(sums), BlockDigest(changed));
  EXPECT_NE(BlockDigest(sums), BlockDigest(std::span<const uint64_t>(sums).first(5)));
}

TEST(BlockChecksums, BlockSizeKeepsAtMost1024BlocksOfAtLeast1MiB) {
  EXPECT_EQ(BlockBytesFor(0), 1ull << 20);
  EXPECT_EQ(BlockBytesFor(265ull << 20), 1ull << 20);
  EXPECT_EQ(BlockBytesFor(1024ull << 20), 1ull << 20);
  EXPECT_EQ(BlockBytesFor((1024ull << 20) + 1), 2ull << 20);
  const uint64_t big = 5ull << 30;  // over 2 GiB
  const uint64_t b = BlockBytesFor(big);
  EXPECT_LE((big + b - 1) / b, 1024u);
  EXPECT_GT((big + b / 2 - 1) / (b / 2), 1024u);
}

// The frame's payload checksum is the digest of 1 MiB+ block checksums:
// computed at once on any number of threads or fed in pieces of any size,
// it is the same, and a flipped byte in any block changes it.
TEST(PayloadChecksum, WholeThreadedAndStreamedAgree) {
  const uint64_t size = 3 * (1ull << 20) + 12345;  // 4 blocks, the last short
  Buffer b = *Buffer::Allocate(size);
  for (uint64_t i = 0; i < size; ++i) b.mutable_data()[i] = static_cast<uint8_t>(i * 131 + 17);
  const uint64_t whole = PayloadChecksum(b.span(), 1);
  EXPECT_EQ(PayloadChecksum(b.span(), 3), whole);
  EXPECT_EQ(whole, BlockDigest(BlockChecksums(b.span(), 1ull << 20)));
  for (uint64_t piece : {uint64_t{1}, uint64_t{4096}, uint64_t{777777}, size}) {
    PayloadChecksumStream s(size);
    for (uint64_t at = 0; at < size; at += piece) {
      s.Update(b.span().subspan(at, std::min(piece, size - at)));
    }
    EXPECT_EQ(s.Digest(), whole) << "pieces of " << piece;
  }
  b.mutable_data()[2 * (1ull << 20) + 5] ^= 1;
  EXPECT_NE(PayloadChecksum(b.span()), whole);
  EXPECT_EQ(PayloadChecksumStream(0).Digest(), PayloadChecksum(std::span<const uint8_t>()));
}

// A sender sending prefix last: a frame encoded without its checksum,
// hashed block by block in any order (PayloadBlockHasher over
// FramePayload), then patched (SetFramePayloadChecksum), is the frame
// EncodeMessage makes with its checksum, byte for byte.
TEST(PayloadChecksum, AFrameHashedBlockByBlockThenPatchedIsTheHashedFrame) {
  Message m = Sample();
  const uint64_t size = 2 * (1ull << 20) + 999;
  Buffer t = *Buffer::Allocate(size);
  for (uint64_t i = 0; i < size; ++i) t.mutable_data()[i] = static_cast<uint8_t>(i * 7 + 3);
  m.tensors["big"] = Tensor{DType::kU8, {static_cast<int64_t>(size)}, t};
  const Buffer want = *EncodeMessage(m).bytes.Flatten();

  EncodedFrame deferred = EncodeMessage(m, /*checksum=*/false);
  EXPECT_NE(std::memcmp(deferred.bytes.Flatten()->data(), want.data(), 40), 0);
  PayloadBlockHasher hasher(FramePayload(deferred));
  EXPECT_EQ(hasher.size(), want.size() - deferred.payload_offset);
  ASSERT_EQ(hasher.blocks(), 3u);
  for (uint64_t i : {2, 0, 1}) hasher.Hash(i);
  SetFramePayloadChecksum(deferred, hasher.Digest());
  const Buffer got = *deferred.bytes.Flatten();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0);
  EXPECT_TRUE(DecodeMessage(got).ok());
}

// A frame of the previous wire version (whole-payload checksum) is refused
// by its version, with the version named, never misread.
TEST(CodecErrors, PreviousWireVersionIsRefused) {
  Buffer flat = *EncodeMessage(Sample()).bytes.Flatten();
  flat.mutable_data()[4] = 1;
  flat.mutable_data()[5] = 0;
  ExpectCorrupt(flat, "unsupported wire version 1");
}

}  // namespace
// A header nested absurdly deep is refused before it is parsed: nlohmann
// would build the whole tree first (a 63 MiB "[[[...]]]" cost 2.6 GB).
TEST(CodecErrors, AHeaderNestedTooDeepIsRefusedUnparsed) {
  EXPECT_TRUE(core_detail::JsonDepthAtMost("{\"a\":[1,{\"b\":[]}]}", 4));
  EXPECT_FALSE(core_detail::JsonDepthAtMost("{\"a\":[1,{\"b\":[]}]}", 3));
  EXPECT_TRUE(core_detail::JsonDepthAtMost("{\"s\":\"[[[[\\\"[[\"}", 1)) << "brackets in a string";
  auto safetensors_with_header = [](const std::string& header) {
    std::string bytes(8, '\0');
    uint64_t n = header.size();
    std::memcpy(bytes.data(), &n, 8);
    return Buffer::CopyFrom(bytes + header);
  };
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto refused = DecodeSafetensors(safetensors_with_header(deep));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("nests deeper"), std::string::npos)
      << refused.status().ToString();
  auto shallow = DecodeSafetensors(safetensors_with_header("[[[]]]"));
  ASSERT_FALSE(shallow.ok());
  EXPECT_NE(shallow.status().message().find("not a JSON object"), std::string::npos);
  auto empty = DecodeSafetensors(safetensors_with_header("{}"));
  EXPECT_TRUE(empty.ok()) << empty.status().ToString();
}

}  // namespace xsilo
