// Scrapes `xsilo fl run`'s /metrics endpoint while a 3-round grpc+s3 job
// (small tier, 2 clients) runs, then checks the final counters against the
// bytes the job moved, as its JSON report tells them. The endpoint binds
// an ephemeral port, which the command writes to --metrics-port-file; it
// keeps serving after the job (--metrics-linger) until SIGTERM.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "metrics/http_get.h"

extern char** environ;

namespace xsilo::metrics {
namespace {

using namespace std::chrono_literals;
using testing::HttpGet;
using testing::SeriesValue;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The sum of every series of `name` whose labels contain `label`.
double Sum(const std::string& text, const std::string& name, const std::string& label) {
  double total = 0;
  size_t pos = 0;
  while ((pos = text.find(name + "{", pos)) != std::string::npos) {
    const size_t end = text.find('\n', pos);
    const std::string line = text.substr(pos, end - pos);
    pos = end;
    if (pos != std::string::npos && line.find(label) == std::string::npos) continue;
    total += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return total;
}

TEST(FlJobMetrics, CountersMatchTheBytesTheJobMoved) {
  constexpr int kClients = 2, kRounds = 3;
  const auto dir =
      std::filesystem::temp_directory_path() / ("xsilo-fl-metrics-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string port_file = dir / "metrics.port", json = dir / "job.json",
                    log = dir / "run.log";
  std::vector<std::string> args = {XSILO_CLI,
                                   "fl",
                                   "run",
                                   "--transport",
                                   "grpc+s3",
                                   "--clients",
                                   std::to_string(kClients),
                                   "--rounds",
                                   std::to_string(kRounds),
                                   "--tier",
                                   "small",
                                   "--quiet",
                                   "--json",
                                   json,
                                   "--metrics-port",
                                   "auto",
                                   "--metrics-port-file",
                                   port_file,
                                   "--metrics-linger",
                                   "600"};
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

  // Scrape until the job reports it finished; the limit only catches a hang.
  int port = 0;
  std::string text;
  int scrapes = 0;
  const auto give_up = std::chrono::steady_clock::now() + 600s;
  while (std::chrono::steady_clock::now() < give_up) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;
      break;  // exited early: fails below, with its log
    }
    if (port == 0) {
      std::ifstream in(port_file);
      in >> port;
    }
    if (port > 0) {
      auto reply = HttpGet(port, "/metrics");
      if (reply.status == 200) {
        ++scrapes;
        text = reply.body;
        if (SeriesValue(text, "xsilo_fl_job_finished") == 1) break;
      }
    }
    std::this_thread::sleep_for(20ms);
  }
  if (pid > 0) {
    ::kill(pid, SIGTERM);  // ends the linger
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Slurp(log);
  }
  ASSERT_EQ(SeriesValue(text, "xsilo_fl_job_finished"), 1) << Slurp(log) << text;
  EXPECT_GE(scrapes, 1);

  const auto report = nlohmann::json::parse(Slurp(json));
  ASSERT_EQ(report["rounds"].size(), size_t{kRounds});
  uint64_t report_sent = 0, report_received = 0;
  for (const auto& r : report["rounds"]) {
    report_sent += r["bytes_sent"].get<uint64_t>();
    report_received += r["bytes_received"].get<uint64_t>();
  }
  const double model_bytes = SeriesValue(text, "xsilo_fl_model_bytes");
  EXPECT_EQ(model_bytes, 4.0 * report["model"]["parameters"].get<double>());  // float32

  EXPECT_EQ(SeriesValue(text, "xsilo_fl_job_ok"), 1);
  EXPECT_EQ(SeriesValue(text, "xsilo_fl_rounds_total"), kRounds);
  EXPECT_EQ(SeriesValue(text, "xsilo_fl_rounds_completed_total"), kRounds);
  EXPECT_EQ(SeriesValue(text, "xsilo_fl_updates_received_total"), kRounds * kClients);
  EXPECT_EQ(SeriesValue(text, "xsilo_fl_model_bytes_sent_total"), double(report_sent));
  EXPECT_EQ(SeriesValue(text, "xsilo_fl_update_bytes_received_total"), double(report_received));

  // What the server's transport moved: every round's model to every client,
  // plus the final model (fl.finish); the updates back.
  const std::string server = "party=\"server\"";
  const double sent = Sum(text, "xsilo_transport_sent_bytes_total", server);
  EXPECT_GE(sent, double(kRounds) * kClients * model_bytes);
  EXPECT_EQ(sent, double(report_sent) + kClients * model_bytes);
  EXPECT_EQ(Sum(text, "xsilo_transport_sent_messages_total", server), (kRounds + 1) * kClients);
  EXPECT_EQ(Sum(text, "xsilo_transport_send_errors_total", server), 0);
  EXPECT_EQ(Sum(text, "xsilo_transport_received_bytes_total", server), double(report_received));
  for (int c = 1; c <= kClients; ++c) {
    const std::string client = "party=\"client " + std::to_string(c) + "\"";
    EXPECT_EQ(Sum(text, "xsilo_transport_received_bytes_total", client),
              (kRounds + 1) * model_bytes)
        << client;
    EXPECT_EQ(Sum(text, "xsilo_transport_sent_bytes_total", "peer=\"" + std::to_string(c) + "\""),
              (kRounds + 1) * model_bytes);
  }
  EXPECT_NE(text.find("# TYPE xsilo_fl_state_seconds_total counter\n"), std::string::npos);
  EXPECT_GT(Sum(text, "xsilo_fl_state_seconds_total", server), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace xsilo::metrics
