#include "sys.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

namespace xsilo::netem::internal {

namespace {

using Clock = std::chrono::steady_clock;

// Waits for a child with a deadline; returns its wait status or -1.
int WaitChild(pid_t pid, Clock::time_point deadline) {
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

Result<std::string> RunCommand(const std::vector<std::string>& argv,
                               std::chrono::milliseconds timeout) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return Internal(std::string("pipe: ") + strerror(errno));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    return Internal(std::string("fork: ") + strerror(errno));
  }
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    execvp(args[0], args.data());
    dprintf(2, "cannot run %s: %s\n", args[0], strerror(errno));
    _exit(127);
  }
  close(out[1]);
  const auto deadline = Clock::now() + timeout;
  std::string output;
  char buf[4096];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    pollfd p{out[0], POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    ssize_t n = read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    output.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  int status = WaitChild(pid, deadline);
  if (status < 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return Timeout(argv[0] + " did not finish within " + std::to_string(timeout.count()) + " ms");
  }
  while (!output.empty() && output.back() == '\n') output.pop_back();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    return Internal("'" + cmd + "' failed: " + output);
  }
  return output;
}

bool ProcessAlive(pid_t pid) {
  if (pid <= 0) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  size_t close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) return false;
  char state = line[close_paren + 2];
  return state != 'Z' && state != 'X';
}

std::string ProcessName(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

Status StopProcess(pid_t pid, std::chrono::milliseconds grace) {
  // A child of ours that has exited stays a zombie (and kill(pid, 0) still
  // finds it) until it is reaped, so reap after seeing it dead as well as
  // before: it may die between the two looks.
  auto gone = [pid](Clock::time_point deadline) {
    while (true) {
      waitpid(pid, nullptr, WNOHANG);
      if (!ProcessAlive(pid)) {
        waitpid(pid, nullptr, WNOHANG);
        return true;
      }
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  if (!ProcessAlive(pid)) {
    waitpid(pid, nullptr, WNOHANG);
    return Status::OK();
  }
  kill(pid, SIGTERM);
  if (gone(Clock::now() + grace)) return Status::OK();
  kill(pid, SIGKILL);
  if (gone(Clock::now() + std::chrono::seconds(2))) return Status::OK();
  return Timeout("process " + std::to_string(pid) + " survived SIGKILL");
}

std::vector<pid_t> ProcessesInNetns(const std::string& name) {
  std::vector<pid_t> pids;
  struct stat ns;
  if (stat((std::string(kNetnsDir) + "/" + name).c_str(), &ns) != 0) return pids;
  DIR* d = opendir("/proc");
  if (!d) return pids;
  const pid_t self = getpid();
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == self) continue;
    struct stat st;
    std::string path = std::string("/proc/") + e->d_name + "/ns/net";
    if (stat(path.c_str(), &st) == 0 && st.st_ino == ns.st_ino && st.st_dev == ns.st_dev) {
      pids.push_back(static_cast<pid_t>(pid));
    }
  }
  closedir(d);
  return pids;
}

Status EnterNetns(const std::string& name) {
  std::string path = std::string(kNetnsDir) + "/" + name;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound("network namespace " + path + ": " + strerror(errno));
  int r = setns(fd, CLONE_NEWNET);
  int err = errno;
  close(fd);
  if (r != 0) return PermissionDenied("setns into " + path + ": " + strerror(err));
  return Status::OK();
}

Status WriteSysctl(const std::string& path, const std::string& value) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Internal("open " + path + ": " + strerror(errno));
  ssize_t n = write(fd, value.data(), value.size());
  int err = errno;
  close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    return Internal("write " + path + ": " + strerror(err));
  }
  return Status::OK();
}

}  // namespace xsilo::netem::internal
