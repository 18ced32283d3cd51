// The environment of a test's child process (its own file so that a binary
// using it links no conformance suite).
#pragma once

#include <string>
#include <vector>

namespace xsilo::testing {

// This process's environment for a child, with AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY replaced by the given pair (removed when
// access_key is empty): the child's own credentials, as a receiving site
// has them, since a connector config carries no secret.
std::vector<std::string> EnvironWithS3Credentials(const std::string& access_key,
                                                  const std::string& secret_key);
// The same with REDISCLI_AUTH (redis-cli's variable, which the redis
// connector reads) set to `password`, or removed when it is empty.
std::vector<std::string> EnvironWithRedisPassword(const std::string& password);

}  // namespace xsilo::testing
