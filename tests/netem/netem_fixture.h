// What the emulator tests share: an instance per test with its own prefix
// and state directory, brought down (and checked gone) after the test.
// Needs root and /dev/net/tun; the tests skip with a message otherwise.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "require.h"
#include "xsilo/netem/netem.h"

namespace xsilo::netem::testing {

// The namespaces (/run/netns) whose names start with "<prefix>.".
inline std::vector<std::string> NamespacesWithPrefix(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* d = opendir("/run/netns");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.rfind(prefix + ".", 0) == 0) out.push_back(n);
  }
  closedir(d);
  return out;
}

// A TCP socket of the calling thread's namespace connected to address:port
// (10 s send/receive timeouts), or -1.
inline int Connect(const std::string& address, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

class NetemFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    Status s = CheckPrerequisites();
    XSILO_REQUIRE(s.ok(), "the netem emulator: " << s.message());
    static int counter = 0;
    options_.prefix = "xt" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    dir_ = std::filesystem::temp_directory_path() / ("xsilo-netem-" + options_.prefix);
    options_.state_dir = dir_.string();
  }
  void TearDown() override {
    if (options_.state_dir.empty()) return;  // skipped
    EXPECT_TRUE(Down(options_).ok());
    EXPECT_TRUE(NamespacesWithPrefix(options_.prefix).empty());
    std::filesystem::remove_all(dir_);
  }

  State UpOrDie(const Topology& t) {
    Status s = Up(t, options_);
    EXPECT_TRUE(s.ok()) << s.ToString();
    auto state = LoadState(options_);
    EXPECT_TRUE(state.ok()) << state.status().ToString();
    return state.ok() ? *state : State{};
  }

  Options options_;
  std::filesystem::path dir_;
};

}  // namespace xsilo::netem::testing
