#include "xsilo/core/secret.h"

#include <sys/stat.h>

#include <cctype>
#include <fstream>
#include <sstream>

namespace xsilo {

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
