// The embedded S3-compatible server that a hybrid "+s3" server party runs
// by default, in a child process of its own: the object bytes then live in
// that process, not in the sender's, whose memory holds just the model.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "xsilo/core/status.h"

namespace xsilo {

class EmbeddedS3 {
 public:
  // Forks a child serving S3 (objects in memory) on bind_host:port (0 =
  // ephemeral) with fresh random credentials and the bucket "xsilo". The
  // endpoint names `advertise_host`, the address other parties reach.
  static Result<std::shared_ptr<EmbeddedS3>> Start(const std::string& bind_host, int port,
                                                   const std::string& advertise_host);
  ~EmbeddedS3();  // stops the child and waits for it

  const std::string& endpoint() const { return endpoint_; }
  const std::string& access_key() const { return access_key_; }
  const std::string& secret_key() const { return secret_key_; }
  static constexpr const char* kBucket = "xsilo";

 private:
  EmbeddedS3() = default;
  pid_t pid_ = -1;
  int control_fd_ = -1;  // the child exits when this closes
  std::string endpoint_, access_key_, secret_key_;
};

}  // namespace xsilo
