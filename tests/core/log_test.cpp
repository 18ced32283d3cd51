#include "xsilo/core/log.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "log_capture.h"

namespace xsilo {
namespace {

constinit LogComponent kHybrid("hybrid");
constinit LogComponent kGrpc("grpc");

TEST(Log, ALevelAppliesToItsComponentAndABareLevelToTheRest) {
  LogCapture log("hybrid=debug,warn");
  EXPECT_TRUE(kHybrid.enabled(LogLevel::kDebug));
  EXPECT_FALSE(kHybrid.enabled(LogLevel::kTrace));
  EXPECT_FALSE(kGrpc.enabled(LogLevel::kInfo));
  EXPECT_TRUE(kGrpc.enabled(LogLevel::kWarn));
  XSILO_LOG(kHybrid, kDebug, "stored " << 42 << " bytes");
  XSILO_LOG(kGrpc, kInfo, "not written");
  XSILO_LOG(kGrpc, kError, "lost");
  const std::vector<std::string> lines = log.lines();
  ASSERT_EQ(lines.size(), 2u) << log.text();
  // Text: UTC time, "xsilo", the component, the level, the message.
  const std::regex line(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z xsilo (\w+) (\w+): (.*))");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(lines[0], m, line)) << lines[0];
  EXPECT_EQ(m[1], "hybrid");
  EXPECT_EQ(m[2], "debug");
  EXPECT_EQ(m[3], "stored 42 bytes");
  ASSERT_TRUE(std::regex_match(lines[1], m, line)) << lines[1];
  EXPECT_EQ(m[1], "grpc");
  EXPECT_EQ(m[2], "error");
}

TEST(Log, TheDefaultIsInfoAndOffSilencesAComponent) {
  {
    LogCapture log;
    EXPECT_FALSE(kHybrid.enabled(LogLevel::kDebug));
    EXPECT_TRUE(kHybrid.enabled(LogLevel::kInfo));
  }
  LogCapture log("grpc=off");
  XSILO_LOG(kGrpc, kError, "silenced");
  XSILO_LOG(kHybrid, kInfo, "kept");
  ASSERT_EQ(log.lines().size(), 1u) << log.text();
  EXPECT_NE(log.lines()[0].find("kept"), std::string::npos);
}

// The message is not built when the level is off: its operands are not
// evaluated.
TEST(Log, AMessageBelowTheLevelIsNotBuilt) {
  LogCapture log("info");
  int evaluated = 0;
  auto cost = [&] { return ++evaluated; };
  XSILO_LOG(kHybrid, kDebug, "n=" << cost());
  EXPECT_EQ(evaluated, 0);
  XSILO_LOG(kHybrid, kInfo, "n=" << cost());
  EXPECT_EQ(evaluated, 1);
}

TEST(Log, ABadSpecIsRefusedAndChangesNothing) {
  LogCapture log("hybrid=debug");
  for (const char* bad : {"verbose", "hybrid=loud", "info,grpc=", "hybrid=debug,x"}) {
    SCOPED_TRACE(bad);
    const Status s = SetLogSpec(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("trace, debug, info, warn, error, off"), std::string::npos)
        << s.message();
  }
  const Status s = SetLogSpec("=debug");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no component name"), std::string::npos) << s.message();
  EXPECT_TRUE(kHybrid.enabled(LogLevel::kDebug));
  EXPECT_FALSE(kGrpc.enabled(LogLevel::kDebug));
}

TEST(Log, JsonLinesCarryTheMessageEscaped) {
  LogCapture log("debug");
  SetLogFormat(LogFormat::kJson);
  XSILO_LOG(kHybrid, kWarn, "a \"quoted\" path\\x\nsecond line\t\x01");
  ASSERT_EQ(log.lines().size(), 1u);
  const auto j = nlohmann::json::parse(log.lines()[0]);
  EXPECT_EQ(j.at("component"), "hybrid");
  EXPECT_EQ(j.at("level"), "warning");
  EXPECT_EQ(j.at("msg"), "a \"quoted\" path\\x\nsecond line\t\x01");
  EXPECT_EQ(j.at("pid"), ::getpid());
  EXPECT_TRUE(std::regex_match(j.at("ts").get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")));
}

// The environment is read at the first log call of a process: this binary
// runs itself with XSILO_LOG, XSILO_DEBUG and XSILO_LOG_FORMAT set and reads
// what the child wrote on its stderr. As the child (XSILO_LOG_TEST_CHILD
// set) it writes one line at each level before main and exits.
const bool kChild = [] {
  if (std::getenv("XSILO_LOG_TEST_CHILD") == nullptr) return false;
  XSILO_LOG(kHybrid, kTrace, "child-trace");
  XSILO_LOG(kHybrid, kDebug, "child-debug");
  XSILO_LOG(kGrpc, kInfo, "child-info");
  XSILO_LOG(kGrpc, kWarn, "child-warn");
  ::_exit(0);
}();

std::string RunChild(const std::vector<std::string>& env) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> envp;
    std::vector<std::string> storage = env;
    for (auto& e : storage) envp.push_back(e.data());
    envp.push_back(nullptr);
    char self[] = "/proc/self/exe";
    char* argv[] = {self, nullptr};
    ::execve(self, argv, envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return out;
}

TEST(Log, TheEnvironmentConfiguresAProcessAtItsFirstLine) {
  const std::string child = "XSILO_LOG_TEST_CHILD=1";
  std::string out = RunChild({child});
  EXPECT_EQ(out.find("child-debug"), std::string::npos) << out;
  EXPECT_NE(out.find("xsilo grpc info: child-info"), std::string::npos) << out;

  out = RunChild({child, "XSILO_DEBUG=1"});
  EXPECT_NE(out.find("xsilo hybrid debug: child-debug"), std::string::npos) << out;
  EXPECT_EQ(out.find("child-trace"), std::string::npos) << out;

  out = RunChild({child, "XSILO_LOG=grpc=warn,trace"});
  EXPECT_NE(out.find("child-trace"), std::string::npos) << out;
  EXPECT_EQ(out.find("child-info"), std::string::npos) << out;
  EXPECT_NE(out.find("child-warn"), std::string::npos) << out;

  out = RunChild({child, "XSILO_LOG=loud"});
  EXPECT_NE(out.find("XSILO_LOG='loud' ignored"), std::string::npos) << out;
  EXPECT_NE(out.find("child-info"), std::string::npos) << out;

  out = RunChild({child, "XSILO_LOG_FORMAT=json"});
  bool parsed = false;
  for (size_t at = 0, nl; (nl = out.find('\n', at)) != std::string::npos; at = nl + 1) {
    const std::string line = out.substr(at, nl - at);
    if (line.find("child-warn") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("msg"), "child-warn");
    parsed = true;
  }
  EXPECT_TRUE(parsed) << out;
}

}  // namespace
}  // namespace xsilo
