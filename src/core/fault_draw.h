// Private: the seeded draws shared by the fault injectors (the `faulty`
// connector, src/store/faulty/, and the `faulty` transport,
// src/transport/faulty/).
//
// Draw n of an operation kind is a pure function of (seed, kind, n), so a
// run whose operations of each kind come in the same order sees the same
// faults every time.
#pragma once

#include <cstdint>
#include <cstring>

#include "xsilo/core/codec.h"
#include "xsilo/core/status.h"

namespace xsilo::fault {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One operation's draws: independent uniform numbers derived from
// (seed, kind, sequence number, index).
class Draw {
 public:
  Draw(uint64_t seed, int kind, uint64_t n)
      : state_(SplitMix64(seed ^ SplitMix64((static_cast<uint64_t>(kind) << 56) ^ n))) {}
  uint64_t Next() { return state_ = SplitMix64(state_); }
  bool Happens(double p) {
    if (p <= 0) return false;
    return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p;
  }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }

 private:
  uint64_t state_;
};

// A private copy of `bytes` with one bit, chosen by `d`, flipped.
inline Result<Buffer> FlipOneBit(const GatherList& bytes, Draw& d) {
  XSILO_ASSIGN_OR_RETURN(Buffer copy, Buffer::Allocate(bytes.size));
  uint64_t off = 0;
  for (const Buffer& s : bytes.segments) {
    if (!s.empty()) std::memcpy(copy.mutable_data() + off, s.data(), s.size());
    off += s.size();
  }
  if (bytes.size > 0) {
    const uint64_t bit = d.Below(bytes.size * 8);
    copy.mutable_data()[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
  return copy;
}

}  // namespace xsilo::fault
