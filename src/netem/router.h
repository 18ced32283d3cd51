// The packet forwarder behind netem: one thread, epoll over every site's TUN
// file descriptor, a shaper and a delay line per directed link.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xsilo/core/status.h"
#include "xsilo/netem/netem.h"

namespace xsilo::netem::internal {

struct RouterConfig {
  // TUN file descriptor of each site (non-blocking, IFF_TUN | IFF_NO_PI).
  std::vector<int> tun_fds;
  // MTU of the TUN devices: the largest packet read.
  uint32_t mtu = 64000;
  // links[from][to], sites x sites.
  std::vector<std::vector<LinkShape>> links;
  // Counters are written here (atomically, by rename) every second; "" = never.
  std::string stats_path;
  // The router returns when this descriptor becomes readable (a signalfd).
  int stop_fd = -1;
  // Seed of the loss and jitter generator.
  uint64_t seed = 0x9e3779b97f4a7c15ull;
};

// Forwards until stop_fd is readable. Returns an error only if epoll fails.
Status RunRouter(const RouterConfig& config);

}  // namespace xsilo::netem::internal
