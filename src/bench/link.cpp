#include "xsilo/bench/link.h"

#include <algorithm>

#include "xsilo/netem/probe.h"

namespace xsilo::bench {

LinkReference LinkOf(const netem::State& state) {
  LinkReference link;
  if (state.sites.size() > 1) link.target = state.sites[1].site.target;
  return link;
}

Result<LinkReference> MeasureLink(const netem::State& state, const LinkMeasureOptions& options) {
  LinkReference link = LinkOf(state);
  netem::CheckOptions co;
  co.seconds = options.seconds;
  co.omit_seconds = options.seconds >= 4 ? 2 : 1;
  co.port = options.port;
  if (state.topology.loopback) co.max_streams = 4;
  XSILO_ASSIGN_OR_RETURN(auto rows, netem::RunCheck(state, co));
  if (rows.empty()) return link;
  const auto& r = rows.front();
  link.measured = true;
  link.rtt_ms = r.rtt_ms;
  link.single_MBps = r.single_MBps;
  link.multi_MBps = r.multi_MBps;
  link.streams = r.streams;
  return link;
}

double FloorMs(const LinkReference& link, uint64_t bytes) {
  // The link's best measured rate: on loopback with 2 cores, one stream can
  // beat several (they share the cores that copy the bytes).
  const double best = std::max(link.single_MBps, link.multi_MBps);
  if (!link.measured || best <= 0) return 0;
  return static_cast<double>(bytes) / (best * 1e6) * 1e3 + link.rtt_ms;
}

}  // namespace xsilo::bench
