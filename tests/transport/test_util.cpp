#include "transport/test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "xsilo/core/codec.h"

extern char** environ;

namespace xsilo::testing {

namespace {
uint64_t StatusField(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  size_t klen = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, klen, key) == 0 && line.size() > klen && line[klen] == ':') {
      return std::stoull(line.substr(klen + 1)) * 1024;
    }
  }
  return 0;
}
}  // namespace

uint64_t CurrentRss() { return StatusField("VmRSS"); }
uint64_t PeakRss() { return StatusField("VmHWM"); }

bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

namespace {
bool Bindable(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as servers bind
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// The kernel's first ephemeral port (default 32768).
int EphemeralLow() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (!(in >> low) || low <= 20000) return 32768;
  return low;
}
}  // namespace

// Below the ephemeral range: a port the kernel handed out for bind(0) is
// from the range every connect() draws from, so that a test's own clients
// (or a test running alongside) could take it, or the ports next to it,
// before the server bound it (GrpcUnary, whose rank r listens at port + r,
// failed with "Address already in use" in 2 of 60 runs).
int FreeTcpPort(int count) {
  static std::mt19937 rng(static_cast<uint32_t>(::getpid()) * 2654435761u ^
                          static_cast<uint32_t>(std::random_device{}()));
  const int high = EphemeralLow() - count;
  std::uniform_int_distribution<int> pick(20000, high);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int base = pick(rng);
    bool free = true;
    for (int i = 0; i < count && free; ++i) free = Bindable(base + i);
    if (free) return base;
  }
  return 0;
}

Tensor PatternTensor(uint64_t bytes, uint64_t seed) {
  Buffer b = std::move(Buffer::Allocate(bytes)).value();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  uint8_t* p = b.mutable_data();
  uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < bytes; ++i) p[i] = static_cast<uint8_t>(seed + i);
  return std::move(Tensor::Make(DType::kU8, {static_cast<int64_t>(bytes)}, std::move(b))).value();
}

Message PatternMessage(uint64_t bytes, uint64_t seed, int64_t round) {
  Message m;
  m.type = "pattern";
  m.round = round;
  Tensor t = PatternTensor(bytes, seed);
  m.params["xxh3"] = static_cast<int64_t>(Checksum(t.data.span()));
  m.tensors.emplace("w", std::move(t));
  return m;
}

bool PatternIntact(const Message& m) {
  auto it = m.tensors.find("w");
  auto sum = m.GetInt("xxh3");
  if (it == m.tensors.end() || !sum.ok()) return false;
  return static_cast<int64_t>(Checksum(it->second.data.span())) == *sum;
}

pid_t SpawnSelfWithEnv(const std::string& assignment) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
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

}  // namespace xsilo::testing
