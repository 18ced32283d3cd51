#include "hybrid/embedded_s3.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "xsilo/core/log.h"
#include "xsilo/s3/server.h"
#include "xsilo/store/connector.h"

namespace xsilo {

namespace {

// The embedded server's start and restarts (the supervisor and the server
// are forked children of the party).
constinit LogComponent kS3Log("s3");

// Closes every descriptor from 3 up except `a` and `b`.
void CloseAllExcept(int a, int b) {
  int lo = std::min(a, b), hi = std::max(a, b);
  if (lo > 3) ::close_range(3, lo - 1, 0);
  if (hi > lo + 1) ::close_range(lo + 1, hi - 1, 0);
  ::close_range(hi + 1, ~0U, 0);
}

// Runs in the server process: serve until the control pipe closes (the
// party is done, or died). Never returns.
// What every server process of one EmbeddedS3 is started with.
struct ServerSpec {
  std::string host;
  int port = 0;
  std::string access, secret, directory;
  std::string tls_cert, tls_key;  // both empty: plain HTTP
  int max_connections = 64;
};

[[noreturn]] void Serve(int ready_fd, int control_fd, const ServerSpec& spec, int port) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with its supervisor
  S3ServerOptions o;
  o.host = spec.host;
  o.port = port;
  o.access_key = spec.access;
  o.secret_key = spec.secret;
  o.buckets = {EmbeddedS3::kBucket};
  o.directory = spec.directory;
  o.tls_cert_file = spec.tls_cert;
  o.tls_key_file = spec.tls_key;
  o.recycle_bytes = 2ull << 30;  // the files of evicted models, for the next ones
  o.md5_etags = false;           // its clients are xsilo's parties, which never check ETags as MD5
  o.min_part_bytes = EmbeddedS3::kMinPartBytes;
  o.max_connections = spec.max_connections;
  auto server = S3Server::Start(o);
  int32_t bound = server.ok() ? (*server)->port() : -1;
  if (!server.ok()) {
    XSILO_LOG(kS3Log, kError,
              "the embedded S3 server did not start: " << server.status().ToString());
  }
  (void)!::write(ready_fd, &bound, sizeof(bound));
  ::close(ready_fd);
  if (server.ok()) {
    char c;
    while (::read(control_fd, &c, 1) < 0 && errno == EINTR) {
    }
    server->reset();
  }
  _exit(server.ok() ? 0 : 1);
}

// Forks a server process; its bound port (or -1) comes back on *bound.
pid_t SpawnServer(int control_fd, const ServerSpec& spec, int port, int32_t* bound) {
  *bound = -1;
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    CloseAllExcept(ready[1], control_fd);
    Serve(ready[1], control_fd, spec, port);
  }
  ::close(ready[1]);
  if (pid > 0) {
    pollfd p{ready[0], POLLIN, 0};
    if (::poll(&p, 1, 30000) != 1 || ::read(ready[0], bound, sizeof(*bound)) != sizeof(*bound)) {
      *bound = -1;
    }
  }
  ::close(ready[0]);
  return pid;
}

// Runs in the forked child, single-threaded: supervises the server process
// and, should it die (killed, crashed), starts another on the same
// directory, port and credentials, so the URLs the party handed out stay
// valid and no stored object is lost. Exits when the control pipe closes.
[[noreturn]] void SuperviseInChild(int ready_fd, int control_fd, const ServerSpec& spec) {
  // Dies with the party. (The signal follows the forking *thread*: create
  // the transport on a thread that lives as long as it.)
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Keep none of the party's descriptors (listening sockets, files): only
  // the two pipe ends.
  CloseAllExcept(ready_fd, control_fd);
  int32_t bound = -1;
  pid_t server = SpawnServer(control_fd, spec, spec.port, &bound);
  (void)!::write(ready_fd, &bound, sizeof(bound));
  ::close(ready_fd);
  if (server <= 0 || bound <= 0) _exit(1);
  std::chrono::milliseconds backoff{50};
  for (;;) {
    // Wait for the control pipe to close or the server to exit.
    int server_fd = static_cast<int>(::syscall(SYS_pidfd_open, server, 0));
    pollfd p[2] = {{control_fd, POLLIN, 0}, {server_fd, POLLIN, 0}};
    int n = ::poll(p, server_fd >= 0 ? 2 : 1, server_fd >= 0 ? -1 : 100);
    if (server_fd >= 0) ::close(server_fd);
    if (n < 0 && errno != EINTR) break;
    if (p[0].revents != 0) break;  // the party closed the pipe: stop
    int wstatus = 0;
    if (::waitpid(server, &wstatus, WNOHANG) != server) continue;
    XSILO_LOG(kS3Log, kWarn,
              "the embedded S3 server (pid "
                  << server << ") " << (WIFSIGNALED(wstatus) ? "was killed by signal " : "exited ")
                  << (WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : WEXITSTATUS(wstatus))
                  << "; restarting it on the same directory and port " << bound);
    // Until the port is free again (connections of the dead server may
    // linger) or the party stops, with backoff.
    for (;;) {
      int32_t again = -1;
      server = SpawnServer(control_fd, spec, bound, &again);
      if (server > 0 && again == bound) break;
      if (server > 0) ::waitpid(server, nullptr, 0);
      pollfd c{control_fd, POLLIN, 0};
      if (::poll(&c, 1, static_cast<int>(backoff.count())) != 0) _exit(0);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
    }
    backoff = std::chrono::milliseconds(50);
  }
  // Stopping: the server saw the pipe close too; give it a moment to finish.
  for (int i = 0; i < 200 && ::waitpid(server, nullptr, WNOHANG) == 0; ++i) ::usleep(10000);
  ::kill(server, SIGKILL);
  ::waitpid(server, nullptr, 0);
  _exit(0);
}

constexpr const char* kDirPrefix = "xsilo-s3-";

// Storage directories left by runs that were killed (named after their pid,
// which no longer exists) are removed.
void SweepStale(const std::filesystem::path& base) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(kDirPrefix, 0) != 0) continue;
    long pid = std::strtol(name.c_str() + std::strlen(kDirPrefix), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::filesystem::remove_all(e.path(), ec);
    }
  }
}

// A fresh private directory on tmpfs when there is one.
Result<std::string> MakeStorageDirectory() {
  std::error_code ec;
  std::filesystem::path base = "/dev/shm";
  if (!std::filesystem::is_directory(base, ec) || ::access(base.c_str(), W_OK) != 0) {
    base = std::filesystem::temp_directory_path(ec);
  }
  SweepStale(base);
  std::string tmpl =
      (base / (std::string(kDirPrefix) + std::to_string(::getpid()) + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return Internal("mkdtemp " + tmpl + ": " + std::strerror(errno));
  }
  return tmpl;
}

}  // namespace

Result<std::shared_ptr<EmbeddedS3>> EmbeddedS3::Start(const std::string& bind_host, int port,
                                                      const std::string& advertise_host,
                                                      const EmbeddedTls& tls, int max_connections) {
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return InvalidArgument("the embedded S3 server needs both a TLS certificate and its key");
  }
  int ready[2], control[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return Internal(std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(control, O_CLOEXEC) != 0) {
    ::close(ready[0]);
    ::close(ready[1]);
    return Internal(std::string("pipe: ") + std::strerror(errno));
  }
  std::string access = RandomObjectId().substr(0, 20);
  std::string secret = RandomObjectId();
  auto dir = MakeStorageDirectory();
  if (!dir.ok()) {
    for (int fd : {ready[0], ready[1], control[0], control[1]}) ::close(fd);
    return dir.status();
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    for (int fd : {ready[0], ready[1], control[0], control[1]}) ::close(fd);
    std::error_code ec;
    std::filesystem::remove_all(*dir, ec);
    return Internal(std::string("fork: ") + std::strerror(err));
  }
  if (pid == 0) {
    ::close(ready[0]);
    ::close(control[1]);
    SuperviseInChild(ready[1], control[0],
                     ServerSpec{bind_host, port, access, secret, *dir, tls.cert_file, tls.key_file,
                                std::max(1, max_connections)});
  }
  ::close(ready[1]);
  ::close(control[0]);
  std::shared_ptr<EmbeddedS3> s(new EmbeddedS3());
  s->directory_ = *dir;
  s->pid_ = pid;
  s->control_fd_ = control[1];
  s->access_key_ = access;
  s->secret_key_ = secret;
  int32_t bound = -1;
  pollfd p{ready[0], POLLIN, 0};
  if (::poll(&p, 1, 30000) == 1 && ::read(ready[0], &bound, sizeof(bound)) == sizeof(bound) &&
      bound > 0) {
    const std::string& host = advertise_host;
    s->endpoint_ = std::string(tls.cert_file.empty() ? "http://" : "https://") +
                   (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
                   std::to_string(bound);
  }
  ::close(ready[0]);
  if (s->endpoint_.empty()) {
    return Unavailable("the embedded S3 server did not start on " + bind_host + ":" +
                       std::to_string(port));
  }
  return s;
}

EmbeddedS3::~EmbeddedS3() {
  if (control_fd_ >= 0) ::close(control_fd_);
  if (pid_ > 0) {
    // Give it a moment to close its connections, then make sure.
    bool exited = false;
    for (int i = 0; i < 200 && !exited; ++i) {
      exited = ::waitpid(pid_, nullptr, WNOHANG) == pid_;
      if (!exited) ::usleep(10000);
    }
    if (!exited) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  if (!directory_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(directory_, ec);
  }
}

}  // namespace xsilo
