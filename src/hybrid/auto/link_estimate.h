// What a party knows about its link to one peer: the figures the `auto`
// backend chooses a path by (docs/auto.md). Plain data with no dependency,
// so that transports, the hybrid layer and the benchmarks can share it.
#pragma once

#include <cstdint>

namespace xsilo {

struct LinkEstimate {
  // Measurements behind the figures (RTT pings and transfers). 0 = nothing
  // measured yet: every other field is meaningless.
  int samples = 0;
  // Round trip, seconds (0 on loopback is a figure). Negative or not
  // finite = unknown.
  double rtt_s = 0;
  // Goodput of one stream (one TCP connection) to the peer, bytes/s, as the
  // transport achieves it. <= 0 or not finite = unknown.
  double one_stream_Bps = 0;
  // Goodput with `aggregate_streams` parallel streams (the parallel probe),
  // bytes/s: what the link gives when it is filled. <= 0 = unknown.
  double aggregate_Bps = 0;
  int aggregate_streams = 0;
  // Transfers behind each throughput figure (its samples since it was last
  // set afresh): a figure from few transfers may be a bad one, and the
  // policy explores the path it belongs to (ExploreAutoPath).
  int one_stream_samples = 0;
  int aggregate_samples = 0;

  // Bytes one stream keeps in flight: the one-stream bandwidth-delay
  // product. On a long fat link this is the TCP window that caps the stream.
  double OneStreamBdpBytes() const { return one_stream_Bps * rtt_s; }
};

}  // namespace xsilo
