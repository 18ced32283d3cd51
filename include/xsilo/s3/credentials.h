// Where an S3 client finds its credentials: a chain of providers, tried in
// order (after minio-cpp and the AWS SDKs).
//
//   explicit      StaticCredentials({"AKIA...", "secret"})
//   environment   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN
//   shared file   ~/.aws/credentials (or $AWS_SHARED_CREDENTIALS_FILE), the
//                 profile $AWS_PROFILE or "default"
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "xsilo/core/status.h"

namespace xsilo {

struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // optional (temporary credentials)
};

class S3CredentialsProvider {
 public:
  virtual ~S3CredentialsProvider() = default;
  // The credentials, or NotFound when this provider has none.
  virtual Result<S3Credentials> Get() = 0;
  virtual std::string Describe() const = 0;
};

std::shared_ptr<S3CredentialsProvider> StaticCredentials(S3Credentials credentials);
std::shared_ptr<S3CredentialsProvider> EnvironmentCredentials();
// `path` "" means $AWS_SHARED_CREDENTIALS_FILE, else $HOME/.aws/credentials;
// `profile` "" means $AWS_PROFILE, else "default".
std::shared_ptr<S3CredentialsProvider> SharedFileCredentials(std::string path = "",
                                                             std::string profile = "");
// The first provider that has credentials wins; NotFound if none has.
std::shared_ptr<S3CredentialsProvider> CredentialsChain(
    std::vector<std::shared_ptr<S3CredentialsProvider>> providers);
// Environment, then the shared credentials file.
std::shared_ptr<S3CredentialsProvider> DefaultCredentialsChain();

}  // namespace xsilo
