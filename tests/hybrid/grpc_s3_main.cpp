#include <gtest/gtest.h>

#include "transport/conformance.h"

namespace xsilo {
int RunGrpcS3PartyIfRequested();
}

int main(int argc, char** argv) {
  int code = 0;
  if (xsilo::testing::RunConformanceChildIfRequested(&code)) return code;
  if ((code = xsilo::RunGrpcS3PartyIfRequested()) >= 0) return code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
