// Private: the `faulty` transport decorator (faulty_transport.cpp) and what
// it has injected so far, for tests that must show their faults happened.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "xsilo/transport/transport.h"

namespace xsilo {

struct InjectedTransportFaults {
  uint64_t failures = 0;     // fault.fail: sends refused with Unavailable
  uint64_t drops = 0;        // fault.drop: sends reported OK, never sent
  uint64_t duplicates = 0;   // fault.duplicate: sends that went twice
  uint64_t corruptions = 0;  // fault.corrupt: frames with one bit flipped
  uint64_t truncations = 0;  // fault.truncate: frames cut short
  uint64_t cuts = 0;         // fault.cut_after_bytes: connections cut
  uint64_t delays = 0;       // fault.delay
  uint64_t refused = 0;      // damaged frames this party received and refused
};

// nullopt when `transport` is not a faulty transport.
std::optional<InjectedTransportFaults> InjectedFaultsOf(const Transport& transport);

// MakeFaultyTransport, the decorator's factory: transport/builtin.h.

}  // namespace xsilo
