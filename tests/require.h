// A test's prerequisite of the machine (root, /dev/net/tun, a kernel
// feature, a launcher's rank count). Without it the test is skipped on a
// developer's machine, but fails, naming the prerequisite, when
// XSILO_REQUIRE_ALL=1 or CI=true: `make test` sets XSILO_REQUIRE_ALL=1, so a
// test that cannot run there is a failure, never a silent pass.
//
// Not for a case that does not apply to a configuration: such a case is
// not instantiated at all (tests/transport/conformance.h, OnlyIf).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

namespace xsilo::testing {

inline bool RequireAll() {
  const char* all = std::getenv("XSILO_REQUIRE_ALL");
  const char* ci = std::getenv("CI");
  return (all != nullptr && std::strcmp(all, "1") == 0) ||
         (ci != nullptr && std::strcmp(ci, "true") == 0);
}

}  // namespace xsilo::testing

// Use in a test body or SetUp: returns from it when `cond` is false.
#define XSILO_REQUIRE(cond, what)                                             \
  do {                                                                        \
    if (!(cond)) {                                                            \
      if (::xsilo::testing::RequireAll()) {                                   \
        GTEST_FAIL() << "prerequisite missing (XSILO_REQUIRE_ALL): " << what; \
      } else {                                                                \
        GTEST_SKIP() << "prerequisite missing: " << what;                     \
      }                                                                       \
    }                                                                         \
  } while (0)
