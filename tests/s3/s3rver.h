// Starts s3rver (the npm package, an S3 server we did not write) for tests.
//
// `make test` installs it (scripts/install-deps.sh runs `npm install` in the
// repository root, see package.json); tests that need it fail with a message
// naming that script when it is missing, they do not skip.
//
//   auto s3rver = testing::S3rver::Start({.buckets = {"b"}});
//   ASSERT_TRUE(s3rver.ok()) << s3rver.status().ToString();
//   S3ClientOptions o;
//   o.endpoint = (*s3rver)->endpoint();       // "http://127.0.0.1:<port>"
//   o.credentials = StaticCredentials({testing::S3rver::kAccessKey, testing::S3rver::kSecretKey});
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "xsilo/core/status.h"

namespace xsilo::testing {

struct S3rverOptions {
  // Port to listen on; 0 (default) picks a free one.
  int port = 0;
  // Buckets created before the server starts answering.
  std::vector<std::string> buckets;
};

class S3rver {
 public:
  // s3rver's built-in account. It checks the access key (unknown key: 403
  // InvalidAccessKeyId) but does not verify SigV4 signatures, so a wrong
  // secret is accepted.
  static constexpr const char* kAccessKey = "S3RVER";
  static constexpr const char* kSecretKey = "S3RVER";

  // Starts s3rver on 127.0.0.1 with its data in a fresh temporary directory
  // and waits until it accepts connections. FailedPrecondition when s3rver
  // is not installed, Unavailable when it does not come up.
  static Result<std::unique_ptr<S3rver>> Start(S3rverOptions options = {});
  ~S3rver();  // kills the server and removes its directory
  S3rver(const S3rver&) = delete;
  S3rver& operator=(const S3rver&) = delete;

  int port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::string& directory() const { return dir_; }

 private:
  S3rver() = default;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string dir_;
};

// The s3rver executable (<source dir>/node_modules/.bin/s3rver, or
// $XSILO_S3RVER when set).
std::string S3rverExecutable();

// One s3rver per process, for tests whose parameters are built before any
// test runs (conformance suites): SharedS3rverEndpoint() fixes the port on
// first call without starting anything; StartSharedS3rver() starts the
// server on that port once (later calls return the first outcome) with
// bucket kSharedS3rverBucket, and it runs until the process exits.
inline constexpr const char* kSharedS3rverBucket = "xsilo-s3rver";
std::string SharedS3rverEndpoint();
Status StartSharedS3rver();

}  // namespace xsilo::testing
