#include "s3/etag.h"

#include "core/xxh3.h"
#include "net/crypto.h"

namespace xsilo::s3 {

struct EtagHasher::Impl {
  EtagHash kind;
  net::Md5Stream md5;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> xxh{nullptr, &XXH3_freeState};
};

EtagHasher::EtagHasher(EtagHash kind) : impl_(std::make_unique<Impl>()) {
  impl_->kind = kind;
  if (kind == EtagHash::kXxh3) {
    impl_->xxh.reset(XXH3_createState());
    XXH3_128bits_reset(impl_->xxh.get());
  }
}

EtagHasher::~EtagHasher() = default;

void EtagHasher::Update(const void* data, size_t n) {
  if (impl_->kind == EtagHash::kMd5) {
    impl_->md5.Update(data, n);
  } else {
    XXH3_128bits_update(impl_->xxh.get(), data, n);
  }
}

std::string EtagHasher::Finish() {
  std::array<uint8_t, 16> raw{};
  if (impl_->kind == EtagHash::kMd5) {
    raw = impl_->md5.Finish();
  } else {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(impl_->xxh.get()));
    std::copy(std::begin(c.digest), std::end(c.digest), raw.begin());
  }
  return "\"" + net::Hex(raw) + "\"";
}

Result<std::string> MultipartEtag(EtagHash kind, const std::vector<std::string>& part_etags) {
  EtagHasher h(kind);
  for (std::string_view e : part_etags) {
    if (e.size() == 34 && e.front() == '"' && e.back() == '"') e = e.substr(1, 32);
    if (e.size() != 32) return InvalidArgument("not a 128-bit part ETag: " + std::string(e));
    uint8_t raw[16];
    for (size_t i = 0; i < 16; ++i) {
      const int hi = net::HexValue(e[2 * i]), lo = net::HexValue(e[2 * i + 1]);
      if (hi < 0 || lo < 0) return InvalidArgument("not a hex part ETag: " + std::string(e));
      raw[i] = static_cast<uint8_t>(hi * 16 + lo);
    }
    h.Update(raw, sizeof(raw));
  }
  std::string whole = h.Finish();
  return whole.substr(0, whole.size() - 1) + "-" + std::to_string(part_etags.size()) + "\"";
}

}  // namespace xsilo::s3
