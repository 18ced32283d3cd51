// The packet forwarder behind netem: one thread, epoll over every site's TUN
// file descriptor, a shaper and a delay line per directed link.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "xsilo/core/status.h"
#include "xsilo/netem/netem.h"

namespace xsilo::netem::internal {

// New link shapes for a running router, and the version they carry.
struct LinkReload {
  uint64_t version = 0;
  std::vector<std::vector<LinkShape>> links;  // sites x sites
};

struct RouterConfig {
  // TUN file descriptor of each site (non-blocking, IFF_TUN | IFF_NO_PI).
  std::vector<int> tun_fds;
  // MTU of the TUN devices: the largest packet read.
  uint32_t mtu = 64000;
  // links[from][to], sites x sites.
  std::vector<std::vector<LinkShape>> links;
  // Counters are written here (atomically, by rename) every second; "" = never.
  std::string stats_path;
  // A signalfd: SIGUSR1 calls `reload` and applies its links; any other
  // signal stops the router.
  int signal_fd = -1;
  // Reads the new links (the router logs a failure and keeps its links).
  std::function<Result<LinkReload>()> reload;
  // Seed of the loss and jitter generator.
  uint64_t seed = 0x9e3779b97f4a7c15ull;
};

// Forwards until signal_fd delivers a stop signal. Returns an error only if epoll fails.
Status RunRouter(const RouterConfig& config);

}  // namespace xsilo::netem::internal
