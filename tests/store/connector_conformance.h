// The connector conformance suite. A connector joins it with one line:
//
//   XSILO_CONNECTOR_CONFORMANCE(File, {.name = "file", .config = [] { ... }});
//
// Its binary links connector_main.cpp: the cross-process test re-runs the
// binary as a child that rebuilds the connector from config() and fetches a key.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "store/child_env.h"
#include "xsilo/store/connector.h"

namespace xsilo::testing {

struct ConnectorParam {
  std::string name;
  // Builds the config of a fresh connector for one test.
  std::function<ConnectorConfig()> config;
  // Keys resolve in another process from config + key (false: the
  // cross-process case is not instantiated for this connector).
  bool cross_process = true;
  // False leaves out the >2 GiB case: for interop configurations (a
  // third-party server) whose large-object path another instantiation
  // covers. A case left out is not instantiated, never skipped.
  bool huge_payloads = true;
};

void PrintTo(const ConnectorParam& p, std::ostream* os);

class ConnectorConformance : public ::testing::TestWithParam<ConnectorParam> {
 protected:
  void SetUp() override;
  void TearDown() override;
  std::unique_ptr<Connector> connector_;
  ConnectorConfig made_from_;  // the config connector_ was made from (with its secrets)
};

// The cases only some configurations run, as suites of their own, so that
// a configuration without the property has no such test (not a skipped one).
class ConnectorHugeConformance : public ConnectorConformance {};
class ConnectorCrossProcessConformance : public ConnectorConformance {};

// {p} when p has the property, else none.
inline std::vector<ConnectorParam> OnlyIf(const ConnectorParam& p, bool ConnectorParam::*flag) {
  if (p.*flag) return {p};
  return {};
}

bool RunConnectorChildIfRequested(int* exit_code);

// Stops a server shared by a test process when the tests end, inside
// RUN_ALL_TESTS. Stopped by a static destructor at exit instead, its workers
// are joined after OpenSSL's exit handler has freed its tables and each
// worker's error state: LeakSanitizer reports the lost state (904 bytes per
// worker) and ThreadSanitizer a worker signing while OpenSSL frees.
template <typename Server>
class StopAtEnd : public ::testing::Environment {
 public:
  explicit StopAtEnd(Server* server) : server_(server) {}
  void TearDown() override { server_->Stop(); }

 private:
  Server* server_;
};

}  // namespace xsilo::testing

#define XSILO_CONNECTOR_CONFORMANCE(prefix, ...)                                        \
  namespace xsilo::testing {                                                            \
  INSTANTIATE_TEST_SUITE_P(prefix, ConnectorConformance,                                \
                           ::testing::Values(ConnectorParam __VA_ARGS__),               \
                           [](const auto& info) { return info.param.name; });           \
  INSTANTIATE_TEST_SUITE_P(prefix, ConnectorHugeConformance,                            \
                           ::testing::ValuesIn(OnlyIf(ConnectorParam __VA_ARGS__,       \
                                                      &ConnectorParam::huge_payloads)), \
                           [](const auto& info) { return info.param.name; });           \
  INSTANTIATE_TEST_SUITE_P(prefix, ConnectorCrossProcessConformance,                    \
                           ::testing::ValuesIn(OnlyIf(ConnectorParam __VA_ARGS__,       \
                                                      &ConnectorParam::cross_process)), \
                           [](const auto& info) { return info.param.name; });           \
  }
