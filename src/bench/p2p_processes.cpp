#include "bench/p2p_processes.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "xsilo/bench/process.h"
#include "xsilo/netem/netem.h"

extern char** environ;

namespace xsilo::bench {

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// Child process groups to kill on a signal or failure.
std::mutex g_children_mu;
std::set<pid_t> g_children;
bool g_stopping = false;  // under g_children_mu: no new peers
std::atomic<bool> g_netem_up{false};
std::string g_netem_prefix;
std::string g_tmpdir;

void KillChildren() {
  std::lock_guard<std::mutex> lock(g_children_mu);
  g_stopping = true;
  for (pid_t p : g_children) kill(-p, SIGKILL);
}

// Starts argv[0] (a path) in its own process group, stdout and stderr
// appended to `log`. Signals stay unblocked in the child.
Result<pid_t> SpawnArgv(std::vector<std::string> args, const std::string& log) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
  pid_t pid = -1;
  std::lock_guard<std::mutex> lock(g_children_mu);
  if (g_stopping) {
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    return Cancelled("stopping");
  }
  int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Internal(std::string("posix_spawn: ") + strerror(rc));
  g_children.insert(pid);
  return pid;
}

}  // namespace

void StartSignalWatcher(const std::string& netem_prefix, const std::string& tmpdir) {
  g_netem_prefix = netem_prefix;
  g_tmpdir = tmpdir;
  static std::once_flag once;
  std::call_once(once, [] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread([set] {
      int sig = 0;
      sigwait(&set, &sig);
      std::cerr << "\nxsilo bench p2p: signal " << sig << ", cleaning up\n";
      KillChildren();
      if (g_netem_up) {
        netem::Options o;
        o.prefix = g_netem_prefix;
        (void)netem::Down(o);
      }
      std::error_code ec;
      if (!g_tmpdir.empty()) fs::remove_all(g_tmpdir, ec);
      _exit(128 + sig);
    }).detach();
  });
}

void SetNetemUp(bool up) { g_netem_up = up; }

void ParkIfStopping() {
  std::unique_lock<std::mutex> lock(g_children_mu);
  if (!g_stopping) return;
  lock.unlock();
  for (;;) pause();
}

Result<pid_t> SpawnPeer(const PeerSpec& spec, const std::string& log) {
  return SpawnArgv({SelfExe(), "bench", "p2p-peer", "--spec", ToJson(spec).dump()}, log);
}

Result<pid_t> SpawnMpiPeers(const PeerSpec& spec, const std::string& log) {
  return SpawnArgv(
      {"mpirun", "-np", std::to_string(spec.world), "--oversubscribe", "--allow-run-as-root",
       "--mca", "btl", "tcp,self", SelfExe(), "bench", "p2p-peer", "--spec", ToJson(spec).dump()},
      log);
}

bool Exited(pid_t pid) {
  siginfo_t si{};
  return waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOHANG | WNOWAIT) != 0 ||
         si.si_pid != 0;
}

int WaitPeers(const std::vector<pid_t>& pids, Clock::time_point deadline, bool* timed_out,
              std::chrono::seconds orphan_grace, bool* orphaned) {
  std::set<pid_t> left(pids.begin(), pids.end());
  int failed = 0;
  std::optional<Clock::time_point> sender_gone;
  while (!left.empty()) {
    for (auto it = left.begin(); it != left.end();) {
      int st = 0;
      pid_t r = waitpid(*it, &st, WNOHANG);
      if (r == *it) {
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failed;
        kill(-*it, SIGKILL);  // anything it left in its group (the S3 server)
        if (!pids.empty() && *it == pids.front()) sender_gone = Clock::now();
        std::lock_guard<std::mutex> lock(g_children_mu);
        g_children.erase(*it);
        it = left.erase(it);
      } else {
        ++it;
      }
    }
    if (left.empty()) break;
    const bool orphans = sender_gone && Clock::now() > *sender_gone + orphan_grace;
    if (Clock::now() > deadline || orphans) {
      if (orphans && orphaned) *orphaned = true;
      if (!orphans) *timed_out = true;
      for (pid_t p : left) kill(-p, SIGTERM);  // mpirun stops its ranks on TERM
      std::this_thread::sleep_for(std::chrono::seconds(2));
      for (pid_t p : left) kill(-p, SIGKILL);
      for (pid_t p : left) {
        waitpid(p, nullptr, 0);
        std::lock_guard<std::mutex> lock(g_children_mu);
        g_children.erase(p);
        ++failed;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return failed;
}

}  // namespace xsilo::bench
