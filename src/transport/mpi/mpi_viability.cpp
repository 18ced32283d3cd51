// Whether MPI can run in this process: launched by mpirun, or a
// singleton MPI_Init that succeeds in a forked child.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "transport/mpi/mpi_engine_internal.h"

namespace xsilo::mpi {

namespace {

// Tries MPI_Init in a forked child, so a failing singleton init (which
// aborts the process) cannot take this one down.
Status ProbeSingleton() {
  const std::string why = "not launched by mpirun (OMPI_COMM_WORLD_SIZE unset) and ";
  int fds[2];
  if (pipe(fds) != 0) return Unavailable(why + "cannot probe a singleton MPI_Init (pipe failed)");
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return Unavailable(why + "cannot probe a singleton MPI_Init (fork failed)");
  }
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, 1);
    dup2(fds[1], 2);
    close(fds[0]);
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) _exit(3);
    MPI_Finalize();
    _exit(provided >= MPI_THREAD_FUNNELED ? 0 : 4);
  }
  close(fds[1]);
  std::string err;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  int status = 0;
  bool exited = false;
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {
      char buf[512];
      ssize_t n = read(fds[0], buf, sizeof buf);
      if (n > 0 && err.size() < 4096) err.append(buf, static_cast<size_t>(n));
    }
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    if (Clock::now() > deadline) break;
  }
  close(fds[0]);
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return Unavailable(why + "a singleton MPI_Init did not finish within 20 s");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::OK();
  std::string first_line;
  for (char c : err) {
    if (c == '\n' && !first_line.empty()) break;
    if (c != '\n') first_line += c;
  }
  return Unavailable(why + "a singleton MPI_Init failed" +
                     (first_line.empty() ? "" : " (" + first_line + ")"));
}

}  // namespace

Status MpiViable() {
  if (Engine::Initialized()) return Status::OK();
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr) {
    return Status::OK();
  }
  const char* singleton = std::getenv("XSILO_MPI_SINGLETON");
  if (singleton != nullptr && std::string(singleton) == "0") {
    return Unavailable(
        "not launched by mpirun (OMPI_COMM_WORLD_SIZE unset) and XSILO_MPI_SINGLETON=0 "
        "forbids a singleton MPI_Init");
  }
  static const Status probed = ProbeSingleton();
  return probed;
}

}  // namespace xsilo::mpi
