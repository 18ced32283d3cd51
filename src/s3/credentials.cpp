#include "xsilo/s3/credentials.h"

#include <cstdlib>
#include <fstream>

namespace xsilo {

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string Trim(std::string s) {
  size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return {};
  size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

class StaticProvider : public S3CredentialsProvider {
 public:
  explicit StaticProvider(S3Credentials c) : c_(std::move(c)) {}
  Result<S3Credentials> Get() override {
    if (c_.access_key_id.empty() || c_.secret_access_key.empty()) {
      return NotFound("explicit credentials are empty");
    }
    return c_;
  }
  std::string Describe() const override { return "explicit"; }

 private:
  S3Credentials c_;
};

class EnvProvider : public S3CredentialsProvider {
 public:
  Result<S3Credentials> Get() override {
    S3Credentials c{Env("AWS_ACCESS_KEY_ID"), Env("AWS_SECRET_ACCESS_KEY"),
                    Env("AWS_SESSION_TOKEN")};
    if (c.access_key_id.empty() || c.secret_access_key.empty()) {
      return NotFound("AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are not set");
    }
    return c;
  }
  std::string Describe() const override { return "environment"; }
};

class FileProvider : public S3CredentialsProvider {
 public:
  FileProvider(std::string path, std::string profile)
      : path_(std::move(path)), profile_(std::move(profile)) {}
  Result<S3Credentials> Get() override {
    std::string path = path_;
    if (path.empty()) path = Env("AWS_SHARED_CREDENTIALS_FILE");
    if (path.empty()) {
      std::string home = Env("HOME");
      if (home.empty()) return NotFound("no HOME for ~/.aws/credentials");
      path = home + "/.aws/credentials";
    }
    std::string profile = profile_;
    if (profile.empty()) profile = Env("AWS_PROFILE");
    if (profile.empty()) profile = "default";
    std::ifstream in(path);
    if (!in) return NotFound("no shared credentials file at " + path);
    S3Credentials c;
    std::string line, section;
    while (std::getline(in, line)) {
      line = Trim(line);
      if (line.empty() || line[0] == '#' || line[0] == ';') continue;
      if (line.front() == '[' && line.back() == ']') {
        section = Trim(line.substr(1, line.size() - 2));
        if (section.rfind("profile ", 0) == 0) section = Trim(section.substr(8));
        continue;
      }
      if (section != profile) continue;
      size_t eq = line.find('=');
      if (eq == std::string::npos) continue;
      std::string k = Trim(line.substr(0, eq)), v = Trim(line.substr(eq + 1));
      if (k == "aws_access_key_id") c.access_key_id = v;
      if (k == "aws_secret_access_key") c.secret_access_key = v;
      if (k == "aws_session_token") c.session_token = v;
    }
    if (c.access_key_id.empty() || c.secret_access_key.empty()) {
      return NotFound("profile [" + profile + "] in " + path + " has no access key and secret");
    }
    return c;
  }
  std::string Describe() const override { return "shared credentials file"; }

 private:
  std::string path_, profile_;
};

class ChainProvider : public S3CredentialsProvider {
 public:
  explicit ChainProvider(std::vector<std::shared_ptr<S3CredentialsProvider>> p)
      : providers_(std::move(p)) {}
  Result<S3Credentials> Get() override {
    std::string tried;
    for (const auto& p : providers_) {
      if (!p) continue;
      auto c = p->Get();
      if (c.ok()) return c;
      if (c.status().code() != StatusCode::kNotFound) return c.status();
      tried += (tried.empty() ? "" : "; ") + p->Describe() + ": " + c.status().message();
    }
    return NotFound("no S3 credentials found (" + tried + ")");
  }
  std::string Describe() const override { return "chain"; }

 private:
  std::vector<std::shared_ptr<S3CredentialsProvider>> providers_;
};

}  // namespace

std::shared_ptr<S3CredentialsProvider> StaticCredentials(S3Credentials credentials) {
  return std::make_shared<StaticProvider>(std::move(credentials));
}
std::shared_ptr<S3CredentialsProvider> EnvironmentCredentials() {
  return std::make_shared<EnvProvider>();
}
std::shared_ptr<S3CredentialsProvider> SharedFileCredentials(std::string path,
                                                             std::string profile) {
  return std::make_shared<FileProvider>(std::move(path), std::move(profile));
}
std::shared_ptr<S3CredentialsProvider> CredentialsChain(
    std::vector<std::shared_ptr<S3CredentialsProvider>> providers) {
  return std::make_shared<ChainProvider>(std::move(providers));
}
std::shared_ptr<S3CredentialsProvider> DefaultCredentialsChain() {
  return CredentialsChain({EnvironmentCredentials(), SharedFileCredentials()});
}

}  // namespace xsilo
