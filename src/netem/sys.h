// Small Linux helpers for netem: running commands, finding and stopping
// processes, namespaces.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "xsilo/core/status.h"

namespace xsilo::netem::internal {

constexpr const char* kNetnsDir = "/run/netns";

// Runs argv (looked up in PATH), waits at most `timeout`, returns its stdout
// and stderr together. A non-zero exit is an error carrying that output.
Result<std::string> RunCommand(const std::vector<std::string>& argv,
                               std::chrono::milliseconds timeout);

// True while `pid` exists and is not a zombie.
bool ProcessAlive(pid_t pid);
// The process's name (/proc/PID/comm without the newline), "" if gone.
std::string ProcessName(pid_t pid);
// SIGTERM, wait up to `grace`, then SIGKILL and wait up to 2 s more. Reaps
// the process if it is a child of the caller. OK once it is gone.
Status StopProcess(pid_t pid, std::chrono::milliseconds grace);

// Every process (except the caller) whose network namespace is the one
// bound at /run/netns/<name>.
std::vector<pid_t> ProcessesInNetns(const std::string& name);

// Moves the calling thread into /run/netns/<name>.
Status EnterNetns(const std::string& name);

// Writes `value` to a /proc/sys file (in the caller's namespaces).
Status WriteSysctl(const std::string& path, const std::string& value);

}  // namespace xsilo::netem::internal
