// The ucx connector's request/reply framing over a UCP stream endpoint.
//
// A client sends a 48-byte request header, then (for kSet) `size` body bytes;
// the server answers with a 24-byte reply header, then (for a found kGet)
// `size` body bytes. All integers are little-endian. Bodies travel as pieces
// of at most chunk_bytes; the stream is ordered, so only the total matters.
//
//   request: magic u32 | version u8 | op u8 | pad u16 | size u64 | id[32]
//   reply:   magic u32 | version u8 | status u8 | pad u16 | size u64 | pad u64
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

namespace xsilo::ucx {

inline constexpr uint32_t kMagic = 0x58435558;  // "XUCX"
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kIdBytes = 32;
inline constexpr size_t kRequestBytes = 16 + kIdBytes;
inline constexpr size_t kReplyBytes = 24;

enum class Op : uint8_t { kGet = 1, kExists = 2, kEvict = 3, kSet = 4 };
// kOk: found / done (for kExists, size is 1 when the object exists).
enum class ReplyStatus : uint8_t { kOk = 0, kNotFound = 1, kResourceExhausted = 2, kInvalid = 3 };

struct Request {
  Op op = Op::kGet;
  uint64_t size = 0;
  std::string id;  // kIdBytes characters
};

struct Reply {
  ReplyStatus status = ReplyStatus::kOk;
  uint64_t size = 0;
};

using RequestBytes = std::array<uint8_t, kRequestBytes>;
using ReplyBytes = std::array<uint8_t, kReplyBytes>;

inline void PutLe(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint64_t GetLe(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

inline RequestBytes EncodeRequest(const Request& r) {
  RequestBytes b{};
  PutLe(b.data(), kMagic, 4);
  b[4] = kVersion;
  b[5] = static_cast<uint8_t>(r.op);
  PutLe(b.data() + 8, r.size, 8);
  std::memcpy(b.data() + 16, r.id.data(), std::min(r.id.size(), kIdBytes));
  return b;
}

// nullopt for a malformed header.
inline std::optional<Request> DecodeRequest(const RequestBytes& b) {
  if (GetLe(b.data(), 4) != kMagic || b[4] != kVersion || b[5] < 1 || b[5] > 4) return {};
  Request r;
  r.op = static_cast<Op>(b[5]);
  r.size = GetLe(b.data() + 8, 8);
  r.id.assign(reinterpret_cast<const char*>(b.data() + 16), kIdBytes);
  return r;
}

inline ReplyBytes EncodeReply(const Reply& r) {
  ReplyBytes b{};
  PutLe(b.data(), kMagic, 4);
  b[4] = kVersion;
  b[5] = static_cast<uint8_t>(r.status);
  PutLe(b.data() + 8, r.size, 8);
  return b;
}

inline std::optional<Reply> DecodeReply(const ReplyBytes& b) {
  if (GetLe(b.data(), 4) != kMagic || b[4] != kVersion || b[5] > 3) return {};
  return Reply{static_cast<ReplyStatus>(b[5]), GetLe(b.data() + 8, 8)};
}

}  // namespace xsilo::ucx
