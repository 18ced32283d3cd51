// Private: the S3 error codes xsilo speaks, their HTTP statuses and the
// Status codes they become. A Status built here carries the S3 code as the
// first word of its message ("NoSuchKey: ..."), which S3ErrorCode() reads.
#pragma once

#include <string>
#include <string_view>

#include "xsilo/core/status.h"

namespace xsilo::s3 {

struct S3ErrorKind {
  std::string_view code;
  int http_status;
  StatusCode status_code;
};

// The table entry for an S3 code; unknown codes map by HTTP status class.
S3ErrorKind LookupS3Error(std::string_view code, int http_status = 0);
// Status whose message is "<code>: <message>".
Status S3Error(std::string_view code, std::string_view message);

}  // namespace xsilo::s3
