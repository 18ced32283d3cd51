// Validation of the S3 client's arguments, before any I/O.
#include "s3/client_internal.h"

namespace xsilo {

using s3::Params;
using namespace s3client;

namespace s3client {

Status ValidateBucket(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) {
    return InvalidArgument("bucket name must be 3..63 characters: '" + b + "'");
  }
  for (char c : b) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) {
      return InvalidArgument("bucket name may hold only a-z 0-9 - .: '" + b + "'");
    }
  }
  return Status::OK();
}

Status ValidateKey(const std::string& k) {
  if (k.empty()) return InvalidArgument("object key must not be empty");
  if (k.size() > 1024) return InvalidArgument("object key longer than 1024 bytes");
  return Status::OK();
}

Status ValidateObject(const std::string& b, const std::string& k) {
  XSILO_RETURN_IF_ERROR(ValidateBucket(b));
  return ValidateKey(k);
}

Status ValidateGather(const GatherList& g) {
  uint64_t sum = 0;
  for (const Buffer& b : g.segments) sum += b.size();
  if (sum != g.size) return InvalidArgument("GatherList size does not match its segments");
  return Status::OK();
}

Status ValidateMetadata(const std::vector<std::pair<std::string, std::string>>& md) {
  for (const auto& [k, v] : md) {
    if (k.empty() || k.find_first_of(" :\r\n") != std::string::npos ||
        v.find_first_of("\r\n") != std::string::npos) {
      return InvalidArgument("metadata names must be tokens and values single-line: " + k);
    }
  }
  return Status::OK();
}

bool SameNameIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

void AddStoredHeaders(const std::vector<std::pair<std::string, std::string>>& headers,
                      Params* out) {
  for (const auto& [k, v] : headers) {
    std::string name = k;
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    out->emplace_back(std::move(name), v);
  }
}

Status ValidateStoredHeaders(const std::vector<std::pair<std::string, std::string>>& headers) {
  for (const auto& header : headers) {
    const std::string& k = header.first;
    const std::string& v = header.second;
    bool known = std::any_of(std::begin(kStoredHeaderNames), std::end(kStoredHeaderNames),
                             [&](std::string_view n) { return SameNameIgnoringCase(k, n); });
    if (!known) {
      return InvalidArgument("headers: " + k +
                             " is not one S3 stores (Cache-Control, Content-Disposition, "
                             "Content-Encoding, Content-Language, Expires)");
    }
    if (v.find_first_of("\r\n") != std::string::npos) {
      return InvalidArgument("headers: the value of " + k + " must be one line");
    }
  }
  return Status::OK();
}

}  // namespace s3client

Status CreateBucketArgs::Validate() const { return ValidateBucket(bucket); }
Status BucketArgs::Validate() const { return ValidateBucket(bucket); }
Status ObjectArgs::Validate() const { return ValidateObject(bucket, key); }

Status PutObjectArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateObject(bucket, key));
  XSILO_RETURN_IF_ERROR(ValidateMetadata(metadata));
  XSILO_RETURN_IF_ERROR(ValidateStoredHeaders(headers));
  if (body.size > (5ull << 30)) {
    return InvalidArgument("a single PUT is limited to 5 GiB; use UploadObject");
  }
  return ValidateGather(body);
}

Status GetObjectArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateObject(bucket, key));
  if (length && *length == 0) return InvalidArgument("range length must be > 0");
  if (length && offset + *length < offset) return InvalidArgument("range overflows");
  if ((if_match + if_none_match).find_first_of("\r\n") != std::string::npos) {
    return InvalidArgument("if_match / if_none_match must be one line");
  }
  if (!expected_sha256.empty()) {
    auto d = Base64Decode(expected_sha256);
    if (!d || d->size() != 32) return InvalidArgument("expected_sha256 must be base64 of 32 bytes");
  }
  return Status::OK();
}

Status CopyObjectArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateObject(source_bucket, source_key));
  XSILO_RETURN_IF_ERROR(ValidateObject(bucket, key));
  XSILO_RETURN_IF_ERROR(ValidateMetadata(metadata));
  XSILO_RETURN_IF_ERROR(ValidateStoredHeaders(headers));
  if (!replace_metadata && (!content_type.empty() || !metadata.empty() || !headers.empty())) {
    return InvalidArgument(
        "CopyObject: content_type, metadata and headers apply only with replace_metadata");
  }
  if (!replace_metadata && source_bucket == bucket && source_key == key) {
    return InvalidArgument("CopyObject: copying an object onto itself needs replace_metadata");
  }
  return Status::OK();
}

Status ListUploadsArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateBucket(bucket));
  if (max_uploads < 1 || max_uploads > 1000) return InvalidArgument("max_uploads must be 1..1000");
  return Status::OK();
}

Status ListObjectsArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateBucket(bucket));
  if (max_keys < 1 || max_keys > 1000) return InvalidArgument("max_keys must be 1..1000");
  return Status::OK();
}

Status UploadObjectArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateObject(bucket, key));
  XSILO_RETURN_IF_ERROR(ValidateMetadata(metadata));
  XSILO_RETURN_IF_ERROR(ValidateStoredHeaders(headers));
  XSILO_RETURN_IF_ERROR(ValidateGather(body));
  if (part_size < (5ull << 20) || part_size > (5ull << 30)) {
    return InvalidArgument("part_size must be 5 MiB .. 5 GiB");
  }
  if (concurrency < 1) return InvalidArgument("concurrency must be >= 1");
  if ((body.size + part_size - 1) / part_size > 10000) {
    return InvalidArgument("more than 10000 parts; raise part_size");
  }
  return Status::OK();
}

Status DownloadObjectArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateObject(bucket, key));
  if (connections < 1) return InvalidArgument("connections must be >= 1");
  if (max_range_retries < 0) return InvalidArgument("max_range_retries must be >= 0");
  if (!expected_sha256.empty()) {
    auto d = Base64Decode(expected_sha256);
    if (!d || d->size() != 32) return InvalidArgument("expected_sha256 must be base64 of 32 bytes");
  }
  return Status::OK();
}

Status PresignArgs::Validate() const {
  XSILO_RETURN_IF_ERROR(ValidateObject(bucket, key));
  if (method != "GET" && method != "PUT" && method != "HEAD" && method != "DELETE" &&
      method != "POST") {
    return InvalidArgument("presign method must be GET, PUT, HEAD, DELETE or POST");
  }
  for (const auto& [k, v] : query) {
    if (k.empty() || k.rfind("X-Amz-", 0) == 0 || k.rfind("x-amz-", 0) == 0) {
      return InvalidArgument("presign query parameter '" + k + "' is empty or reserved");
    }
  }
  if (expires.count() < 1 || expires.count() > 604800) {
    return InvalidArgument("presigned URL expiry must be 1 s .. 7 days");
  }
  return Status::OK();
}

}  // namespace xsilo
