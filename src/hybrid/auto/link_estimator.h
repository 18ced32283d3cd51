// Turns observations of a link (echo round trips, completed transfers) into
// the LinkEstimate the `auto` policy decides by, and says when the link must
// be measured again (docs/auto.md, "Estimation"). Pure logic: the caller
// passes the time of each observation, so tests need no clock. Not
// thread-safe: its owner serializes the calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "hybrid/auto/link_estimate.h"

namespace xsilo {

struct LinkEstimatorOptions {
  // Weight of a new round trip in the smoothed RTT. Default 1/8 (TCP's SRTT).
  double rtt_gain = 0.125;
  // Weight of a new throughput sample in the smoothed goodput. Default 1/4.
  double rate_gain = 0.25;
  // A sample at least this factor above or below its figure departs from
  // it; a lone departing sample is an outlier and is not smoothed in.
  // Default 2.
  double change_factor = 2;
  // That many consecutive departing samples, all on the same side, are a
  // change of the link: the figure restarts from their mean and the link is
  // to be measured again. Default 3. A throughput figure from fewer
  // samples than this is young: a sample change_factor or more above it
  // replaces it at once (noise only slows a transfer, so its first
  // measurements were slowed), and departing samples below it replace it
  // as above but count as no change of the link (its first measurement
  // was bad).
  int change_samples = 3;
  // Transfers of fewer bytes tell nothing about throughput. Default 256 KiB.
  uint64_t min_transfer_bytes = 256ull << 10;
  // A transfer shorter than this many round trips is mostly latency: its
  // throughput is not used. Default 2.
  double min_transfer_rtts = 2;
  // Round trips a transfer's duration includes besides its bytes (the send
  // and its delivery confirmation). Default 1.
  double transfer_round_trips = 1;
  // An estimate without a new sample for this long is stale. Default 10 min.
  std::chrono::milliseconds max_age = std::chrono::minutes(10);
  // A change of the round trip that moves it by at least this much is a
  // new path (a route, a link that went from LAN to WAN): the throughput
  // figures measured on the old one no longer hold and are dropped, to be
  // learned again. (Echoes through busy parties move by a few ms with the
  // load: a 1-2 ms link read 5-6 ms while 7 clients trained on 2 cores;
  // that is no new path.) Default 10 ms.
  double path_change_rtt_s = 0.010;
};

// RemeasureReason when only the parallel probe is missing.
extern const char* const kNoParallelProbe;

class LinkEstimator {
 public:
  using Clock = std::chrono::steady_clock;

  explicit LinkEstimator(LinkEstimatorOptions options = {});

  // An echo round trip, seconds, observed at `at`. Ignored unless finite
  // and >= 0.
  void AddRtt(Clock::time_point at, double rtt_s);
  // A completed transfer of `bytes` over `streams` parallel streams that
  // took `seconds` from the send to the peer's confirmation. streams == 1
  // feeds the one-stream goodput, more the aggregate (the parallel probe).
  // False when it told nothing about throughput (too small, too short,
  // malformed).
  bool AddTransfer(Clock::time_point at, uint64_t bytes, double seconds, int streams);

  LinkEstimate estimate() const;

  // Why the link should be measured (again); "" when it need not be: a
  // change not yet acknowledged, no round trip yet, no sample for max_age
  // before `now`, or (kNoParallelProbe) no parallel probe yet, in that
  // order.
  std::string RemeasureReason(Clock::time_point now) const;
  // The caller has started the re-measurement the last change asked for.
  void AcknowledgeChange();
  // Changes detected so far (of any figure).
  int changes() const { return changes_; }
  // Times the throughput figures were dropped for a new path.
  int path_changes() const { return path_changes_; }

 private:
  // One smoothed figure with outlier rejection and change detection.
  struct Figure {
    double value = 0;
    int samples = 0;
    std::vector<double> departing;  // consecutive departing samples
    int departing_side = 0;         // +1 above, -1 below
  };
  // Adds `x` to `f`; true when it completed a change. With young_rules
  // (throughput figures), a figure from fewer than change_samples samples
  // is young: a sample change_factor or more above it replaces it at once,
  // and departing samples that replace it are no change.
  bool Add(Figure* f, double x, double gain, bool young_rules = false);
  void NoteChange(const char* what, double before, double after, const char* unit, double scale);

  LinkEstimatorOptions options_;
  Figure rtt_, one_stream_, aggregate_;
  int aggregate_streams_ = 0;
  bool any_sample_ = false;
  Clock::time_point last_sample_{};
  int changes_ = 0;
  int path_changes_ = 0;
  std::string change_;  // unacknowledged change, "" when none
};

}  // namespace xsilo
