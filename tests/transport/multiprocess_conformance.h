// The transport conformance checks for backends whose ranks are separate
// processes started by a launcher (mpirun): every process runs the same
// test binary, owns exactly one rank, and each test body branches on it.
// It mirrors tests/transport/conformance.cpp (ordering per peer, payload
// sizes from 0 B to 300 MB, a tensor over 2 GiB, concurrent sends, broadcast
// memory, receive timeout, stop with sends in flight, ...) for a world of at
// least 3 ranks. A backend joins with one line:
//
//   XSILO_MULTIPROCESS_CONFORMANCE(MpiBuffer, {.backend = "mpi-buffer"});
//
// and a main() that calls SetMultiprocessWorld(rank, size) before
// RUN_ALL_TESTS. Every process must run the same tests in the same order
// (no --gtest_filter on one rank only).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "xsilo/transport/registry.h"

namespace xsilo::testing {

struct MultiprocessParam {
  std::string backend;
  std::map<std::string, std::string> backend_options;
  // Gtest name suffix; defaults to the backend name without '-' and '+'.
  std::string label;
  // Upper bound of the sender's peak RSS growth over the payload size when
  // it broadcasts to every other rank: 1.2 for a backend that sends from the
  // tensors' own Buffers; a backend that serializes once per broadcast
  // (not once per receiver) stays below 2.2.
  double broadcast_peak_limit = 1.2;
};

void PrintTo(const MultiprocessParam& p, std::ostream* os);
std::string MultiprocessName(const ::testing::TestParamInfo<MultiprocessParam>& info);

// This process's rank and the world size, from the launcher.
void SetMultiprocessWorld(int32_t rank, int32_t world_size);

class MultiprocessConformance : public ::testing::TestWithParam<MultiprocessParam> {
 protected:
  void SetUp() override;

  // Creates and starts this process's rank. `base` supplies the options
  // other than rank / world size / backend options.
  std::unique_ptr<Transport> Join(TransportOptions base = {});
  // Every rank waits here until all ranks arrived (over a fresh transport
  // of the backend under test).
  void SyncPoint();

  int32_t rank_ = 0;
  int32_t world_ = 1;
};

}  // namespace xsilo::testing

#define XSILO_MULTIPROCESS_CONFORMANCE(prefix, ...)                                             \
  namespace xsilo::testing {                                                                    \
  INSTANTIATE_TEST_SUITE_P(prefix, MultiprocessConformance,                                     \
                           ::testing::Values(MultiprocessParam __VA_ARGS__), MultiprocessName); \
  }
