#include <gtest/gtest.h>

#include "store/store_test_util.h"

namespace xsilo::testing {
bool RunExecutorChildIfRequested(int* exit_code);  // executor_test.cpp
}  // namespace xsilo::testing

int main(int argc, char** argv) {
  int code = 0;
  if (xsilo::testing::RunExecutorChildIfRequested(&code)) return code;
  if (xsilo::testing::RunStoreChildIfRequested(&code)) return code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
