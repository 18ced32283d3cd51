// The RADOS Gateway the tests in tests/ceph/ run against: a one-node Ceph
// cluster brought up by scripts/ceph-rgw.sh (ctest's fixture ceph_rgw.up).
#pragma once

#include <string>

#include "xsilo/core/status.h"

namespace xsilo::testing {

struct Rgw {
  std::string endpoint;  // http://127.0.0.1:<port>
  std::string access_key;
  std::string secret_key;
  std::string log;           // the gateway's log, with one access line per request
  std::string admin_socket;  // to flush that log
};

// From the environment (eval "$(scripts/ceph-rgw.sh env)"), else from the
// file `scripts/ceph-rgw.sh up` writes, $XSILO_CEPH_DIR/env (default
// /tmp/xsilo-ceph). An error says what is missing and how to bring one up.
Result<Rgw> FindRgw();

// Requests with a presigned URL (X-Amz-Signature in the query) to `bucket`
// that the gateway answered with 2xx, by kind, from its access log.
struct PresignedRequests {
  int gets = 0;
  int puts = 0;         // parts included
  int part_puts = 0;    // PUT ?partNumber=
  int completions = 0;  // POST ?uploadId=
};
// Flushes the gateway's log first (through its admin socket), and reads it
// again for a while until it shows at least `completions` completions.
PresignedRequests CountPresigned(const Rgw& rgw, const std::string& bucket, int completions = 0);

// A bucket name no other test uses ("xsilo-<what>-<pid>-<n>").
std::string FreshBucket(const std::string& what);

}  // namespace xsilo::testing
