#include "store/store_test_util.h"

#include "store/child_env.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#include "store/connector_conformance.h"
#include "store/redis_server.h"
#include "xsilo/core/codec.h"
#include "xsilo/s3/server.h"
#include "xsilo/store/future.h"
#include "xsilo/store/proxy.h"

extern char** environ;

namespace xsilo::testing {

namespace {

constexpr const char* kModeEnv = "XSILO_STORE_CHILD_MODE";
constexpr const char* kArgEnv = "XSILO_STORE_CHILD_ARG";
std::atomic<int> g_counter{0};

struct TempDirs {
  std::mutex mu;
  std::vector<std::filesystem::path> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};

}  // namespace

int ChildExitCode(const Status& s) { return s.ok() ? 0 : 10 + static_cast<int>(s.code()); }

std::optional<StoreChildRequest> RequestedStoreChild() {
  const char* mode = std::getenv(kModeEnv);
  const char* arg = std::getenv(kArgEnv);
  if (!mode || !arg) return std::nullopt;
  return StoreChildRequest{mode, arg};
}

std::string StoreTempDir() {
  static TempDirs temp;
  auto dir = std::filesystem::temp_directory_path() /
             ("xsilo-store-test-" + std::to_string(getpid()) + "-" + std::to_string(g_counter++));
  std::filesystem::create_directories(dir);
  std::lock_guard<std::mutex> lock(temp.mu);
  temp.dirs.push_back(dir);
  return dir.string();
}

// One embedded S3 server per test process, started on first use; child
// processes reach it through the endpoint and keys in the connector config.
const std::string& EmbeddedS3ForTests() {
  static std::unique_ptr<S3Server> server;
  static const std::string endpoint = [] {
    S3ServerOptions o;
    o.access_key = "store-test-ak";
    o.secret_key = "store-test-sk";
    auto s = S3Server::Start(o);
    if (!s.ok()) return std::string();
    server = std::move(s).value();
    ::testing::AddGlobalTestEnvironment(new StopAtEnd<S3Server>(server.get()));
    return server->endpoint();
  }();
  return endpoint;
}

ConnectorConfig FreshConnectorConfig(const std::string& kind) {
  if (kind == "file") return {"file", {{"dir", StoreTempDir()}}};
  if (kind == "s3") {
    return {"s3",
            {{"endpoint", EmbeddedS3ForTests()},
             {"bucket", "store-test"},
             {"access_key", "store-test-ak"},
             {"secret_key", "store-test-sk"},
             {"addressing", "path"},
             {"prefix", "p" + std::to_string(getpid()) + "-" + std::to_string(g_counter++) + "/"}}};
  }
  if (kind == "redis") {
    return {"redis",
            {{"port", std::to_string(RedisTestPort())},
             {"prefix", "p" + std::to_string(getpid()) + "-" + std::to_string(g_counter++)}}};
  }
  return {"memory", {{"name", "m" + std::to_string(g_counter++)}}};
}

// Modes:
//   resolve <proxy json>       resolve a Proxy<TensorMap>; exit 0 when tensor "w"
//                              has checksum XSILO_STORE_CHILD_SUM and the store
//                              got registered
//   resolve-string <json>      resolve a Proxy<std::string>; exit ChildExitCode(status)
//   future-set <json>          set a Future<std::string> to "from child"
//   future-get <json>          await a Future<std::string> (60 s); exit 0 when it
//                              reads "from parent"
bool RunStoreChildIfRequested(int* exit_code) {
  std::optional<StoreChildRequest> request = RequestedStoreChild();
  if (!request) return false;
  const std::string& mode = request->mode;
  const std::string& arg = request->arg;
  if (mode == "resolve") {
    auto proxy = Proxy<TensorMap>::Deserialize(arg);
    if (!proxy.ok()) return *exit_code = 2, true;
    auto tensors = proxy->Get();
    if (!tensors.ok()) return *exit_code = ChildExitCode(tensors.status()), true;
    auto it = (*tensors)->find("w");
    const char* sum = std::getenv("XSILO_STORE_CHILD_SUM");
    if (it == (*tensors)->end() || !sum || Checksum(it->second.data.span()) != std::stoull(sum)) {
      return *exit_code = 3, true;
    }
    // The store was re-created and registered from the reference.
    *exit_code = StoreRegistry::Global().Find(proxy->reference()->store.name) ? 0 : 4;
    return true;
  }
  if (mode == "resolve-string") {
    auto proxy = Proxy<std::string>::Deserialize(arg);
    if (!proxy.ok()) return *exit_code = 2, true;
    *exit_code = ChildExitCode(proxy->Resolve());
    return true;
  }
  if (mode == "future-set") {
    auto f = Future<std::string>::Deserialize(arg);
    if (!f.ok()) return *exit_code = 2, true;
    *exit_code = ChildExitCode(f->Set("from child"));
    return true;
  }
  if (mode == "future-get") {
    auto f = Future<std::string>::Deserialize(arg);
    if (!f.ok()) return *exit_code = 2, true;
    auto v = f->Get(std::chrono::seconds(60));
    *exit_code = !v.ok() ? ChildExitCode(v.status()) : *v == "from parent" ? 0 : 3;
    return true;
  }
  *exit_code = 99;
  return true;
}

int SpawnStoreChild(const std::string& mode, const std::string& arg,
                    const std::vector<std::string>& extra_env) {
  // The child's own credentials for FreshConnectorConfig("s3")'s server.
  std::vector<std::string> env = EnvironWithS3Credentials("store-test-ak", "store-test-sk");
  env.push_back(std::string(kModeEnv) + "=" + mode);
  env.push_back(std::string(kArgEnv) + "=" + arg);
  for (const auto& e : extra_env) env.push_back(e);
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  char* argv[] = {exe.data(), nullptr};
  pid_t pid;
  if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return -1;
  return pid;
}

int WaitChild(int pid) {
  if (pid <= 0) return -1;
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace xsilo::testing
