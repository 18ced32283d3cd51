// Test helpers: raw HTTP exchanges with a server on 127.0.0.1, and SigV4
// signing of such requests (through the library's own sigv4 functions, which
// sigv4_test.cpp checks against AWS's published examples).
#pragma once

#include <ctime>
#include <string>

#include "s3/sigv4.h"

namespace xsilo::s3::testing {

struct RawResponse {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;
  std::string Header(const std::string& lower_name) const;
};

// Sends `bytes` and reads one response (Content-Length framed) or until the
// peer closes. status 0 when nothing came back.
// With until_close, reads everything until the peer closes (pipelining).
RawResponse RawExchange(int port, const std::string& bytes, int timeout_ms = 10000,
                        bool until_close = false);

// Builds a complete request signed with SigV4 in the Authorization header.
std::string SignedRequest(int port, const std::string& method, const std::string& path,
                          const std::string& query, const std::string& body,
                          const std::string& access_key, const std::string& secret_key,
                          const std::string& region = "us-east-1",
                          const std::string& payload_hash = "UNSIGNED-PAYLOAD",
                          const std::string& extra_headers = "",
                          std::time_t now = std::time(nullptr));

// A presigned URL path+query ("/b/k?X-Amz-...") signed at `signed_at`.
std::string PresignedTarget(int port, const std::string& method, const std::string& path,
                            const std::string& access_key, const std::string& secret_key,
                            int expires_seconds, std::time_t signed_at,
                            const std::string& region = "us-east-1");

}  // namespace xsilo::s3::testing
