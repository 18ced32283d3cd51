#include <gtest/gtest.h>

#include "store/connector_conformance.h"

namespace xsilo {
int RunRgwPartyIfRequested();
}

int main(int argc, char** argv) {
  int code = 0;
  if (xsilo::testing::RunConnectorChildIfRequested(&code)) return code;
  if ((code = xsilo::RunRgwPartyIfRequested()) >= 0) return code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
