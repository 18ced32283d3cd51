#include "store/redis_server.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "transport/test_util.h"

extern char** environ;

namespace xsilo::testing {

namespace {

struct RedisServer {
  pid_t pid = -1;
  int port = 0;

  explicit RedisServer(const std::string& password = "") {
    port = FreeTcpPort();
    std::vector<std::string> args = {
        "redis-server", "--port", std::to_string(port),   "--bind",    "127.0.0.1",  "--save", "",
        "--appendonly", "no",     "--proto-max-bulk-len", "536870912", "--loglevel", "warning"};
    if (!password.empty()) {
      args.push_back("--requirepass");
      args.push_back(password);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawnp(&pid, "redis-server", nullptr, nullptr, argv.data(), environ) != 0) {
      std::fprintf(stderr, "cannot start redis-server (install Debian's redis-server)\n");
      std::abort();
    }
    for (int i = 0; i < 200; ++i) {
      redisContext* c = redisConnect("127.0.0.1", port);
      bool up = c && !c->err;
      if (c) redisFree(c);
      if (up) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    std::fprintf(stderr, "redis-server did not come up on port %d\n", port);
    std::abort();
  }
  ~RedisServer() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  }
};

}  // namespace

int RedisTestPort() {
  static RedisServer server;
  return server.port;
}

int RedisAuthTestPort() {
  static RedisServer server(kRedisTestPassword);
  return server.port;
}

}  // namespace xsilo::testing
