#include "xsilo/core/secret.h"

#include <sys/stat.h>

#include <cctype>
#include <fstream>
#include <sstream>

namespace xsilo {

bool SecretEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Result<std::string> ReadSecretFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return InvalidArgument("cannot read the secret file " + path);
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return InvalidArgument("the secret file " + path +
                           " can be read by its group or others (chmod 600 it)");
  }
  std::ifstream in(path);
  if (!in) return InvalidArgument("cannot read the secret file " + path);
  std::stringstream text;
  text << in.rdbuf();
  std::string secret = text.str();
  while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back()))) {
    secret.pop_back();
  }
  if (secret.empty()) return InvalidArgument("the secret file " + path + " is empty");
  return secret;
}

}  // namespace xsilo
