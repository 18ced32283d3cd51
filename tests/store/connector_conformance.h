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

#include "xsilo/store/connector.h"

namespace xsilo::testing {

struct ConnectorParam {
  std::string name;
  // Builds the config of a fresh connector for one test.
  std::function<ConnectorConfig()> config;
  // Keys resolve in another process from config + key.
  bool cross_process = true;
  // False skips the >2 GiB case: for interop configurations (a third-party
  // server) whose large-object path another instantiation covers.
  bool huge_payloads = true;
};

void PrintTo(const ConnectorParam& p, std::ostream* os);

class ConnectorConformance : public ::testing::TestWithParam<ConnectorParam> {
 protected:
  void SetUp() override;
  void TearDown() override;
  std::unique_ptr<Connector> connector_;
};

bool RunConnectorChildIfRequested(int* exit_code);

}  // namespace xsilo::testing

#define XSILO_CONNECTOR_CONFORMANCE(prefix, ...)                              \
  namespace xsilo::testing {                                                  \
  INSTANTIATE_TEST_SUITE_P(prefix, ConnectorConformance,                      \
                           ::testing::Values(ConnectorParam __VA_ARGS__),     \
                           [](const auto& info) { return info.param.name; }); \
  }
