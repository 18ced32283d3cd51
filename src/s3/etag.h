// Private: the ETags of the embedded S3 server.
//
// S3 clients take a single-part object's ETag to be the hex MD5 of its
// bytes and a multipart object's to be "<hex MD5 of the concatenated raw
// part MD5s>-<parts>", and check them (rclone, s3cmd, aws s3 sync). That is
// the default. kXxh3 gives the same shapes from the 128-bit XXH3 instead,
// about twenty times cheaper to compute: for stores whose only clients are
// xsilo's own, which compare ETags but never check them as MD5 (the
// hybrid's embedded server; xsilo verifies its payloads with the wire
// format's own checksum).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "xsilo/core/status.h"

namespace xsilo::s3 {

enum class EtagHash { kMd5, kXxh3 };

class EtagHasher {
 public:
  explicit EtagHasher(EtagHash kind);
  ~EtagHasher();
  EtagHasher(const EtagHasher&) = delete;
  EtagHasher& operator=(const EtagHasher&) = delete;
  void Update(const void* data, size_t n);
  // The quoted lowercase hex digest ("\"9e107d9d372bb6826bd81d3542a419d6\""). Call once.
  std::string Finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A multipart object's ETag from its parts' ETags (quoted or not, each 32
// hex digits), in part order. InvalidArgument if one is not of that form.
Result<std::string> MultipartEtag(EtagHash kind, const std::vector<std::string>& part_etags);

}  // namespace xsilo::s3
