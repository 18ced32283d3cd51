// Private: the per-peer link knowledge of a hybrid transport opened as
// "auto+<connector>" (docs/auto.md): what it has measured of each peer's
// link (echo round trips, completed inline sends, store transfers reported
// back) and the path ChooseAutoPath picks for a message from it.
// Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "hybrid/auto/auto_policy.h"
#include "hybrid/auto/link_estimator.h"

namespace xsilo {

class AutoRouter {
 public:
  using Clock = LinkEstimator::Clock;

  // The default policy stripes nothing (max_streams 1): it chooses between
  // inline and the store. The hybrid backend passes its grpc `streams` as
  // max_streams, and a striped choice goes over that many streams at most.
  AutoRouter() : AutoRouter(OneStream()) {}
  explicit AutoRouter(AutoPolicyOptions policy) : policy_(policy) {}

  // An echo's round trip. The estimator is fed the least of the last
  // kRttWindow echoes: an echo through both parties' transport threads (and
  // behind a message on the same stream) carries their delays, the least
  // one is the link. The last of the kStartEchoes start echoes, before any
  // transfer was measured, restarts the estimate from the least of them.
  void OnRtt(int32_t peer, double seconds, Clock::time_point at = Clock::now());
  void OnTransfer(int32_t peer, uint64_t bytes, double seconds, int streams,
                  Clock::time_point at = Clock::now());
  // One of this party's own writes to the store (the upload of an object
  // and its presign, before its stub goes out): the store path's write leg,
  // the same for every peer. Once one of kStoreWriteMinBytes or more is
  // measured, their smoothed rate replaces the policy's fitted
  // store_local_Bps (600 MB/s, which made the store path look 2-3x slower
  // than it was on geo-proximal and loopback, where rank 0 writes to its
  // own embedded server's directory at several GB/s: docs/auto.md).
  void OnStoreWrite(uint64_t bytes, double seconds);
  // The smoothed write rate, bytes/s; 0 before the first such write.
  double store_write_Bps();
  // A broadcast of `bytes` to `receivers` peers sent inline (or striped),
  // done after `seconds`: its copies left through this party's egress,
  // receivers * bytes / seconds together. Smoothed like the store writes,
  // that figure becomes the policy's sender_egress_Bps for the broadcasts
  // after it (never for a send to one peer), so that a broadcast which was
  // slow inline is predicted as slow as it was. Without it the inline
  // prediction of a broadcast charged each copy the one-stream rate as if
  // it had the link alone: on a loaded LAN host, seven copies of the Big
  // model predicted at 1.25 s took 3.62 s (docs/auto.md).
  // Broadcasts under kProbeMinBytes, or to one peer, are not counted.
  void OnInlineBroadcast(int receivers, uint64_t bytes, double seconds);
  // The smoothed figure, bytes/s; 0 before the first such broadcast.
  double sender_egress_Bps();

  // The path for `bytes` to `peers`: a broadcast goes by its slowest known
  // link (the largest round trip). While the store rate is unknown, a
  // message of kProbeMinBytes or more goes to the store to measure it (a
  // store transfer is the only source of that figure); then one goes inline
  // until the one-stream rate is known (on a link that is not LAN-like, only
  // up to kInlineProbeMaxBytes: a slow stream is not risked for it, and only
  // a send to one peer: an inline broadcast there measures only the
  // sender's egress, so a broadcast goes to the store, whose rate is
  // known; a party that only broadcasts keeps doing so).
  //
  // At most kMaxRateProbes messages per link (and path: a new one starts
  // again) probe the store so: on a link where each one is too short to
  // measure (LinkEstimator refuses a transfer under two round trips),
  // more would only send them all the slow way.
  //
  // A send to one peer of kProbeMinBytes or more also explores
  // (ExploreAutoPath): every other such message, while the path not chosen
  // has a rate from few transfers and is predicted close to the chosen
  // one, goes over it instead, at most kMaxExplorations times per peer and
  // path (a new path, LinkEstimator::path_changes, starts again).
  // One exploration at a time: the next waits for the last one's sample
  // (an OnTransfer over its path) or kExploreResultWait. A sample that did
  // not raise its path's figure ends exploring that path (until a new
  // path): it confirmed the choice.
  AutoChoice Choose(const std::vector<int32_t>& peers, uint64_t bytes, bool store_available,
                    Clock::time_point now = Clock::now());

  // True when `peer`'s link should be measured (again) and no echo is out
  // to it: fewer than kStartEchoes answered (the first round trip includes
  // setting up the connection, the later ones replace it as a change), the
  // last answer older than kEchoInterval, a change detected, or stale. The
  // caller (before each message) sends one and reports PingSent.
  bool WantsPing(int32_t peer, Clock::time_point now);
  void PingSent(int32_t peer, Clock::time_point now);

  // The probe (docs/auto.md, "The probe"). A change of the link the
  // estimator detects (a new round trip, a rate that moved) re-arms it, at
  // most once per kReprobeInterval; a new path (LinkEstimatorOptions::
  // path_change_rtt_s) also drops the old rates, so until they are measured
  // again the defaults and the probes by message route. Before its first message of
  // 1 MiB or more to a peer whose start echoes (kStartEchoes) are in, a link
  // under kProbeMaxRtt gets kInlineProbes inline sends of kInlineProbeBytes
  // (after an unmeasured warm-up; the fastest counts) and one store transfer of
  // kStoreProbeBytes, and the message waits for them; a longer link is
  // learned from the messages themselves (a short probe there measures
  // TCP's slow start, not the link). It runs before the first payload, not
  // right after the echoes: then both parties are idle (a party building
  // its model while the probe runs made loopback look 6x slower than it is).
  //
  // WantProbe marks `peers` as wanted (their wait starts at `now`) and
  // returns those whose probe the caller is to run now; ProbeDue, called
  // after an echo came back, returns true once when `peer` is wanted and its
  // echoes are now in. The caller reports ProbeDone when a probe ends,
  // whatever its outcome.
  std::vector<int32_t> WantProbe(const std::vector<int32_t>& peers,
                                 Clock::time_point now = Clock::now());
  // The receivers of a message whose probe could change its path (and so
  // are worth waiting for): Choose routes a message to several by one link
  // (an unmeasured one, else the longest round trip). Once every link has
  // a round trip only the longest matters; a link at or above kProbeMaxRtt
  // is never probed, so with one such receiver none is. A broadcast that
  // reaches one intercontinental client thus waits neither for probes of
  // the clients next door nor for the echoes of a client that just joined
  // (both cost the first round of a geo-distributed job: docs/auto.md).
  std::vector<int32_t> ProbeSet(const std::vector<int32_t>& peers);
  bool ProbeDue(int32_t peer, Clock::time_point now = Clock::now());
  void ProbeDone(int32_t peer);
  // Blocks until each wanted peer of ProbeSet(peers), evaluated again at
  // every echo, is settled (its probe ended, or none is due) or its wait
  // ran out: kProbeWait after the later of WantProbe and the peer's first
  // echo. A peer that never answers is waited for once, at most that
  // long, then routed by the defaults; a broadcast stops waiting for its
  // unmeasured receivers as soon as one of them shows a long link.
  void WaitSettled(const std::vector<int32_t>& peers);
  // Blocks until every one of `peers` has a round trip (RoundTripOf), or
  // one of them shows kProbeMaxRtt or more (then the others do not
  // matter to a bound on the slowest), or `deadline`. Unlike WaitSettled
  // it starts no probe and waits for none: what a decorator needs before
  // its choice (LinkObserver::LearnLink) is the round trips, and a probe run
  // then, while the caller waits and nothing else runs, reads a LAN
  // faster than the send's own probe did (with compression=auto on lan,
  // clients' first updates went inline 31 times in 40 against 17 in 41,
  // and round 1 took 4 s longer).
  void WaitEchoes(const std::vector<int32_t>& peers, Clock::time_point deadline);
  // True when WaitSettled(peers) would return at once.
  bool Settled(const std::vector<int32_t>& peers, Clock::time_point now = Clock::now());

  // Smallest message that waits for its receivers' probe (WantProbe), or,
  // where none ran, probes the store path's rate itself; a smaller one goes
  // inline whatever the link.
  static constexpr uint64_t kProbeMinBytes = 1ull << 20;
  static constexpr double kProbeMaxRtt = 0.020;
  static constexpr uint64_t kInlineWarmupBytes = 2ull << 20;
  static constexpr uint64_t kInlineProbeBytes = 16ull << 20;
  // Inline probe sends; the fastest is the one-stream figure.
  static constexpr int kInlineProbes = 2;
  static constexpr uint64_t kStoreProbeBytes = 32ull << 20;
  static constexpr std::chrono::seconds kProbeWait{5};
  // An exploring transfer whose sample has not come back within this long
  // (a receiver that reports no fetch, a transfer too short to measure)
  // no longer holds the next exploration back.
  static constexpr std::chrono::seconds kExploreResultWait{10};

  LinkEstimate EstimateOf(int32_t peer);
  // The round trip to judge whether the link to `peer` is long
  // (kProbeMaxRtt), in seconds; -1 while unknown. A lone first echo of
  // kProbeMaxRtt or more does not count: it includes setting up the
  // connection (40 ms on loopback; 97 ms on the geo-distributed job's
  // 1.4 ms link while seven clients joined), so a verdict of long waits
  // for the second echo, which the first's answer sends at once.
  double RoundTripOf(int32_t peer);
  // The reason of the last choice, "" before the first.
  std::string last_reason();

 private:
  static constexpr int kStartEchoes = 5;
  // Largest message sent inline to learn the one-stream rate.
  static constexpr uint64_t kInlineProbeMaxBytes = 16ull << 20;
  static constexpr size_t kRttWindow = 3;
  // While messages flow, an echo goes at most this often, so that a link
  // that got slower shows in the round trip (and flushes the window).
  static constexpr std::chrono::milliseconds kEchoInterval{1000};
  // A detected change of the link re-arms its probe (the next big message
  // waits for a new one, on a short link), at most this often.
  static constexpr std::chrono::seconds kReprobeInterval{30};
  // Exploration: at most every kExploreSpacing-th big message to a peer,
  // and at most kMaxExplorations times per path (a transfer too short to
  // measure adds no sample, so the figure could stay young for good).
  static constexpr int kExploreSpacing = 2;
  static constexpr int kMaxExplorations = 6;
  // Store-rate probes by message (Choose) per link and path.
  static constexpr int kMaxRateProbes = 3;
  enum class Probe { kUnsettled, kRunning, kSettled };
  struct Peer {
    LinkEstimator estimator;
    Probe probe = Probe::kUnsettled;
    Clock::time_point settled_at{};
    int changes_seen = 0;         // estimator.changes() already noted
    bool change_pending = false;  // a change not yet acted on (re-arm)
    bool wanted = false;
    Clock::time_point wanted_at{}, first_pong{};
    Clock::time_point ping_sent{};
    bool ping_out = false;
    int pongs = 0;
    Clock::time_point last_pong{};
    std::deque<double> rtts;  // the last kRttWindow echoes
    double start_min = 0;     // the least echo so far (of the start's)
    int since_explore = 0;    // big single-peer messages since the last exploration
    int explorations = 0;     // on the current path (explore_epoch)
    int explore_epoch = 0;    // estimator.path_changes() they count on
    // An exploration whose transfer has not reported yet (its path; until
    // explore_sent + kExploreResultWait): no other goes meanwhile, so
    // overlapping sends do not spend every exploration before the first
    // sample is in.
    bool explore_out = false;
    AutoPath explore_path = AutoPath::kInline;
    Clock::time_point explore_sent{};
    // An exploration over the store (inline) whose sample did not raise its
    // figure: the path is no faster than believed, so (predicted slower
    // than the chosen one) it is not explored again on this path.
    bool store_confirmed = false, inline_confirmed = false;
    int store_rate_probes = 0;  // messages sent to the store to learn its rate
    int rate_probe_epoch = 0;   // estimator.path_changes() they count on
  };
  Peer& PeerLocked(int32_t peer) { return peers_[peer]; }
  static double RoundTripLocked(const Peer& p);
  // After an observation: a change the estimator detected re-arms the probe.
  void AfterObservationLocked(Peer& p, Clock::time_point at);
  void RearmLocked(Peer& p, Clock::time_point now);
  void SettleLocked(Peer& p, Clock::time_point at);
  // Blends `per_byte` into a seconds-per-byte figure (0 = none yet) with
  // gain kWriteGain.
  static void Smooth(double* s_per_byte, double per_byte);
  std::vector<int32_t> ProbeSetLocked(const std::vector<int32_t>& peers);
  bool ProbeDueLocked(Peer& p, Clock::time_point now);
  // WaitSettled's test: false while a peer of ProbeSet(peers) is to be
  // waited for, with *until the earliest end of those waits.
  bool SettledLocked(const std::vector<int32_t>& peers, Clock::time_point now,
                     Clock::time_point* until);
  static Clock::time_point WaitUntil(const Peer& p) {
    return std::max(p.wanted_at, p.first_pong) + kProbeWait;
  }
  static AutoPolicyOptions OneStream() {
    AutoPolicyOptions o;
    o.max_streams = 1;
    return o;
  }

  const AutoPolicyOptions policy_;
  // Writes smaller than this say more about the store's request latency
  // than about its rate (the rate is charged per byte). The store probe
  // (kStoreProbeBytes) is measured.
  static constexpr uint64_t kStoreWriteMinBytes = 8ull << 20;
  // Weight of a new write in store_write_s_per_byte_ (as the estimator's
  // rates). Smoothed as time per byte, so one write into a warm page cache
  // at 10x the rate moves the figure as little as one 10x slower write.
  static constexpr double kWriteGain = 0.25;
  std::mutex mu_;
  std::condition_variable settled_;
  std::map<int32_t, Peer> peers_;
  std::string last_reason_;
  double store_write_s_per_byte_ = 0;  // 0 = none measured
  double egress_s_per_byte_ = 0;       // 0 = no inline broadcast measured
};

}  // namespace xsilo
