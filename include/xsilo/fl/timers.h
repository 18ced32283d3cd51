// Per-state timers: where each party's wall-clock time goes, as in the
// stacked per-state bars of the paper's Figure 5.
//
// States partition a party's time; each interval is charged to exactly one:
//  train          local training and evaluation (Trainer::Train, Evaluate)
//  aggregate      the server's weighted averaging of updates
//  communication  a transfer this party is part of: its own sends until the
//                 transport reports them done, and the part of a blocked
//                 receive after the peer started sending (see docs/fl.md)
//  serialization  moving parameters between the model and a TensorMap
//                 (Trainer::GetParameters / SetParameters)
//  wait           idle or blocked with no transfer in flight
//  migration      CPU-GPU copies; always 0 here (no GPU), the slot is kept
//                 so reports line up with GPU runs
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "xsilo/core/message.h"

namespace xsilo::fl {

enum class PartyState : uint8_t {
  kTrain,
  kAggregate,
  kCommunication,
  kSerialization,
  kWait,
  kMigration
};
inline constexpr size_t kPartyStateCount = 6;

// "train", "aggregate", "communication", "serialization", "wait", "migration".
std::string_view PartyStateName(PartyState state);

// Seconds per state. Thread-safe.
class StateTimers {
 public:
  using Clock = std::chrono::steady_clock;

  void Add(PartyState state, Clock::duration d);
  void AddSeconds(PartyState state, double seconds);
  double Seconds(PartyState state) const;
  std::array<double, kPartyStateCount> Snapshot() const;
  double TotalSeconds() const;

  // Charges the lifetime of the scope to `state`.
  class Scope {
   public:
    Scope(StateTimers& timers, PartyState state)
        : timers_(timers), state_(state), start_(Clock::now()) {}
    ~Scope() { timers_.Add(state_, Clock::now() - start_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StateTimers& timers_;
    PartyState state_;
    Clock::time_point start_;
  };

  // Message params "timer.<state>" (seconds, double), so a client can ship
  // its timers to the server; SecondsFromParams reads absent keys as 0.
  void ToParams(Message& message) const;
  static std::array<double, kPartyStateCount> SecondsFromParams(const Message& message);

 private:
  mutable std::mutex mu_;
  std::array<double, kPartyStateCount> seconds_{};
};

// One row of the report.
struct PartyTimes {
  std::string party;  // "server", "client 3", ...
  int32_t rank = 0;
  std::array<double, kPartyStateCount> seconds{};
  double total() const;
};

// A fixed-width table: one row per party, one column per state plus total.
std::string FormatStateTable(const std::vector<PartyTimes>& rows);
// {"states":[...], "parties":[{"party":..,"rank":..,"seconds":{"train":..},"total":..}]}
std::string StateTableJson(const std::vector<PartyTimes>& rows);

}  // namespace xsilo::fl
