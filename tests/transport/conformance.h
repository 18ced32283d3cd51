// The transport conformance suite. A backend joins it with one line:
//
//   XSILO_TRANSPORT_CONFORMANCE(Grpc, {.backend = "grpc", .network = true});
//
// Test binaries that instantiate it link conformance_main.cpp (not
// gtest_main): for network backends some tests re-run the binary as child
// processes that play receiver ranks, so the sender's memory is measured
// without the receivers' copies in the same process.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "xsilo/transport/registry.h"

namespace xsilo::testing {

struct ConformanceParam {
  std::string backend;
  std::map<std::string, std::string> backend_options;
  // The backend talks over TCP: each world gets "127.0.0.1:<free port>" and
  // the broadcast-memory test runs receivers in child processes.
  bool network = false;
  // Gtest name suffix; defaults to the backend name with '-' and '+' removed.
  std::string label;
  // False for in-process configurations whose receivers keep private copies
  // in the sender's own process (inproc serialize=1): the sender's memory
  // cannot be told apart there, and the broadcast-memory case is not
  // instantiated.
  bool measure_broadcast_memory = true;
  // False leaves out the >2 GiB case: for interop configurations (a
  // third-party object server) whose large-payload path another
  // instantiation covers. A case left out is not instantiated, never skipped.
  bool huge_payloads = true;
};

void PrintTo(const ConformanceParam& p, std::ostream* os);

class TransportConformance : public ::testing::TestWithParam<ConformanceParam> {
 protected:
  void TearDown() override;

  // Creates and starts ranks 0..n-1 (started concurrently; Start may block
  // until peers connect). `base` supplies options other than rank/world/address.
  std::vector<std::unique_ptr<Transport>> MakeWorld(int n, TransportOptions base = {});
  TransportOptions OptionsFor(int32_t rank, int32_t world, const TransportOptions& base) const;

  std::string address_;
};

std::string ConformanceName(const ::testing::TestParamInfo<ConformanceParam>& info);

// The cases only some configurations run, as suites of their own, so that
// a configuration without the property has no such test (not a skipped one).
class TransportHugeConformance : public TransportConformance {};
class TransportBroadcastMemoryConformance : public TransportConformance {};

// {p} when p has the property, else none.
inline std::vector<ConformanceParam> OnlyIf(const ConformanceParam& p,
                                            bool ConformanceParam::*flag) {
  if (p.*flag) return {p};
  return {};
}

// Starts this test binary again (its main must call
// RunConformanceChildIfRequested) as receiver `rank` of `world` at
// `address`: it starts p.backend, receives one message, exits 0 if it is
// PatternIntact (else 2: no start, 3: damaged, 4: none), after acking it
// to rank 0. Returns the child's pid.
pid_t SpawnReceiver(const ConformanceParam& p, int rank, int world, const std::string& address);

// Runs the child-process role if this process was spawned as one; returns
// true if it did (the caller then exits with *exit_code).
bool RunConformanceChildIfRequested(int* exit_code);

}  // namespace xsilo::testing

#define XSILO_TRANSPORT_CONFORMANCE(prefix, ...)                                              \
  namespace xsilo::testing {                                                                  \
  INSTANTIATE_TEST_SUITE_P(prefix, TransportConformance,                                      \
                           ::testing::Values(ConformanceParam __VA_ARGS__), ConformanceName); \
  INSTANTIATE_TEST_SUITE_P(prefix, TransportHugeConformance,                                  \
                           ::testing::ValuesIn(OnlyIf(ConformanceParam __VA_ARGS__,           \
                                                      &ConformanceParam::huge_payloads)),     \
                           ConformanceName);                                                  \
  INSTANTIATE_TEST_SUITE_P(                                                                   \
      prefix, TransportBroadcastMemoryConformance,                                            \
      ::testing::ValuesIn(OnlyIf(ConformanceParam __VA_ARGS__,                                \
                                 &ConformanceParam::measure_broadcast_memory)),               \
      ConformanceName);                                                                       \
  }
