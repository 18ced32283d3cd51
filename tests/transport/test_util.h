// Helpers shared by transport and connector tests.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "xsilo/core/message.h"

namespace xsilo::testing {

// Resident-set figures from /proc/self/status, in bytes.
uint64_t CurrentRss();
uint64_t PeakRss();  // VmHWM
// Resets VmHWM to the current RSS (writes 5 to /proc/self/clear_refs).
// Returns false where the kernel does not allow it.
bool ResetPeakRss();

// A TCP port on 127.0.0.1 that was free a moment ago, with the `count` - 1
// ports after it, chosen below the kernel's ephemeral range (0 if none).
int FreeTcpPort(int count = 1);

// Starts this binary again (/proc/self/exe, no arguments) with this
// process's environment plus `assignment` ("NAME=value"), which tells the
// child which role to play. Returns its pid, or -1.
pid_t SpawnSelfWithEnv(const std::string& assignment);

// A U8 tensor of `bytes` bytes filled with a cheap pattern derived from `seed`
// (every page touched).
Tensor PatternTensor(uint64_t bytes, uint64_t seed);
// A message with one tensor "w" of `bytes` bytes, and its payload checksum
// in param "xxh3".
Message PatternMessage(uint64_t bytes, uint64_t seed, int64_t round = 0);
// Recomputes the checksum of tensor "w" and compares it with param "xxh3".
bool PatternIntact(const Message& m);

}  // namespace xsilo::testing
