#include <gtest/gtest.h>

#include "store/connector_conformance.h"

namespace xsilo::testing {
bool RunZmqSetChildIfRequested(int* exit_code);
}

int main(int argc, char** argv) {
  int code = 0;
  if (xsilo::testing::RunConnectorChildIfRequested(&code)) return code;
  if (xsilo::testing::RunZmqSetChildIfRequested(&code)) return code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
