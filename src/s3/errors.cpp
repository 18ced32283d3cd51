#include "s3/errors.h"

#include <algorithm>
#include <array>

#include "xsilo/s3/errors.h"

namespace xsilo::s3 {

namespace {
constexpr std::array kErrors = {
    S3ErrorKind{"AccessDenied", 403, StatusCode::kPermissionDenied},
    S3ErrorKind{"SignatureDoesNotMatch", 403, StatusCode::kPermissionDenied},
    S3ErrorKind{"InvalidAccessKeyId", 403, StatusCode::kPermissionDenied},
    S3ErrorKind{"RequestTimeTooSkewed", 403, StatusCode::kPermissionDenied},
    S3ErrorKind{"ExpiredToken", 400, StatusCode::kUnauthenticated},
    S3ErrorKind{"NoSuchKey", 404, StatusCode::kNotFound},
    S3ErrorKind{"NoSuchBucket", 404, StatusCode::kNotFound},
    S3ErrorKind{"NoSuchUpload", 404, StatusCode::kNotFound},
    S3ErrorKind{"NoSuchVersion", 404, StatusCode::kNotFound},
    S3ErrorKind{"BucketAlreadyOwnedByYou", 409, StatusCode::kAlreadyExists},
    S3ErrorKind{"BucketAlreadyExists", 409, StatusCode::kAlreadyExists},
    S3ErrorKind{"BucketNotEmpty", 409, StatusCode::kFailedPrecondition},
    S3ErrorKind{"InvalidRange", 416, StatusCode::kOutOfRange},
    S3ErrorKind{"EntityTooLarge", 400, StatusCode::kResourceExhausted},
    S3ErrorKind{"EntityTooSmall", 400, StatusCode::kInvalidArgument},
    S3ErrorKind{"InvalidArgument", 400, StatusCode::kInvalidArgument},
    S3ErrorKind{"InvalidRequest", 400, StatusCode::kInvalidArgument},
    S3ErrorKind{"InvalidBucketName", 400, StatusCode::kInvalidArgument},
    S3ErrorKind{"KeyTooLongError", 400, StatusCode::kInvalidArgument},
    S3ErrorKind{"MalformedXML", 400, StatusCode::kInvalidArgument},
    S3ErrorKind{"InvalidPart", 400, StatusCode::kInvalidArgument},
    S3ErrorKind{"InvalidPartOrder", 400, StatusCode::kInvalidArgument},
    S3ErrorKind{"InvalidURI", 400, StatusCode::kInvalidArgument},
    S3ErrorKind{"BadRequest", 400, StatusCode::kInvalidArgument},
    S3ErrorKind{"RequestHeaderSectionTooLarge", 400, StatusCode::kInvalidArgument},
    S3ErrorKind{"AuthorizationHeaderMalformed", 400, StatusCode::kInvalidArgument},
    S3ErrorKind{"AuthorizationQueryParametersError", 400, StatusCode::kInvalidArgument},
    S3ErrorKind{"BadDigest", 400, StatusCode::kCorrupt},
    S3ErrorKind{"InvalidDigest", 400, StatusCode::kCorrupt},
    S3ErrorKind{"XAmzContentSHA256Mismatch", 400, StatusCode::kCorrupt},
    S3ErrorKind{"IncompleteBody", 400, StatusCode::kUnavailable},
    S3ErrorKind{"MissingContentLength", 411, StatusCode::kInvalidArgument},
    S3ErrorKind{"MethodNotAllowed", 405, StatusCode::kInvalidArgument},
    S3ErrorKind{"CORSResponse", 403, StatusCode::kPermissionDenied},
    S3ErrorKind{"PreconditionFailed", 412, StatusCode::kFailedPrecondition},
    S3ErrorKind{"NotModified", 304, StatusCode::kFailedPrecondition},
    S3ErrorKind{"NotImplemented", 501, StatusCode::kUnimplemented},
    S3ErrorKind{"InternalError", 500, StatusCode::kUnavailable},
    S3ErrorKind{"ServiceUnavailable", 503, StatusCode::kUnavailable},
    S3ErrorKind{"SlowDown", 503, StatusCode::kUnavailable},
};
}  // namespace

S3ErrorKind LookupS3Error(std::string_view code, int http_status) {
  for (const auto& e : kErrors) {
    if (e.code == code) return e;
  }
  StatusCode sc = StatusCode::kInternal;
  if (http_status == 403) {
    sc = StatusCode::kPermissionDenied;
  } else if (http_status == 401) {
    sc = StatusCode::kUnauthenticated;
  } else if (http_status == 404) {
    sc = StatusCode::kNotFound;
  } else if (http_status == 416) {
    sc = StatusCode::kOutOfRange;
  } else if (http_status >= 500) {
    sc = StatusCode::kUnavailable;
  } else if (http_status >= 400) {
    sc = StatusCode::kInvalidArgument;
  }
  return {code, http_status != 0 ? http_status : 500, sc};
}

Status S3Error(std::string_view code, std::string_view message) {
  S3ErrorKind kind = LookupS3Error(code);
  std::string m(code);
  m += ": ";
  m += message;
  return Status(kind.status_code, std::move(m));
}

}  // namespace xsilo::s3

namespace xsilo {

std::string S3ErrorCode(const Status& status) {
  if (status.ok()) return {};
  // The message is "[context: ]*Code: text"; contexts (Status::WithContext)
  // hold spaces, a code is one CamelCase word.
  std::string_view m = status.message();
  while (!m.empty()) {
    size_t sep = m.find(": ");
    if (sep == std::string_view::npos) return {};
    std::string_view word = m.substr(0, sep);
    bool code = !word.empty() && word[0] >= 'A' && word[0] <= 'Z' &&
                std::all_of(word.begin(), word.end(), [](char c) {
                  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
                });
    if (code) return std::string(word);
    m.remove_prefix(sep + 2);
  }
  return {};
}

}  // namespace xsilo
