#include "xsilo/fl/timers.h"

#include <cstdio>
#include <nlohmann/json.hpp>

namespace xsilo::fl {

namespace {
constexpr std::array<std::string_view, kPartyStateCount> kNames = {
    "train", "aggregate", "communication", "serialization", "wait", "migration"};

std::string ParamKey(size_t i) { return "timer." + std::string(kNames[i]); }
}  // namespace

std::string_view PartyStateName(PartyState state) { return kNames[static_cast<size_t>(state)]; }

void StateTimers::Add(PartyState state, Clock::duration d) {
  AddSeconds(state, std::chrono::duration<double>(d).count());
}

void StateTimers::AddSeconds(PartyState state, double seconds) {
  if (!(seconds > 0)) return;
  std::lock_guard<std::mutex> lock(mu_);
  seconds_[static_cast<size_t>(state)] += seconds;
}

double StateTimers::Seconds(PartyState state) const {
  std::lock_guard<std::mutex> lock(mu_);
  return seconds_[static_cast<size_t>(state)];
}

std::array<double, kPartyStateCount> StateTimers::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seconds_;
}

double StateTimers::TotalSeconds() const {
  double total = 0;
  for (double s : Snapshot()) total += s;
  return total;
}

void StateTimers::ToParams(Message& message) const {
  auto s = Snapshot();
  for (size_t i = 0; i < kPartyStateCount; ++i) message.params[ParamKey(i)] = s[i];
}

std::array<double, kPartyStateCount> StateTimers::SecondsFromParams(const Message& message) {
  std::array<double, kPartyStateCount> s{};
  for (size_t i = 0; i < kPartyStateCount; ++i) s[i] = message.GetDouble(ParamKey(i)).value_or(0.0);
  return s;
}

double PartyTimes::total() const {
  double t = 0;
  for (double s : seconds) t += s;
  return t;
}

std::string FormatStateTable(const std::vector<PartyTimes>& rows) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-10s", "party");
  out += line;
  for (auto n : kNames) {
    std::snprintf(line, sizeof line, " %13.*s", static_cast<int>(n.size()), n.data());
    out += line;
  }
  out += "         total\n";
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "%-10s", r.party.c_str());
    out += line;
    for (double s : r.seconds) {
      std::snprintf(line, sizeof line, " %12.3fs", s);
      out += line;
    }
    std::snprintf(line, sizeof line, " %12.3fs\n", r.total());
    out += line;
  }
  return out;
}

std::string StateTableJson(const std::vector<PartyTimes>& rows) {
  nlohmann::json j;
  j["states"] = nlohmann::json::array();
  for (auto n : kNames) j["states"].push_back(std::string(n));
  j["parties"] = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json p;
    p["party"] = r.party;
    p["rank"] = r.rank;
    for (size_t i = 0; i < kPartyStateCount; ++i)
      p["seconds"][std::string(kNames[i])] = r.seconds[i];
    p["total"] = r.total();
    j["parties"].push_back(std::move(p));
  }
  return j.dump(2);
}

}  // namespace xsilo::fl
