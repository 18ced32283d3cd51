// The "multi" connector: several connectors behind one, each with a policy,
// after ProxyStore's MultiConnector.
//
// Put goes to the highest-priority active member whose policy accepts the
// object (size range, tags); ties go to the earlier member. Keys remember
// their member (attrs "multi.route" and "multi.type"), so get / exists /
// evict / set route by the key alone. A member whose host pattern does not
// match this host (or whose connector cannot be built here) stays dormant:
// it is never chosen for a put, and a key that names it fails with
// FailedPrecondition saying why.
//
// Config options: "connectors", a JSON array built by MultiConnectorConfig
// (format in docs/store.md). The host is gethostname() unless the
// XSILO_HOSTNAME environment variable is set.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "xsilo/store/connector.h"
#include "xsilo/store/store.h"

namespace xsilo {

struct MultiPolicy {
  // Accepted object sizes in bytes, inclusive. Default: any size.
  uint64_t min_size = 0;
  uint64_t max_size = std::numeric_limits<uint64_t>::max();
  // A put's subset_tags must all be in here. Default: none (so a put that
  // names subset tags never lands here).
  std::set<std::string> subset_tags;
  // A put's superset_tags must include all of these. Default: none.
  std::set<std::string> superset_tags;
  // ECMAScript regex that must match the whole host name for the member to
  // be active. Default "": every host.
  std::string host_pattern;
  // Higher wins. Default 0.
  int64_t priority = 0;

  // The size check is skipped when `size` is nullopt (deferred keys); tag
  // checks are skipped for empty hint sets.
  bool Accepts(std::optional<uint64_t> size, const PlacementHints& hints) const;
};

struct MultiMember {
  std::string name;  // unique in the connector, [A-Za-z0-9_-]{1,64}
  ConnectorConfig connector;
  MultiPolicy policy;
};

// The ConnectorConfig of a multi connector over `members`.
ConnectorConfig MultiConnectorConfig(const std::vector<MultiMember>& members);
// The members of a multi config (InvalidArgument when malformed).
Result<std::vector<MultiMember>> ParseMultiMembers(
    const std::map<std::string, std::string>& options);
// The member a multi key routes to, and the member's own key.
Result<std::pair<std::string, Key>> InnerKeyOf(const Key& multi_key);
// This host's name as host patterns see it.
std::string MultiHostName();

}  // namespace xsilo
