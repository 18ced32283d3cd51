// Test helper: an embedded S3 server and a client signed for it.
#pragma once

#include <memory>
#include <string>

#include "xsilo/s3/client.h"
#include "xsilo/s3/server.h"

namespace xsilo::testing {

struct S3ServerAndClient {
  std::unique_ptr<S3Server> server;
  std::unique_ptr<S3Client> client;
};

// An embedded S3 server (memory storage, on 127.0.0.1) holding `bucket`, and
// a path-style client with the server's keys.
Result<S3ServerAndClient> StartS3ServerAndClient(const std::string& access_key,
                                                 const std::string& secret_key,
                                                 const std::string& bucket);

}  // namespace xsilo::testing
