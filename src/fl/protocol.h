// Message types, parameter keys and timing helpers shared by the FedAvg
// server and client.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <string_view>

#include "xsilo/core/message.h"
#include "xsilo/fl/timers.h"

namespace xsilo::fl::protocol {

inline constexpr std::string_view kModel = "fl.model";
inline constexpr std::string_view kUpdate = "fl.update";
inline constexpr std::string_view kFinish = "fl.finish";
inline constexpr std::string_view kEvaluation = "fl.evaluation";
inline constexpr std::string_view kAbort = "fl.abort";

inline constexpr const char* kSentAt = "sent_at_ns";  // system clock, ns since the epoch
// On an update: when the client had the round's model (system clock, ns
// since the epoch) and the seconds it spent evaluating and training it.
inline constexpr const char* kModelAt = "model_at_ns";
inline constexpr const char* kRoundTrain = "round_train_s";
inline constexpr const char* kLocalSteps = "local_steps";
inline constexpr const char* kLocalEpochs = "local_epochs";
inline constexpr const char* kSamples = "samples";
inline constexpr const char* kTrainLoss = "train_loss";
inline constexpr const char* kEvalLoss = "eval_loss";
inline constexpr const char* kEvalAccuracy = "eval_accuracy";
inline constexpr const char* kEvalSamples = "eval_samples";
inline constexpr const char* kReason = "reason";
inline constexpr const char* kSession = "fl.session";  // random per server run

using Clock = std::chrono::steady_clock;

inline int64_t SystemNowNs() {
  return static_cast<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count());
}

inline void StampSentAt(Message& m) { m.params[kSentAt] = SystemNowNs(); }

// When the sender stamped `m` (its param `param`, by default kSentAt), on
// this process's steady clock (assuming synchronized system clocks;
// nullopt when unstamped).
inline std::optional<Clock::time_point> SentAt(const Message& m, const char* param = kSentAt) {
  auto ns = m.GetInt(param);
  if (!ns.ok()) return std::nullopt;
  const auto sys_now = std::chrono::system_clock::now().time_since_epoch();
  const auto age = std::chrono::duration_cast<Clock::duration>(sys_now) -
                   std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(*ns));
  return Clock::now() - age;
}

struct Interval {
  Clock::time_point begin, end;
};

// Charges a blocked receive [a, b] to the timers: the part covered by
// `transfers` (the own broadcast in flight, the peer's send of the message
// that ended the wait) is communication, the rest is wait.
inline void ChargeBlocked(StateTimers& timers, Clock::time_point a, Clock::time_point b,
                          std::initializer_list<std::optional<Interval>> transfers) {
  if (b <= a) return;
  // Clip each interval to [a, b], then measure their union (at most two).
  std::vector<Interval> parts;
  for (const auto& t : transfers) {
    if (!t) continue;
    Interval c{std::max(a, t->begin), std::min(b, t->end)};
    if (c.begin < c.end) parts.push_back(c);
  }
  std::sort(parts.begin(), parts.end(),
            [](const Interval& x, const Interval& y) { return x.begin < y.begin; });
  Clock::duration comm{0};
  Clock::time_point covered = a;
  for (const auto& p : parts) {
    const auto from = std::max(covered, p.begin);
    if (p.end > from) {
      comm += p.end - from;
      covered = p.end;
    }
  }
  timers.Add(PartyState::kCommunication, comm);
  timers.Add(PartyState::kWait, (b - a) - comm);
}

}  // namespace xsilo::fl::protocol
