#include "s3/s3rver.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <thread>

#include "transport/test_util.h"

extern char** environ;

#ifndef XSILO_SOURCE_DIR
#error "XSILO_SOURCE_DIR must be defined (the repository root, where node_modules/ lives)"
#endif

namespace xsilo::testing {

namespace {

using namespace std::chrono_literals;

bool Accepts(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

std::string ExitDescription(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "stopped";
}

}  // namespace

std::string S3rverExecutable() {
  if (const char* p = std::getenv("XSILO_S3RVER"); p != nullptr && *p != '\0') return p;
  return std::string(XSILO_SOURCE_DIR) + "/node_modules/.bin/s3rver";
}

Result<std::unique_ptr<S3rver>> S3rver::Start(S3rverOptions options) {
  const std::string exe = S3rverExecutable();
  if (access(exe.c_str(), X_OK) != 0) {
    return FailedPrecondition("s3rver is not installed (" + exe +
                              " is missing): run scripts/install-deps.sh, which `make test` "
                              "runs, to npm-install it");
  }
  std::unique_ptr<S3rver> s(new S3rver);
  s->port_ = options.port != 0 ? options.port : FreeTcpPort();
  std::string tmpl = (std::filesystem::temp_directory_path() / "xsilo-s3rver-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return Internal("mkdtemp " + tmpl + ": " + std::strerror(errno));
  }
  s->dir_ = tmpl;

  std::vector<std::string> args = {exe,
                                   "--directory",
                                   s->dir_,
                                   "--address",
                                   "127.0.0.1",
                                   "--port",
                                   std::to_string(s->port_),
                                   "--silent"};
  for (const auto& b : options.buckets) {
    args.push_back("--configure-bucket");
    args.push_back(b);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // s3rver makes ListObjectsV2 continuation tokens with DES, which Node's
  // OpenSSL 3 provides only from its legacy provider (else every truncated
  // listing is a 500 ERR_OSSL_EVP_UNSUPPORTED).
  std::vector<std::string> env;
  std::string node_options = "NODE_OPTIONS=--openssl-legacy-provider";
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view v(*e);
    if (v.starts_with("NODE_OPTIONS=")) {
      node_options += " " + std::string(v.substr(std::strlen("NODE_OPTIONS=")));
    } else {
      env.emplace_back(v);
    }
  }
  env.push_back(node_options);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return Internal(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Dies with the test process (even when that one is killed), so no
    // server outlives a crashed test. Only async-signal-safe calls here.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, STDOUT_FILENO);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  s->pid_ = pid;

  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!Accepts(s->port_)) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      s->pid_ = -1;
      return Unavailable("s3rver (" + exe + ") on port " + std::to_string(s->port_) + " " +
                         ExitDescription(status) + " before accepting connections");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Unavailable("s3rver did not accept connections on port " + std::to_string(s->port_) +
                         " within 20 s");
    }
    std::this_thread::sleep_for(20ms);
  }
  return s;
}

S3rver::~S3rver() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int status = 0;
    bool gone = false;
    for (int i = 0; i < 250 && !gone; ++i) {
      gone = waitpid(pid_, &status, WNOHANG) == pid_;
      if (!gone) std::this_thread::sleep_for(20ms);
    }
    if (!gone) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

namespace {

struct Shared {
  std::mutex mu;
  int port = 0;
  bool attempted = false;
  Status status;
  std::unique_ptr<S3rver> server;  // stopped at exit
};

Shared& TheShared() {
  static Shared shared;
  return shared;
}

}  // namespace

std::string SharedS3rverEndpoint() {
  Shared& s = TheShared();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.port == 0) s.port = FreeTcpPort();
  return "http://127.0.0.1:" + std::to_string(s.port);
}

Status StartSharedS3rver() {
  SharedS3rverEndpoint();  // fixes the port
  Shared& s = TheShared();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.attempted) {
    s.attempted = true;
    auto r = S3rver::Start({.port = s.port, .buckets = {kSharedS3rverBucket}});
    if (r.ok()) {
      s.server = std::move(r).value();
    } else {
      s.status = r.status();
    }
  }
  return s.status;
}

}  // namespace xsilo::testing
