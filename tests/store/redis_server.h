// Starts Debian's redis-server on a free port for the tests of this process.
#pragma once

#include <string>

namespace xsilo::testing {

// Port of a redis-server started on first use and stopped at exit.
// Aborts the test binary with a message if redis-server cannot start.
int RedisTestPort();
// Port of a second redis-server that wants AUTH with kRedisTestPassword.
inline constexpr const char* kRedisTestPassword = "redis-test-password-5d1c";
int RedisAuthTestPort();

}  // namespace xsilo::testing
