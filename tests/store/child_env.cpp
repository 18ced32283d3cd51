#include "store/child_env.h"

#include <unistd.h>

#include <string_view>

namespace xsilo::testing {

std::vector<std::string> EnvironWithS3Credentials(const std::string& access_key,
                                                  const std::string& secret_key) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string_view var(*e);
    if (!var.starts_with("AWS_ACCESS_KEY_ID=") && !var.starts_with("AWS_SECRET_ACCESS_KEY=")) {
      env.emplace_back(*e);
    }
  }
  if (!access_key.empty()) {
    env.push_back("AWS_ACCESS_KEY_ID=" + access_key);
    env.push_back("AWS_SECRET_ACCESS_KEY=" + secret_key);
  }
  return env;
}

std::vector<std::string> EnvironWithRedisPassword(const std::string& password) {
  std::vector<std::string> env;
  for (const std::string& var : EnvironWithS3Credentials("", "")) {
    if (!var.starts_with("REDISCLI_AUTH=")) env.push_back(var);
  }
  if (!password.empty()) env.push_back("REDISCLI_AUTH=" + password);
  return env;
}

}  // namespace xsilo::testing
