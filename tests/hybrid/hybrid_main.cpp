#include <gtest/gtest.h>

#include "transport/conformance.h"

int main(int argc, char** argv) {
  int code = 0;
  if (xsilo::testing::RunConformanceChildIfRequested(&code)) return code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
