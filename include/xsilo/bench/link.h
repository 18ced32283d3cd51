// The physical reference of an emulated link: its round trip and what TCP
// moves over it with one stream and with the link filled (iperf3), and the
// floor they put under the time of any transfer. Needs only netem, so that
// anything choosing a backend by link (not just the benchmarks) can use it.
#pragma once

#include <cstdint>

#include "xsilo/core/status.h"
#include "xsilo/netem/netem.h"

namespace xsilo::bench {

struct LinkReference {
  // False until the figures below come from a measurement.
  bool measured = false;
  double rtt_ms = 0;       // median echo round trip
  double single_MBps = 0;  // iperf3, one stream, server -> client
  double multi_MBps = 0;   // iperf3, `streams` streams
  int streams = 0;
  // What the link profile asks for (scaled); set even when not measured.
  netem::LinkTarget target;
};

struct LinkMeasureOptions {
  // Seconds of each iperf3 run (one warm-up second is not counted, two from
  // 4 s on). Default 8.
  int seconds = 8;
  // TCP port of the iperf3 server. Default 5201.
  uint16_t port = 5201;
};

// The link from the server site to the first client site of `state`, not
// measured: only its target.
LinkReference LinkOf(const netem::State& state);

// Measures that link with iperf3 (which must be on PATH) and echo round
// trips. On loopback at most 4 parallel streams. `measured` stays false when
// the check returned no row.
Result<LinkReference> MeasureLink(const netem::State& state, const LinkMeasureOptions& options);

// The least time moving `bytes` can take on a measured link: the bytes at
// the link's best measured rate (the faster of one stream and the filled
// link) plus one round trip. 0 when not measured.
double FloorMs(const LinkReference& link, uint64_t bytes);

}  // namespace xsilo::bench
