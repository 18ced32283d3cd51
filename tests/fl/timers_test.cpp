#include "xsilo/fl/timers.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

namespace xsilo::fl {
namespace {

TEST(StateTimers, AccumulatesPerStateAndRoundTripsThroughParams) {
  StateTimers t;
  t.AddSeconds(PartyState::kTrain, 1.5);
  t.AddSeconds(PartyState::kTrain, 0.5);
  t.AddSeconds(PartyState::kWait, 0.25);
  t.AddSeconds(PartyState::kCommunication, -1);  // ignored
  {
    StateTimers::Scope s(t, PartyState::kSerialization);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_DOUBLE_EQ(t.Seconds(PartyState::kTrain), 2.0);
  EXPECT_DOUBLE_EQ(t.Seconds(PartyState::kCommunication), 0.0);
  EXPECT_GE(t.Seconds(PartyState::kSerialization), 0.004);
  EXPECT_EQ(t.Seconds(PartyState::kMigration), 0.0);

  Message m;
  t.ToParams(m);
  auto back = StateTimers::SecondsFromParams(m);
  auto snap = t.Snapshot();
  for (size_t i = 0; i < kPartyStateCount; ++i) EXPECT_DOUBLE_EQ(back[i], snap[i]);
  EXPECT_DOUBLE_EQ(*m.GetDouble("timer.train"), 2.0);
}

TEST(StateTimers, TableAndJsonListEveryStateForEveryParty) {
  std::vector<PartyTimes> rows = {{"server", 0, {0, 1, 2, 0, 3, 0}},
                                  {"client 1", 1, {4, 0, 1, 0.5, 0.5, 0}}};
  std::string table = FormatStateTable(rows);
  for (const char* s : {"train", "aggregate", "communication", "serialization", "wait", "migration",
                        "total", "server", "client 1"}) {
    EXPECT_NE(table.find(s), std::string::npos) << s;
  }
  auto j = nlohmann::json::parse(StateTableJson(rows));
  ASSERT_EQ(j["states"].size(), kPartyStateCount);
  ASSERT_EQ(j["parties"].size(), 2u);
  EXPECT_EQ(j["parties"][1]["party"], "client 1");
  EXPECT_DOUBLE_EQ(j["parties"][1]["seconds"]["train"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(j["parties"][1]["total"].get<double>(), 6.0);
  EXPECT_DOUBLE_EQ(j["parties"][0]["seconds"]["migration"].get<double>(), 0.0);
}

}  // namespace
}  // namespace xsilo::fl
