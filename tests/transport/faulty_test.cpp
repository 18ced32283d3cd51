// The `faulty` transport decorator: every fault does what it says, the
// receiver refuses what was damaged and delivers the rest intact, draws are
// reproducible from the seed, and with no fault configured it keeps the
// transport contract (the conformance suite).
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <set>

#include "transport/conformance.h"
#include "transport/faulty/faulty.h"
#include "transport/test_util.h"
#include "xsilo/core/codec.h"
#include "xsilo/transport/registry.h"

XSILO_TRANSPORT_CONFORMANCE(FaultyInproc, {.backend = "faulty(inproc)", .label = "faulty_inproc"});

namespace xsilo::testing {
namespace {

using std::chrono::milliseconds;

std::atomic<int> fabric_counter{0};

struct World {
  std::vector<std::unique_ptr<Transport>> ranks;
};

World MakeWorld(const std::string& backend, int n, std::map<std::string, std::string> options) {
  World w;
  const std::string fabric = "faulty-test-" + std::to_string(fabric_counter++);
  for (int r = 0; r < n; ++r) {
    TransportOptions o;
    o.rank = r;
    o.world_size = n;
    o.address = fabric;
    o.backend = options;
    auto t = TransportRegistry::Global().Create(backend, o);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return {};
    w.ranks.push_back(std::move(*t));
  }
  std::vector<std::future<Status>> started;
  for (auto& t : w.ranks)
    started.push_back(std::async(std::launch::async, [&t] { return t->Start(); }));
  for (auto& s : started) EXPECT_TRUE(s.get().ok());
  return w;
}

// Sends messages 0..n-1 (seq in param "seq") from rank 0 to rank 1 and
// returns each send's status.
std::vector<Status> SendNumbered(Transport& from, int n, uint64_t bytes = 4096) {
  std::vector<Status> out;
  for (int i = 0; i < n; ++i) {
    Message m = PatternMessage(bytes, i, i);
    m.params["seq"] = int64_t{i};
    out.push_back(from.Send(1, std::move(m), std::chrono::seconds(30)));
  }
  return out;
}

InjectedTransportFaults Faults(const Transport& t);

// What `at` delivered (each checked intact) until it delivered or refused
// `reaching` messages, the number that reached its transport.
std::vector<int64_t> ReceiveSeqs(Transport& at, uint64_t reaching) {
  std::vector<int64_t> seqs;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (seqs.size() + Faults(at).refused < reaching &&
         std::chrono::steady_clock::now() < deadline) {
    auto m = at.Receive(milliseconds(20));
    if (!m.ok()) continue;
    EXPECT_TRUE(PatternIntact(*m)) << "a damaged message was delivered";
    seqs.push_back(*m->GetInt("seq"));
  }
  EXPECT_EQ(seqs.size() + Faults(at).refused, reaching);
  auto extra = at.Receive(milliseconds(50));
  EXPECT_FALSE(extra.ok()) << "more messages arrived than were sent";
  return seqs;
}

InjectedTransportFaults Faults(const Transport& t) {
  auto f = InjectedFaultsOf(t);
  EXPECT_TRUE(f.has_value());
  return f.value_or(InjectedTransportFaults{});
}

TEST(FaultyTransport, NamesOptionsAndErrors) {
  auto& reg = TransportRegistry::Global();
  EXPECT_TRUE(reg.Viable("faulty(inproc)").ok());
  EXPECT_EQ(reg.Viable("faulty(nosuch)").code(), StatusCode::kNotFound);
  TransportOptions o;
  o.address = "faulty-names";
  auto t = reg.Create("faulty(inproc)", o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->name(), "faulty(inproc)");
  EXPECT_TRUE(InjectedFaultsOf(**t).has_value());

  auto bad_name = reg.Create("faulty(nosuch)", o);
  EXPECT_EQ(bad_name.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg.Create("faulty()", o).status().code(), StatusCode::kNotFound);

  o.backend = {{"fault.nosuch", "1"}};
  auto unknown = reg.Create("faulty(inproc)", o);
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("fault.nosuch"), std::string::npos);

  o.backend = {{"fault.corrupt", "1.5"}};
  auto range = reg.Create("faulty(inproc)", o);
  EXPECT_EQ(range.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(range.status().message().find("probability"), std::string::npos);

  o.backend = {{"fault.seed", "-3"}};
  EXPECT_EQ(reg.Create("faulty(inproc)", o).status().code(), StatusCode::kInvalidArgument);

  // Options that are not fault.* reach the inner transport, which checks them.
  o.backend = {{"fault.drop", "0.5"}, {"serialize", "1"}};
  EXPECT_TRUE(reg.Create("faulty(inproc)", o).ok());
  o.backend = {{"fault.drop", "0.5"}, {"nosuch", "1"}};
  EXPECT_EQ(reg.Create("faulty(inproc)", o).status().code(), StatusCode::kInvalidArgument);

  // Decorators nest.
  o.backend = {};
  auto nested = reg.Create("faulty(faulty(inproc))", o);
  ASSERT_TRUE(nested.ok()) << nested.status().ToString();
  EXPECT_EQ((*nested)->name(), "faulty(faulty(inproc))");
}

TEST(FaultyTransport, FailRefusesEverySendAndDeliversNothing) {
  World w = MakeWorld("faulty(inproc)", 2, {{"fault.fail", "1"}});
  ASSERT_EQ(w.ranks.size(), 2u);
  for (const Status& s : SendNumbered(*w.ranks[0], 10)) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  }
  EXPECT_TRUE(ReceiveSeqs(*w.ranks[1], 0).empty());
  EXPECT_EQ(Faults(*w.ranks[0]).failures, 10u);
}

TEST(FaultyTransport, DropReportsOkAndLosesTheMessage) {
  World w = MakeWorld("faulty(inproc)", 2, {{"fault.drop", "0.5"}, {"fault.seed", "7"}});
  ASSERT_EQ(w.ranks.size(), 2u);
  for (const Status& s : SendNumbered(*w.ranks[0], 100)) EXPECT_TRUE(s.ok());
  const uint64_t drops = Faults(*w.ranks[0]).drops;
  EXPECT_GT(drops, 20u);
  EXPECT_LT(drops, 80u);
  std::vector<int64_t> got = ReceiveSeqs(*w.ranks[1], 100 - drops);
  EXPECT_EQ(got.size(), 100 - drops);
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end())) << "order per peer was lost";
}

TEST(FaultyTransport, DuplicateDeliversEveryMessageTwiceInOrder) {
  World w = MakeWorld("faulty(inproc)", 2, {{"fault.duplicate", "1"}});
  ASSERT_EQ(w.ranks.size(), 2u);
  for (const Status& s : SendNumbered(*w.ranks[0], 5)) EXPECT_TRUE(s.ok());
  EXPECT_EQ(ReceiveSeqs(*w.ranks[1], 10), (std::vector<int64_t>{0, 0, 1, 1, 2, 2, 3, 3, 4, 4}));
  EXPECT_EQ(Faults(*w.ranks[0]).duplicates, 5u);
}

// Corrupt and truncate damage the frame; the checksums catch every flipped
// bit that matters and every cut, so the receiver delivers only intact
// messages and refuses the rest.
TEST(FaultyTransport, DamagedFramesAreRefusedNeverDelivered) {
  for (const char* fault : {"fault.corrupt", "fault.truncate"}) {
    SCOPED_TRACE(fault);
    World w = MakeWorld("faulty(inproc)", 2, {{fault, "0.5"}, {"fault.seed", "11"}});
    ASSERT_EQ(w.ranks.size(), 2u);
    for (const Status& s : SendNumbered(*w.ranks[0], 60)) EXPECT_TRUE(s.ok());
    const InjectedTransportFaults sent = Faults(*w.ranks[0]);
    const uint64_t damaged = sent.corruptions + sent.truncations;
    EXPECT_GT(damaged, 10u);
    // A flipped bit can land in header padding no field reads; that message
    // is still intact and may be delivered. Everything else is refused.
    std::vector<int64_t> got = ReceiveSeqs(*w.ranks[1], 60);
    const uint64_t refused = Faults(*w.ranks[1]).refused;
    EXPECT_EQ(got.size() + refused, 60u);
    EXPECT_GE(refused, damaged * 9 / 10);
    if (std::string(fault) == "fault.truncate") {
      EXPECT_EQ(refused, damaged);
    }
  }
}

TEST(FaultyTransport, CutAfterBytesFailsTheCrossingSendAndGoesOn) {
  // Frames of one 4 KiB tensor are a little over 4 KiB; a cut every 10 KiB
  // falls in every second or third message.
  World w = MakeWorld("faulty(inproc)", 2, {{"fault.cut_after_bytes", "10240"}});
  ASSERT_EQ(w.ranks.size(), 2u);
  std::vector<Status> sent = SendNumbered(*w.ranks[0], 30);
  std::set<int64_t> failed;
  for (size_t i = 0; i < sent.size(); ++i) {
    if (!sent[i].ok()) {
      EXPECT_EQ(sent[i].code(), StatusCode::kUnavailable);
      EXPECT_NE(sent[i].message().find("cut after 10240 bytes"), std::string::npos);
      failed.insert(static_cast<int64_t>(i));
    }
  }
  const uint64_t frame = EncodeMessage([] {
                           Message m = PatternMessage(4096, 0, 0);
                           m.params["seq"] = int64_t{0};
                           return m;
                         }())
                             .bytes.size;
  // Each cut resets the count, and the cut message's bytes before the cut
  // counted towards it: the first message to go past byte 10240 is cut.
  const uint64_t per_cut = 10240 / frame + 1;
  EXPECT_EQ(failed.size(), 30 / per_cut);
  EXPECT_EQ(Faults(*w.ranks[0]).cuts, failed.size());
  std::vector<int64_t> got = ReceiveSeqs(*w.ranks[1], 30);
  EXPECT_EQ(got.size(), 30 - failed.size());
  for (int64_t s : got) EXPECT_EQ(failed.count(s), 0u) << "a cut message was delivered";
  EXPECT_EQ(Faults(*w.ranks[1]).refused, failed.size());
}

TEST(FaultyTransport, TheSameSeedDrawsTheSameFaults) {
  auto run = [](const std::string& seed) {
    World w = MakeWorld("faulty(inproc)", 2, {{"fault.drop", "0.3"}, {"fault.seed", seed}});
    SendNumbered(*w.ranks[0], 50);
    return ReceiveSeqs(*w.ranks[1], 50 - Faults(*w.ranks[0]).drops);
  };
  std::vector<int64_t> a = run("42"), b = run("42"), c = run("43");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(FaultyTransport, BroadcastDamagesEachPeersCopyOnItsOwn) {
  World w = MakeWorld("faulty(inproc)", 4, {{"fault.corrupt", "0.5"}, {"fault.seed", "5"}});
  ASSERT_EQ(w.ranks.size(), 4u);
  const int kMessages = 20;
  for (int i = 0; i < kMessages; ++i) {
    Message m = PatternMessage(8192, i, i);
    m.params["seq"] = int64_t{i};
    ASSERT_TRUE(w.ranks[0]->Broadcast({1, 2, 3}, std::move(m), std::chrono::seconds(30)).ok());
  }
  uint64_t delivered = 0, refused = 0;
  for (int r = 1; r < 4; ++r) {
    delivered += ReceiveSeqs(*w.ranks[r], kMessages).size();
    refused += Faults(*w.ranks[r]).refused;
  }
  EXPECT_EQ(delivered + refused, 3u * kMessages);
  EXPECT_GT(refused, 10u);
  EXPECT_GT(delivered, 10u);
}

}  // namespace
}  // namespace xsilo::testing
