// `xsilo s3d --metrics-port auto`: requests by method and each bucket's
// objects and bytes, scraped from the endpoint after a few uploads.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "metrics/http_get.h"
#include "xsilo/s3/client.h"
#include "xsilo/s3/credentials.h"

extern char** environ;

namespace xsilo::metrics {
namespace {

using namespace std::chrono_literals;
using testing::HttpGet;
using testing::SeriesValue;

int WaitForPort(const std::string& file, pid_t pid) {
  for (int i = 0; i < 6000; ++i) {  // a limit for a hang only
    int port = 0;
    std::ifstream in(file);
    if (in >> port && port > 0) return port;
    int status;
    if (::waitpid(pid, &status, WNOHANG) != 0) return 0;  // exited (or reaped)
    std::this_thread::sleep_for(10ms);
  }
  return 0;
}

TEST(S3dMetrics, CountsRequestsObjectsAndBytes) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("xsilo-s3d-metrics-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string port_file = dir / "s3.port", metrics_file = dir / "metrics.port",
                    log = dir / "s3d.log";
  std::vector<std::string> args = {XSILO_CLI,   "s3d",
                                   "--memory",  "--access-key",
                                   "AK",        "--secret-key",
                                   "SK",        "--bucket",
                                   "models",    "--port-file",
                                   port_file,   "--metrics-port",
                                   "auto",      "--metrics-port-file",
                                   metrics_file};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  const int metrics_port = WaitForPort(metrics_file, pid);
  const int s3_port = WaitForPort(port_file, pid);
  ASSERT_GT(metrics_port, 0);
  ASSERT_GT(s3_port, 0);

  S3ClientOptions o;
  o.endpoint = "http://127.0.0.1:" + std::to_string(s3_port);
  o.credentials = StaticCredentials({"AK", "SK"});
  auto client = S3Client::Create(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateBucket({.bucket = "extra"}).ok());
  for (auto [bucket, key, size] :
       {std::tuple<const char*, const char*, size_t>{"models", "a", 1000},
        {"models", "b", 24},
        {"extra", "c", 5}}) {
    GatherList body;
    body.Append(Buffer::CopyFrom(std::string(size, 'x')));
    ASSERT_TRUE((*client)->PutObject({.bucket = bucket, .key = key, .body = body}).ok());
  }

  auto reply = HttpGet(metrics_port, "/metrics");
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_EQ(reply.status, 200);
  const std::string& text = reply.body;
  EXPECT_EQ(SeriesValue(text, "xsilo_s3d_store_objects{bucket=\"models\"}"), 2) << text;
  EXPECT_EQ(SeriesValue(text, "xsilo_s3d_store_bytes{bucket=\"models\"}"), 1024);
  EXPECT_EQ(SeriesValue(text, "xsilo_s3d_store_objects{bucket=\"extra\"}"), 1);
  EXPECT_EQ(SeriesValue(text, "xsilo_s3d_store_bytes{bucket=\"extra\"}"), 5);
  EXPECT_GE(SeriesValue(text, "xsilo_s3d_requests_total{method=\"PUT\"}"), 4);
  EXPECT_EQ(SeriesValue(text, "xsilo_s3d_store_list_errors_total"), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace xsilo::metrics
