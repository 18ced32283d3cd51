// The `auto` backend's choice of path per message (docs/auto.md): inline on
// the control stream, striped over K parallel streams, or through the object
// store, from the link figures and the message size. Pure: no I/O, no clock,
// so that it is tested with made-up links and sizes.
//
// Each path's time is predicted as a few round trips plus the bytes at the
// path's rate:
//   inline   inline_round_trips * RTT + bytes / one stream
//   striped  inline_round_trips * RTT + bytes / min(K * one stream, aggregate,
//                                                  window_bytes / RTT)
//   store    store_round_trips * RTT + bytes / store_local_Bps
//                                    + bytes / min(aggregate, connections * one stream)
// and the simplest path wins unless a more complex one is predicted to be at
// least `switch_margin` times faster.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "hybrid/auto/link_estimate.h"

namespace xsilo {

enum class AutoPath { kInline, kStriped, kStore };

// "inline", "striped", "store".
std::string_view AutoPathName(AutoPath path);

struct AutoPolicyOptions {
  // Most parallel streams a striped send uses (the grpc transport allows 64).
  // Default 16: the server keeps K connections per client, and the committed
  // results show no gain a wider stripe would add over the store path.
  int max_streams = 16;
  // The transport's per-peer flow-control window (grpc `window_bytes`): an
  // inline or striped send moves at most this much per round trip. Default
  // 32 MiB, the grpc default; 0 = no such cap.
  uint64_t window_bytes = 32ull << 20;
  // Round trips of an inline or striped send besides its bytes: the message
  // out and its delivery confirmation back. Default 1.
  double inline_round_trips = 1;
  // Round trips of the store path besides its bytes: the stub out and the
  // confirmation back (1), the ranged GET's request (1), and the upload's or
  // presign's request (1). Default 3.
  double store_round_trips = 3;
  // Rate at which the store path handles the bytes where they are stored
  // (writing the object, serving it), paid on top of the link. Default
  // 600 MB/s, fitted to results/p2p-lan-big (docs/auto.md).
  double store_local_Bps = 600e6;
  // Parallel connections of the store path's transfers (hybrid
  // `connections`). Default 32.
  int store_connections = 32;
  // A more complex path (striped over inline, store over either) is taken
  // only when predicted at least this many times faster. Default 1.1.
  double switch_margin = 1.1;
  // Below this parallel gain (aggregate / one stream) one stream fills the
  // link and nothing is striped. Default 1.5.
  double min_parallel_gain = 1.5;
  // Broadcast: the sender's egress shared by the copies an inline or striped
  // broadcast sends (one per receiver); the store path uploads once. 0 = not
  // limiting (each receiver's link is the bottleneck). Default 0.
  double sender_egress_Bps = 0;
  // Without throughput figures: payloads of at least this many bytes take
  // the store path, the paper's guideline and the hybrid default threshold.
  // Default 10 MiB.
  uint64_t default_store_bytes = 10ull << 20;
  // With a round trip but no throughput yet, a link under this RTT is a LAN
  // and everything goes inline. Default 2 ms.
  double lan_rtt_s = 0.002;
  // Exploration (ExploreAutoPath): a path whose rate figure comes from
  // fewer than `trusted_samples` transfers is tried in place of the chosen
  // one when predicted within `explore_factor` of it. Defaults 1.5 and 3
  // (LinkEstimatorOptions::change_samples: from then on a figure that is
  // wrong is corrected by the estimator's change detection). An
  // explore_factor below 1 (or not finite) never explores.
  double explore_factor = 1.5;
  int trusted_samples = 3;
};

struct AutoRequest {
  // Payload bytes of the message (64-bit: one tensor may exceed 2 GiB).
  uint64_t bytes = 0;
  // Receivers of one broadcast (1 for a send). Values below 1 count as 1.
  int receivers = 1;
  // False when this party has no object store path (plain `auto`).
  bool store_available = false;
};

struct AutoChoice {
  AutoPath path = AutoPath::kInline;
  // Streams of a striped send; 1 for the other paths.
  int streams = 1;
  // Predicted seconds of each path, as compared; negative when the path was
  // not predicted (no link figures, or not available).
  double inline_s = -1, striped_s = -1, store_s = -1;
  // One line for a debug log and the bench JSON: the path and why.
  std::string reason;
};

// The path for one message over `link`.
AutoChoice ChooseAutoPath(const LinkEstimate& link, const AutoRequest& request,
                          const AutoPolicyOptions& options = {});

// The path to take in place of `chosen` (ChooseAutoPath's choice for the
// same link and request) to learn its rate, if any. A path's rate is
// learned only from transfers over it, so one bad measurement of the path
// not chosen (a slow probe) would otherwise stand for good. Explored: the
// store when inline or striped was chosen and the aggregate figure is from
// fewer than trusted_samples transfers; inline when the store was chosen
// and the one-stream figure is; in both cases only when the explored path
// is predicted at most explore_factor times slower than the chosen one,
// which bounds what a right prediction costs. The caller decides how
// often (AutoRouter: every other message, a few times per link).
std::optional<AutoChoice> ExploreAutoPath(const LinkEstimate& link, const AutoRequest& request,
                                          const AutoChoice& chosen,
                                          const AutoPolicyOptions& options = {});

// K of a striped send: ceil(aggregate / one stream), within [1, max_streams];
// 1 when the parallel gain is below min_parallel_gain or unknown.
int StripeStreams(const LinkEstimate& link, const AutoPolicyOptions& options = {});

// For a backend that offloads per tensor by a size threshold (the hybrid
// layer): the least payload size from which ChooseAutoPath picks the store
// path for one receiver; UINT64_MAX when it never does.
uint64_t StoreThresholdBytes(const LinkEstimate& link, const AutoPolicyOptions& options = {});

}  // namespace xsilo
