// Private: what a faulty connector (src/store/faulty/faulty_connector.cpp)
// has injected so far, for tests that must show their faults happened.
#pragma once

#include <cstdint>
#include <optional>

#include "xsilo/store/connector.h"

namespace xsilo {

struct InjectedFaults {
  uint64_t failures = 0;     // fault.fail
  uint64_t drops = 0;        // fault.drop
  uint64_t corruptions = 0;  // fault.corrupt and fault.corrupt_put
  uint64_t truncations = 0;  // fault.truncate
};

// nullopt when `connector` is not a faulty connector.
std::optional<InjectedFaults> InjectedFaultsOf(const Connector& connector);

}  // namespace xsilo
