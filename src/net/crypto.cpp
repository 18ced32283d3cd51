#include "net/crypto.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "xsilo/core/base64.h"

namespace xsilo::net {

namespace {
struct EvpStream {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  explicit EvpStream(const EVP_MD* md) { EVP_DigestInit_ex(ctx, md, nullptr); }
  ~EvpStream() { EVP_MD_CTX_free(ctx); }
  void Update(const void* d, size_t n) { EVP_DigestUpdate(ctx, d, n); }
  void Finish(uint8_t* out) {
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx, out, &len);
  }
};
}  // namespace

struct Sha256Stream::Impl : EvpStream {
  Impl() : EvpStream(EVP_sha256()) {}
};
Sha256Stream::Sha256Stream() : impl_(std::make_unique<Impl>()) {}
Sha256Stream::~Sha256Stream() = default;
void Sha256Stream::Update(const void* data, size_t n) { impl_->Update(data, n); }
Sha256Digest Sha256Stream::Finish() {
  Sha256Digest d{};
  impl_->Finish(d.data());
  return d;
}

struct Md5Stream::Impl : EvpStream {
  Impl() : EvpStream(EVP_md5()) {}
};
Md5Stream::Md5Stream() : impl_(std::make_unique<Impl>()) {}
Md5Stream::~Md5Stream() = default;
void Md5Stream::Update(const void* data, size_t n) { impl_->Update(data, n); }
Md5Digest Md5Stream::Finish() {
  Md5Digest d{};
  impl_->Finish(d.data());
  return d;
}

Sha256Digest Sha256(std::span<const uint8_t> bytes) {
  Sha256Stream s;
  s.Update(bytes.data(), bytes.size());
  return s.Finish();
}

Md5Digest Md5(std::span<const uint8_t> bytes) {
  Md5Stream s;
  s.Update(bytes.data(), bytes.size());
  return s.Finish();
}

Sha256Digest HmacSha256(std::span<const uint8_t> key, std::string_view data) {
  Sha256Digest out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), &len);
  return out;
}

std::string Hex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(bytes.size() * 2, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    s[2 * i] = kDigits[bytes[i] >> 4];
    s[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return s;
}

std::string Base64Of(std::span<const uint8_t> bytes) { return Base64Encode(bytes); }

}  // namespace xsilo::net
