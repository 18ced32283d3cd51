// The embedded S3-compatible server that a hybrid "+s3" server party runs
// by default, in a process of its own under a supervisor child: should the
// server die, the supervisor starts another on the same directory, port
// and credentials (an upload in progress then is lost; stored objects are
// not). Its objects are files in a
// private tmpfs directory (/dev/shm, else the temp directory): the parent
// stores its own uploads there directly (s3::PutObjectInDirectory), with no
// HTTP and no copy through a socket, and the bytes are charged to neither
// process's RSS; the sender's memory holds just the model.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "xsilo/core/status.h"

namespace xsilo {

struct EmbeddedTls {
  std::string cert_file, key_file;  // PEM; both empty: plain HTTP
};

class EmbeddedS3 {
 public:
  // Forks a supervisor child that runs a server process serving S3 (objects
  // in directory()) on bind_host:port (0 =
  // ephemeral) with fresh random credentials and the bucket "xsilo". The
  // endpoint names `advertise_host`, the address other parties reach.
  // With a TLS pair it serves HTTPS (endpoint() "https://...").
  // It serves up to `max_connections` connections at once (a worker
  // thread each, started as they come) and accepts multipart parts of
  // kMinPartBytes and more.
  static Result<std::shared_ptr<EmbeddedS3>> Start(const std::string& bind_host, int port,
                                                   const std::string& advertise_host,
                                                   const EmbeddedTls& tls = {},
                                                   int max_connections = 64);
  ~EmbeddedS3();  // stops the supervisor and the server, and waits for them

  const std::string& endpoint() const { return endpoint_; }
  const std::string& access_key() const { return access_key_; }
  const std::string& secret_key() const { return secret_key_; }
  const std::string& directory() const { return directory_; }
  // The supervisor process (the server is its only child).
  pid_t supervisor_pid() const { return pid_; }
  static constexpr const char* kBucket = "xsilo";
  // The smallest part (but the last) of a multipart upload it accepts:
  // below S3's 5 MiB, so that a credential-less party's upload of a few
  // MB still runs over all its connections (HybridOptions::
  // min_part_bytes, which grants carry).
  static constexpr uint64_t kMinPartBytes = 64 << 10;

 private:
  EmbeddedS3() = default;
  pid_t pid_ = -1;
  int control_fd_ = -1;  // the supervisor and the server exit when this closes
  std::string endpoint_, access_key_, secret_key_, directory_;
};

}  // namespace xsilo
