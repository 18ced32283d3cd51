// S3 errors as Status values.
//
// Every failure the S3 client reports (and every error the embedded server
// answers) is a Status whose message starts with the S3 error code:
// "NoSuchKey: The specified key does not exist. (GET bucket/key)". The
// Status code follows the S3 code: NoSuchKey/NoSuchBucket/NoSuchUpload ->
// NotFound; AccessDenied/SignatureDoesNotMatch/InvalidAccessKeyId/
// RequestTimeTooSkewed -> PermissionDenied; InvalidRange -> OutOfRange;
// BadDigest/XAmzContentSHA256Mismatch -> Corrupt; 5xx -> Unavailable; ...
#pragma once

#include <string>

#include "xsilo/core/status.h"

namespace xsilo {

// The S3 error code a Status carries ("NoSuchKey"), or "" when it carries none
// (e.g. a connection failure).
std::string S3ErrorCode(const Status& status);

}  // namespace xsilo
