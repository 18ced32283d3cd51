// Private: the little-endian field helpers and the alignment every part of
// the codec shares (codec.cpp: frames and message headers; safetensors.cpp;
// checksums.cpp). docs/wire-format.md has the layouts.
#pragma once

#include <cstdint>

namespace xsilo::codec_detail {

// The data region of a safetensors payload, and a frame's payload, start at
// a multiple of this.
inline constexpr uint64_t kAlign = 64;

inline uint64_t AlignUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

inline void PutU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint16_t GetU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace xsilo::codec_detail
