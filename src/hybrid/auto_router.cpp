#include "hybrid/auto_router.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace xsilo {

namespace {
// An echo not answered within this long is given up (a new one may go).
constexpr auto kPingTimeout = std::chrono::seconds(10);
}  // namespace

void AutoRouter::OnRtt(int32_t peer, double seconds, Clock::time_point at) {
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = PeerLocked(peer);
  p.rtts.push_back(seconds);
  while (p.rtts.size() > kRttWindow) p.rtts.pop_front();
  p.start_min = p.pongs == 0 ? seconds : std::min(p.start_min, seconds);
  const auto no_transfer = [&] {
    const LinkEstimate e = p.estimator.estimate();
    return e.one_stream_samples == 0 && e.aggregate_samples == 0;
  };
  if (p.pongs + 1 == kStartEchoes && no_transfer()) {
    // The last start echo: the link's round trip is the least of them. The
    // first ones include setting up the connection (40 ms, then 12, 5 and
    // 3 on loopback), and smoothing them in left a 0.6 ms link at 6.9 ms,
    // under which the 11 ms inline probe was refused as shorter than two
    // round trips and every Big message of the pass went to the store.
    p.estimator = LinkEstimator();
    p.changes_seen = 0;
    p.change_pending = false;
    p.estimator.AddRtt(at, p.start_min);
  } else {
    p.estimator.AddRtt(at, *std::min_element(p.rtts.begin(), p.rtts.end()));
  }
  p.ping_out = false;
  p.last_pong = at;
  if (p.pongs++ == 0) p.first_pong = at;
  AfterObservationLocked(p, at);
  settled_.notify_all();  // WaitSettled re-evaluates its set
}

void AutoRouter::OnTransfer(int32_t peer, uint64_t bytes, double seconds, int streams,
                            Clock::time_point at) {
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = PeerLocked(peer);
  auto figure = [&] {
    const LinkEstimate e = p.estimator.estimate();
    return streams > 1 ? e.aggregate_Bps : e.one_stream_Bps;
  };
  const double before = figure();
  p.estimator.AddTransfer(at, bytes, seconds, streams);
  // The result of an exploration over that path (a store transfer, or a
  // striped one, reports several streams).
  if (p.explore_out && (p.explore_path == AutoPath::kStore) == (streams > 1)) {
    p.explore_out = false;
    if (!(figure() > before)) (streams > 1 ? p.store_confirmed : p.inline_confirmed) = true;
  }
  AfterObservationLocked(p, at);
}

void AutoRouter::Smooth(double* s_per_byte, double per_byte) {
  double& s = *s_per_byte;
  s = s > 0 ? s + kWriteGain * (per_byte - s) : per_byte;
}

void AutoRouter::OnStoreWrite(uint64_t bytes, double seconds) {
  if (bytes < kStoreWriteMinBytes || !std::isfinite(seconds) || seconds <= 0) return;
  const double per_byte = seconds / static_cast<double>(bytes);
  if (!std::isfinite(per_byte) || per_byte <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Smooth(&store_write_s_per_byte_, per_byte);
}

double AutoRouter::store_write_Bps() {
  std::lock_guard<std::mutex> lock(mu_);
  return store_write_s_per_byte_ > 0 ? 1 / store_write_s_per_byte_ : 0;
}

void AutoRouter::OnInlineBroadcast(int receivers, uint64_t bytes, double seconds) {
  if (receivers < 2 || bytes < kProbeMinBytes || !std::isfinite(seconds) || seconds <= 0) return;
  const double per_byte = seconds / (static_cast<double>(bytes) * receivers);
  if (!std::isfinite(per_byte) || per_byte <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Smooth(&egress_s_per_byte_, per_byte);
}

double AutoRouter::sender_egress_Bps() {
  std::lock_guard<std::mutex> lock(mu_);
  return egress_s_per_byte_ > 0 ? 1 / egress_s_per_byte_ : 0;
}

void AutoRouter::AfterObservationLocked(Peer& p, Clock::time_point at) {
  if (p.estimator.changes() != p.changes_seen) {
    p.changes_seen = p.estimator.changes();
    p.change_pending = true;
  }
  RearmLocked(p, at);
}

void AutoRouter::RearmLocked(Peer& p, Clock::time_point now) {
  // A change seen within kReprobeInterval of the last settling waits until
  // the interval has passed (the next observation or big message after it).
  if (p.change_pending && p.probe == Probe::kSettled && now - p.settled_at >= kReprobeInterval) {
    p.change_pending = false;
    p.probe = Probe::kUnsettled;
    p.wanted = false;  // the next big message asks again, and waits from then
  }
}

void AutoRouter::SettleLocked(Peer& p, Clock::time_point at) {
  p.probe = Probe::kSettled;
  p.settled_at = at;
  settled_.notify_all();
}

AutoChoice AutoRouter::Choose(const std::vector<int32_t>& peers, uint64_t bytes,
                              bool store_available, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  LinkEstimate link;
  int32_t link_peer = -1;
  for (int32_t peer : peers) {
    LinkEstimate e = PeerLocked(peer).estimator.estimate();
    // Unknown beats known (the safe default), then the longest round trip.
    if (link_peer < 0 || e.samples == 0 || (link.samples > 0 && e.rtt_s > link.rtt_s)) {
      link = e;
      link_peer = peer;
    }
  }
  // The store path's rate is learned from store transfers only: a message
  // big enough to measure goes to the store until one has been measured
  // (the parallel probe; on any link: a LAN-like round trip says nothing
  // about a rate-limited one). Then the one-stream rate is learned from an
  // inline send: on a LAN-like link with a message of any size, elsewhere
  // only with one that cannot take long on a slow stream.
  if (link.samples > 0 && bytes >= kProbeMinBytes) {
    const bool lan_like = link.rtt_s >= 0 && link.rtt_s < policy_.lan_rtt_s;
    const std::string rtt =
        "round trip " + std::to_string(static_cast<int64_t>(link.rtt_s * 1e3)) + " ms";
    AutoChoice probe;
    Peer& lp = PeerLocked(link_peer);
    if (lp.rate_probe_epoch != lp.estimator.path_changes()) {
      lp.rate_probe_epoch = lp.estimator.path_changes();
      lp.store_rate_probes = 0;
    }
    if (!(link.aggregate_Bps > 0) && store_available && lp.store_rate_probes < kMaxRateProbes) {
      ++lp.store_rate_probes;
      probe.path = AutoPath::kStore;
      probe.reason =
          "store: probing the parallel rate (" + rtt + ", no store transfer measured yet)";
    } else if (link.aggregate_Bps > 0 && !(link.one_stream_Bps > 0) && !lan_like &&
               peers.size() > 1 && store_available) {
      // An inline broadcast times only the sender's egress (its copies
      // share it), never one stream: it would probe again at every one.
      // On the geo-distributed job the server's 3.4 MB int8 model deltas
      // went inline to seven clients, their copies sharing its egress, in
      // 5.7-6.0 s each round, where the 67 MB model had reached the
      // farthest client from the store in 5.2 s.
      probe.path = AutoPath::kStore;
      probe.reason = "store: a broadcast to " + std::to_string(peers.size()) + " receivers (" +
                     rtt + "): the store's rate is measured, one stream's is not";
    } else if (link.aggregate_Bps > 0 && !(link.one_stream_Bps > 0) &&
               (lan_like || bytes <= kInlineProbeMaxBytes)) {
      probe.path = AutoPath::kInline;
      probe.reason =
          "inline: probing the one-stream rate (" + rtt + ", no inline send measured yet)";
    }
    if (!probe.reason.empty()) {
      last_reason_ = probe.reason;
      return probe;
    }
  }
  AutoRequest request;
  request.bytes = bytes;
  request.receivers = static_cast<int>(peers.size());
  request.store_available = store_available;
  AutoPolicyOptions policy = policy_;
  if (store_write_s_per_byte_ > 0) policy.store_local_Bps = 1 / store_write_s_per_byte_;
  if (egress_s_per_byte_ > 0 && peers.size() > 1) policy.sender_egress_Bps = 1 / egress_s_per_byte_;
  AutoChoice choice = ChooseAutoPath(link, request, policy);
  if (peers.size() == 1 && bytes >= kProbeMinBytes) {
    Peer& p = PeerLocked(peers[0]);
    if (p.explore_epoch != p.estimator.path_changes()) {
      p.explore_epoch = p.estimator.path_changes();
      p.explorations = 0;
      p.store_confirmed = p.inline_confirmed = false;
    }
    if (p.explore_out && now - p.explore_sent >= kExploreResultWait) p.explore_out = false;
    p.since_explore = std::min(p.since_explore + 1, kExploreSpacing);
    if (p.since_explore >= kExploreSpacing && !p.explore_out && p.explorations < kMaxExplorations) {
      std::optional<AutoChoice> alt = ExploreAutoPath(link, request, choice, policy);
      const bool confirmed =
          alt.has_value() &&
          (alt->path == AutoPath::kStore ? p.store_confirmed : p.inline_confirmed);
      if (alt.has_value() && !confirmed) {
        p.since_explore = 0;
        ++p.explorations;
        p.explore_out = true;
        p.explore_path = alt->path;
        p.explore_sent = now;
        choice = std::move(*alt);
      }
    }
  }
  last_reason_ = choice.reason;
  return choice;
}

bool AutoRouter::WantsPing(int32_t peer, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = PeerLocked(peer);
  if (p.ping_out && now - p.ping_sent < kPingTimeout) return false;
  if (p.pongs < kStartEchoes || now - p.last_pong > kEchoInterval) return true;
  const std::string why = p.estimator.RemeasureReason(now);
  // A missing parallel probe is learned from store transfers, not echoes.
  if (why.empty() || why == kNoParallelProbe) return false;
  p.estimator.AcknowledgeChange();
  return true;
}

void AutoRouter::PingSent(int32_t peer, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = PeerLocked(peer);
  p.ping_out = true;
  p.ping_sent = now;
}

std::vector<int32_t> AutoRouter::WantProbe(const std::vector<int32_t>& peers,
                                           Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int32_t> due;
  for (int32_t peer : peers) {
    Peer& p = PeerLocked(peer);
    RearmLocked(p, now);
    if (!p.wanted) {
      p.wanted = true;
      p.wanted_at = now;
    }
    if (ProbeDueLocked(p, now)) due.push_back(peer);
  }
  return due;
}

std::vector<int32_t> AutoRouter::ProbeSet(const std::vector<int32_t>& peers) {
  std::lock_guard<std::mutex> lock(mu_);
  return ProbeSetLocked(peers);
}

std::vector<int32_t> AutoRouter::ProbeSetLocked(const std::vector<int32_t>& peers) {
  if (peers.size() <= 1) return peers;
  int32_t longest = peers.front();
  double longest_rtt = -1;
  bool unknown = false;
  for (int32_t peer : peers) {
    const LinkEstimate e = PeerLocked(peer).estimator.estimate();
    if (e.samples == 0 || !(e.rtt_s >= 0)) {
      unknown = true;  // Choose routes by an unknown link: the defaults
    } else if (e.rtt_s > longest_rtt) {
      longest = peer;
      longest_rtt = e.rtt_s;
    }
  }
  // A long link is never probed, and the message goes by it or by the
  // defaults (an unknown one): no probe of the others could matter, and
  // waiting for an unknown one's echoes would only delay it.
  if (longest_rtt >= kProbeMaxRtt) return {};
  if (unknown) return peers;  // all short so far: wait for the echoes
  return {longest};
}

bool AutoRouter::ProbeDue(int32_t peer, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  return ProbeDueLocked(PeerLocked(peer), now);
}

bool AutoRouter::ProbeDueLocked(Peer& p, Clock::time_point now) {
  if (!p.wanted || p.probe != Probe::kUnsettled || p.pongs < kStartEchoes) return false;
  const LinkEstimate e = p.estimator.estimate();
  // Past its wait the message went by the defaults; the link is learned
  // from the messages from then on.
  // The estimate is the least of the last echoes and lags a link that just
  // got longer: the last echo must be short as well, or a probe of 16 MiB
  // over one stream of an intercontinental link takes seconds (3.6 s on
  // ca-hk, seen with `netem set`).
  const bool last_long = !p.rtts.empty() && p.rtts.back() >= kProbeMaxRtt;
  if (now > WaitUntil(p) || e.rtt_s < 0 || e.rtt_s >= kProbeMaxRtt || last_long) {
    SettleLocked(p, now);
    return false;
  }
  p.probe = Probe::kRunning;
  return true;
}

void AutoRouter::ProbeDone(int32_t peer) {
  std::lock_guard<std::mutex> lock(mu_);
  SettleLocked(PeerLocked(peer), Clock::now());
}

bool AutoRouter::SettledLocked(const std::vector<int32_t>& peers, Clock::time_point now,
                               Clock::time_point* until) {
  bool settled = true;
  for (int32_t peer : ProbeSetLocked(peers)) {
    Peer& p = PeerLocked(peer);
    if (p.probe == Probe::kSettled || !p.wanted) continue;  // nothing to wait for
    if (now >= WaitUntil(p)) {
      // Given up waiting; a probe still running reports later.
      SettleLocked(p, now);
      continue;
    }
    settled = false;
    *until = std::min(*until, WaitUntil(p));
  }
  return settled;
}

bool AutoRouter::Settled(const std::vector<int32_t>& peers, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto until = Clock::time_point::max();
  return SettledLocked(peers, now, &until);
}

void AutoRouter::WaitSettled(const std::vector<int32_t>& peers) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Every observation wakes this: an echo may shrink the set (a long link
    // showed up) or make a wanted probe due.
    auto until = Clock::time_point::max();
    if (SettledLocked(peers, Clock::now(), &until)) return;
    settled_.wait_until(lock, until);
  }
}

void AutoRouter::WaitEchoes(const std::vector<int32_t>& peers, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    bool all = true;
    for (int32_t peer : peers) {
      const double rtt = RoundTripLocked(PeerLocked(peer));
      if (rtt >= kProbeMaxRtt) return;
      all = all && rtt >= 0;
    }
    if (all) return;
    // Every observation wakes this (OnRtt notifies settled_).
    if (settled_.wait_until(lock, deadline) == std::cv_status::timeout) return;
  }
}

double AutoRouter::RoundTripLocked(const Peer& p) {
  if (p.pongs == 0) return -1;
  // During the start the estimator holds a first echo against a much
  // shorter one as an outlier (97 then 1.4 ms still reads 97): the least
  // so far is the link, as at the last start echo (OnRtt).
  double rtt = p.start_min;
  if (p.pongs >= kStartEchoes) {
    const LinkEstimate e = p.estimator.estimate();
    if (e.samples == 0 || !(e.rtt_s >= 0)) return -1;
    rtt = e.rtt_s;
  }
  if (!std::isfinite(rtt) || (p.pongs < 2 && rtt >= kProbeMaxRtt)) return -1;
  return rtt;
}

double AutoRouter::RoundTripOf(int32_t peer) {
  std::lock_guard<std::mutex> lock(mu_);
  return RoundTripLocked(PeerLocked(peer));
}

LinkEstimate AutoRouter::EstimateOf(int32_t peer) {
  std::lock_guard<std::mutex> lock(mu_);
  return PeerLocked(peer).estimator.estimate();
}

std::string AutoRouter::last_reason() {
  std::lock_guard<std::mutex> lock(mu_);
  return last_reason_;
}

}  // namespace xsilo
