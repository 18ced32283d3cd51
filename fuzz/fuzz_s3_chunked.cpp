// libFuzzer target: the aws-chunked body decoder of the embedded S3 server
// (s3/aws_chunked.h). The first byte picks the format (signed chunks,
// trailers allowed), the next 8 the decoded length the request would claim,
// the rest is the body. The verifier refuses signatures that start with 'x',
// so that refusals are exercised too. Whatever decodes must be the
// concatenation of the chunks the verifier saw, of the claimed length, no
// longer than the body; trailers only where allowed.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "s3/aws_chunked.h"
#include "s3/errors.h"

namespace s3 = xsilo::s3;

namespace {
void Check(bool ok) {
  if (!ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 9) return 0;
  s3::AwsChunkedFormat format;
  format.signed_chunks = (data[0] & 1) != 0;
  format.trailers_allowed = (data[0] & 2) != 0;
  uint64_t claimed = 0;
  std::memcpy(&claimed, data + 1, 8);
  std::vector<uint8_t> body(data + 9, data + size);
  claimed %= body.size() + 2;  // mostly plausible, sometimes one too many
  std::string seen;
  int last_size = -1;
  auto verify = [&](std::span<const uint8_t> bytes, std::string_view signature) {
    Check(signature.size() == (format.signed_chunks ? 64u : 0u));
    Check(last_size != 0);  // nothing after the final chunk
    last_size = static_cast<int>(bytes.size() > 0);
    if (!signature.empty() && signature[0] == 'x')
      return s3::S3Error("SignatureDoesNotMatch", "refused");
    seen.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return xsilo::Status::OK();
  };
  auto r = s3::DecodeAwsChunks(body.data(), body.size(), claimed, format, verify);
  if (!r.ok()) return 0;
  const uint64_t n = r->length;
  Check(n == claimed);
  Check(n <= body.size());
  Check(last_size == 0);
  Check(seen.size() == n);
  Check(std::memcmp(seen.data(), body.data(), n) == 0);
  Check(format.trailers_allowed || r->trailers.empty());
  for (const auto& [name, value] : r->trailers) Check(!name.empty());
  return 0;
}
