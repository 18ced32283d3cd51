#include <gtest/gtest.h>

#include "store/store_test_util.h"

int main(int argc, char** argv) {
  int code = 0;
  if (xsilo::testing::RunStoreChildIfRequested(&code)) return code;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
