#include "xsilo/bench/process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

extern char** environ;

namespace xsilo::bench {

uint64_t StatusBytes(const std::string& pid, const char* key) {
  std::ifstream in("/proc/" + pid + "/status");
  std::string line;
  const size_t klen = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, klen, key) == 0 && line.size() > klen && line[klen] == ':')
      return std::stoull(line.substr(klen + 1)) * 1024;
  }
  return 0;
}

int OpenFds(const std::string& pid) {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + pid + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return ec ? -1 : n;
}

bool ResetPeakRss(const std::string& pid) {
  std::ofstream out("/proc/" + pid + "/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

namespace {

void AddChildren(const std::string& pid, std::vector<pid_t>* out) {
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + pid + "/task", ec)) {
    std::ifstream in(task.path() / "children");
    pid_t child;
    while (in >> child) {
      out->push_back(child);
      AddChildren(std::to_string(child), out);
    }
  }
}

}  // namespace

std::vector<pid_t> ChildPids() {
  std::vector<pid_t> out;
  AddChildren("self", &out);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void ResetChildrenPeakRss() {
  for (pid_t p : ChildPids()) ResetPeakRss(std::to_string(p));
}

uint64_t ChildrenPeakRss(const std::set<pid_t>& skip) {
  uint64_t sum = 0;
  for (pid_t p : ChildPids()) {
    if (!skip.count(p)) sum += StatusBytes(std::to_string(p), "VmHWM");
  }
  return sum;
}

int FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  if (fd >= 0) ::close(fd);
  return port;
}

pid_t SpawnSelfWithEnv(const std::string& assignment) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.push_back(assignment);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  char* argv[] = {exe.data(), nullptr};
  pid_t pid = -1;
  if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return -1;
  return pid;
}

std::string SelfExe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : p.string();
}

bool ReadHostCpu(HostCpuSample* s) {
  std::ifstream f("/proc/stat");
  std::string cpu;
  uint64_t v[8] = {};  // user nice system idle iowait irq softirq steal
  if (!(f >> cpu) || cpu != "cpu") return false;
  for (auto& x : v)
    if (!(f >> x)) return false;
  s->total = 0;
  for (auto x : v) s->total += x;
  s->busy = s->total - v[3] - v[4];
  s->unix_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return true;
}

double HostBusyBetween(const std::vector<HostCpuSample>& samples, double from, double to) {
  const HostCpuSample* a = nullptr;
  const HostCpuSample* b = nullptr;
  for (const auto& s : samples) {
    if (s.unix_s < from || s.unix_s > to) continue;
    if (a == nullptr) a = &s;
    b = &s;
  }
  if (a == nullptr || b == a || b->total <= a->total || b->busy < a->busy) return -1;
  return static_cast<double>(b->busy - a->busy) / static_cast<double>(b->total - a->total);
}

}  // namespace xsilo::bench
