// Net layer: the hashes SigV4, ETags and the relay tickets need (SHA-256,
// HMAC-SHA256, MD5), over OpenSSL, and the hex and base64 text of a digest.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace xsilo::net {

using Sha256Digest = std::array<uint8_t, 32>;
using Md5Digest = std::array<uint8_t, 16>;

Sha256Digest Sha256(std::span<const uint8_t> bytes);
inline Sha256Digest Sha256(std::string_view s) {
  return Sha256({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
}
Sha256Digest HmacSha256(std::span<const uint8_t> key, std::string_view data);
Md5Digest Md5(std::span<const uint8_t> bytes);

std::string Hex(std::span<const uint8_t> bytes);
// The value of one hex digit (either case), or -1.
inline int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
// HTTP's optional whitespace (spaces and tabs) trimmed from both ends.
inline std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}
template <size_t N>
std::string Hex(const std::array<uint8_t, N>& a) {
  return Hex(std::span<const uint8_t>(a.data(), N));
}
std::string Base64Of(std::span<const uint8_t> bytes);
template <size_t N>
std::string Base64Of(const std::array<uint8_t, N>& a) {
  return Base64Of(std::span<const uint8_t>(a.data(), N));
}

// Incremental hashing, for bodies that arrive in pieces.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void Update(const void* data, size_t n);
  Sha256Digest Finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class Md5Stream {
 public:
  Md5Stream();
  ~Md5Stream();
  Md5Stream(const Md5Stream&) = delete;
  Md5Stream& operator=(const Md5Stream&) = delete;
  void Update(const void* data, size_t n);
  Md5Digest Finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

inline constexpr std::string_view kEmptySha256Hex =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

}  // namespace xsilo::net
