// Private: the per-peer link knowledge of a hybrid transport opened as
// "auto+<connector>" (docs/auto.md): what it has measured of each peer's
// link (echo round trips, completed inline sends, store transfers reported
// back) and the path ChooseAutoPath picks for a message from it.
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "xsilo/transport/auto_policy.h"
#include "xsilo/transport/link_estimator.h"

namespace xsilo {

class AutoRouter {
 public:
  using Clock = LinkEstimator::Clock;

  // Striping over parallel grpc streams is not wired into the hybrid
  // backend (grpc fixes its streams at Start): the default policy chooses
  // only between inline (one stream) and the store.
  AutoRouter() : AutoRouter(OneStream()) {}
  explicit AutoRouter(AutoPolicyOptions policy) : policy_(policy) {}

  // An echo's round trip. The estimator is fed the least of the last
  // kRttWindow echoes: an echo through both parties' transport threads (and
  // behind a message on the same stream) carries their delays, the least
  // one is the link.
  void OnRtt(int32_t peer, double seconds, Clock::time_point at = Clock::now());
  void OnTransfer(int32_t peer, uint64_t bytes, double seconds, int streams,
                  Clock::time_point at = Clock::now());

  // The path for `bytes` to `peers`: a broadcast goes by its slowest known
  // link (the largest round trip). While the store rate is unknown, a
  // message of kProbeMinBytes or more goes to the store to measure it (a
  // store transfer is the only source of that figure); then one goes inline
  // until the one-stream rate is known (on a link that is not LAN-like, only
  // up to kInlineProbeMaxBytes: a slow stream is not risked for it).
  AutoChoice Choose(const std::vector<int32_t>& peers, uint64_t bytes, bool store_available);

  // True when `peer`'s link should be measured (again) and no echo is out
  // to it: fewer than kStartEchoes answered (the first round trip includes
  // setting up the connection, the later ones replace it as a change), the
  // last answer older than kEchoInterval, a change detected, or stale. The
  // caller (before each message) sends one and reports PingSent.
  bool WantsPing(int32_t peer, Clock::time_point now);
  void PingSent(int32_t peer, Clock::time_point now);

  LinkEstimate EstimateOf(int32_t peer);
  // The reason of the last choice, "" before the first.
  std::string last_reason();

 private:
  static constexpr int kStartEchoes = 5;
  // Smallest message that probes the store path's rate.
  static constexpr uint64_t kProbeMinBytes = 1ull << 20;
  // Largest message sent inline to learn the one-stream rate.
  static constexpr uint64_t kInlineProbeMaxBytes = 16ull << 20;
  static constexpr size_t kRttWindow = 3;
  // While messages flow, an echo goes at most this often, so that a link
  // that got slower shows in the round trip (and flushes the window).
  static constexpr std::chrono::milliseconds kEchoInterval{1000};
  struct Peer {
    LinkEstimator estimator;
    Clock::time_point ping_sent{};
    bool ping_out = false;
    int pongs = 0;
    Clock::time_point last_pong{};
    std::deque<double> rtts;  // the last kRttWindow echoes
  };
  Peer& PeerLocked(int32_t peer) { return peers_[peer]; }
  static AutoPolicyOptions OneStream() {
    AutoPolicyOptions o;
    o.max_streams = 1;
    return o;
  }

  const AutoPolicyOptions policy_;
  std::mutex mu_;
  std::map<int32_t, Peer> peers_;
  std::string last_reason_;
};

}  // namespace xsilo
