#include "transport/conformance.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <iostream>
#include <sstream>
#include <thread>

#include "require.h"
#include "transport/test_util.h"
#include "xsilo/core/codec.h"

namespace xsilo::testing {

// A binary whose every configuration lacks the property instantiates these
// suites with none: that is not a mistake there.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TransportHugeConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TransportBroadcastMemoryConformance);

namespace {

using namespace std::chrono_literals;

constexpr const char* kChildEnv = "XSILO_CONFORMANCE_CHILD";
std::atomic<int> g_world_counter{0};

// Fails the test if a callback fires twice or never.
class CallbackLedger {
 public:
  explicit CallbackLedger(size_t n) : fired_(n) {}
  SendCallback Arm(size_t i) {
    return [this, i](const Status& s) {
      std::lock_guard<std::mutex> lock(mu_);
      if (++fired_[i] > 1) double_fire_ = true;
      if (s.ok()) ++ok_;
      ++total_;
      cv_.notify_all();
    };
  }
  bool WaitAll(std::chrono::seconds deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, deadline, [&] { return total_ >= fired_.size(); });
  }
  // Until at least `n` callbacks reported OK.
  bool WaitOk(size_t n, std::chrono::seconds deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, deadline, [&] { return ok_ >= n; });
  }
  size_t ok() {
    std::lock_guard<std::mutex> lock(mu_);
    return ok_;
  }
  bool double_fire() {
    std::lock_guard<std::mutex> lock(mu_);
    return double_fire_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> fired_;
  size_t ok_ = 0, total_ = 0;
  bool double_fire_ = false;
};

std::string EncodeOptions(const std::map<std::string, std::string>& opts) {
  std::string s;
  for (const auto& [k, v] : opts) s += (s.empty() ? "" : ",") + k + "=" + v;
  return s;
}

std::map<std::string, std::string> DecodeOptions(const std::string& s) {
  std::map<std::string, std::string> opts;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    auto eq = item.find('=');
    if (eq != std::string::npos) opts[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return opts;
}

}  // namespace

pid_t SpawnReceiver(const ConformanceParam& p, int rank, int world, const std::string& address) {
  std::string spec = p.backend + "|" + std::to_string(rank) + "|" + std::to_string(world) + "|" +
                     address + "|" + EncodeOptions(p.backend_options);
  return SpawnSelfWithEnv(std::string(kChildEnv) + "=" + spec);
}

bool RunConformanceChildIfRequested(int* exit_code) {
  const char* spec = std::getenv(kChildEnv);
  if (spec == nullptr) return false;
  std::vector<std::string> f;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, '|')) f.push_back(item);
  while (f.size() < 5) f.emplace_back();
  TransportOptions o;
  o.rank = std::stoi(f[1]);
  o.world_size = std::stoi(f[2]);
  o.address = f[3];
  o.backend = DecodeOptions(f[4]);
  o.connect_timeout = 60s;
  auto t = TransportRegistry::Global().Create(f[0], o);
  Status started = t.ok() ? (*t)->Start() : t.status();
  if (!started.ok()) {
    std::cerr << "conformance receiver rank " << o.rank << ": " << started.ToString() << "\n";
    *exit_code = 2;
    return true;
  }
  auto m = (*t)->Receive(120s);
  *exit_code = !m.ok() ? 4 : (PatternIntact(*m) ? 0 : 3);
  // Acknowledge so the sender knows every receiver finished before it stops.
  Message ack;
  ack.type = "ack";
  if (m.ok()) (void)(*t)->Send(0, std::move(ack), 60s);
  (*t)->Stop();
  return true;
}

std::string ConformanceName(const ::testing::TestParamInfo<ConformanceParam>& info) {
  std::string n = info.param.label.empty() ? info.param.backend : info.param.label;
  std::string out;
  for (char c : n) {
    if (std::isalnum(static_cast<unsigned char>(c))) out += c;
  }
  return out;
}

void PrintTo(const ConformanceParam& p, std::ostream* os) {
  *os << p.backend << (p.backend_options.empty() ? "" : " " + EncodeOptions(p.backend_options));
}

TransportOptions TransportConformance::OptionsFor(int32_t rank, int32_t world,
                                                  const TransportOptions& base) const {
  TransportOptions o = base;
  o.rank = rank;
  o.world_size = world;
  o.address = address_;
  o.backend = GetParam().backend_options;
  return o;
}

std::vector<std::unique_ptr<Transport>> TransportConformance::MakeWorld(int n,
                                                                        TransportOptions base) {
  const auto& p = GetParam();
  address_ = p.network ? "127.0.0.1:" + std::to_string(FreeTcpPort())
                       : "conformance-" + std::to_string(getpid()) + "-" +
                             std::to_string(g_world_counter++);
  std::vector<std::unique_ptr<Transport>> world;
  for (int r = 0; r < n; ++r) {
    auto t = TransportRegistry::Global().Create(p.backend, OptionsFor(r, n, base));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return {};
    world.push_back(std::move(t).value());
  }
  std::vector<std::future<Status>> starts;
  for (auto& t : world)
    starts.push_back(std::async(std::launch::async, [&t] { return t->Start(); }));
  for (auto& f : starts) {
    Status s = f.get();
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return world;
}

void TransportConformance::TearDown() {}

TEST_P(TransportConformance, StartStopIsIdempotent) {
  auto world = MakeWorld(2);
  ASSERT_EQ(world.size(), 2u);
  world[1]->Stop();
  world[1]->Stop();
  world[0]->Stop();
  world[0]->Stop();
}

TEST_P(TransportConformance, RejectsBadPeer) {
  auto world = MakeWorld(2);
  ASSERT_EQ(world.size(), 2u);
  EXPECT_EQ(world[0]->Send(5, PatternMessage(16, 1), 10s).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(world[0]->Send(0, PatternMessage(16, 1), 10s).code(), StatusCode::kInvalidArgument);
}

TEST_P(TransportConformance, ReceiveTimesOut) {
  auto world = MakeWorld(2);
  ASSERT_EQ(world.size(), 2u);
  auto r = world[0]->Receive(50ms);
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout);
}

TEST_P(TransportConformance, SendAfterStopFailsOnce) {
  auto world = MakeWorld(2);
  ASSERT_EQ(world.size(), 2u);
  world[1]->Stop();
  CallbackLedger ledger(1);
  world[1]->SendAsync(0, PatternMessage(16, 1), ledger.Arm(0));
  ASSERT_TRUE(ledger.WaitAll(30s));
  EXPECT_EQ(ledger.ok(), 0u);
  EXPECT_FALSE(ledger.double_fire());
}

TEST_P(TransportConformance, MetadataAndParamsRoundTrip) {
  auto world = MakeWorld(2);
  ASSERT_EQ(world.size(), 2u);
  Message m;
  m.type = "model";
  m.round = 42;
  m.receivers = {1};
  m.params["s"] = std::string("hello");
  m.params["i"] = int64_t{-7};
  m.params["d"] = 2.5;
  m.params["b"] = Bytes{0, 1, 255};
  m.tensors.emplace("bias", std::move(Tensor::Zeros(DType::kF64, {3})).value());
  m.tensors.emplace("w", std::move(Tensor::Zeros(DType::kBF16, {2, 5})).value());
  ASSERT_TRUE(world[0]->Send(1, m, 30s).ok());
  auto r = world[1]->Receive(30s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->type, "model");
  EXPECT_EQ(r->round, 42);
  EXPECT_EQ(r->sender, 0);
  EXPECT_EQ(r->receivers, std::vector<int32_t>{1});
  EXPECT_EQ(*r->GetString("s"), "hello");
  EXPECT_EQ(*r->GetInt("i"), -7);
  EXPECT_EQ(*r->GetDouble("d"), 2.5);
  EXPECT_EQ(*r->GetBytes("b"), (Bytes{0, 1, 255}));
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors.at("w").dtype, DType::kBF16);
  EXPECT_EQ(r->tensors.at("w").shape, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(r->tensors.at("bias").nbytes(), 24u);
}

TEST_P(TransportConformance, OrderingPerPeer) {
  constexpr int kClients = 3, kPerClient = 100;
  auto world = MakeWorld(kClients + 1);
  ASSERT_EQ(world.size(), size_t{kClients + 1});
  std::vector<std::thread> senders;
  for (int c = 1; c <= kClients; ++c) {
    senders.emplace_back([&, c] {
      for (int i = 0; i < kPerClient; ++i) {
        world[c]->SendAsync(0, PatternMessage(64 + i, c * 1000 + i, i), [](const Status&) {});
      }
    });
  }
  std::map<int32_t, int64_t> last;
  for (int n = 0; n < kClients * kPerClient; ++n) {
    auto r = world[0]->Receive(60s);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(PatternIntact(*r));
    auto it = last.find(r->sender);
    if (it != last.end()) {
      ASSERT_EQ(r->round, it->second + 1) << "from " << r->sender;
    }
    last[r->sender] = r->round;
  }
  for (auto& t : senders) t.join();
  EXPECT_EQ(last.size(), size_t{kClients});
}

TEST_P(TransportConformance, PayloadSizes) {
  auto world = MakeWorld(2);
  ASSERT_EQ(world.size(), 2u);
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{4093}, uint64_t{300} << 20}) {
    Message m = PatternMessage(size, size + 7);
    ASSERT_TRUE(world[1]->Send(0, m, 300s).ok()) << size;
    auto r = world[0]->Receive(300s);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->tensors.at("w").nbytes(), size);
    EXPECT_TRUE(PatternIntact(*r)) << "payload of " << size << " bytes damaged";
  }
}

TEST_P(TransportHugeConformance, TensorOver2GiBRoundTrips) {
  auto world = MakeWorld(2);
  ASSERT_EQ(world.size(), 2u);
  const uint64_t size = (uint64_t{9} << 28) + 13;  // 2.25 GiB + 13 B: crosses every 32-bit limit
  {
    Message m = PatternMessage(size, 99);
    ASSERT_TRUE(world[0]->Send(1, std::move(m), 900s).ok());
  }
  auto r = world[1]->Receive(900s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors.at("w").nbytes(), size);
  EXPECT_TRUE(PatternIntact(*r));
}

TEST_P(TransportConformance, ConcurrentSendsFromManyThreads) {
  constexpr int kThreads = 6, kEach = 40;
  auto world = MakeWorld(2);
  ASSERT_EQ(world.size(), 2u);
  CallbackLedger ledger(kThreads * kEach);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        world[1]->SendAsync(0, PatternMessage(1000 + t * 7 + i, t * 100 + i),
                            ledger.Arm(t * kEach + i));
      }
    });
  }
  for (int n = 0; n < kThreads * kEach; ++n) {
    auto r = world[0]->Receive(60s);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(PatternIntact(*r));
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(ledger.WaitAll(60s));
  EXPECT_EQ(ledger.ok(), size_t{kThreads * kEach});
  EXPECT_FALSE(ledger.double_fire());
}

TEST_P(TransportConformance, HandlerReceivesInsteadOfQueue) {
  auto world = MakeWorld(2);
  ASSERT_EQ(world.size(), 2u);
  std::promise<Message> got;
  world[0]->SetHandler([&](Message m) { got.set_value(std::move(m)); });
  ASSERT_TRUE(world[1]->Send(0, PatternMessage(512, 5), 30s).ok());
  auto fut = got.get_future();
  ASSERT_EQ(fut.wait_for(30s), std::future_status::ready);
  EXPECT_TRUE(PatternIntact(fut.get()));
  EXPECT_EQ(world[0]->Receive(10ms).status().code(), StatusCode::kTimeout);
}

TEST_P(TransportBroadcastMemoryConformance, BroadcastSharesPayload) {
  constexpr int kReceivers = 4;
  const uint64_t size = uint64_t{256} << 20;
  const auto& p = GetParam();
  XSILO_REQUIRE(ResetPeakRss(), "a kernel that allows resetting VmHWM (/proc/self/clear_refs)");

  std::vector<std::unique_ptr<Transport>> world;
  std::vector<pid_t> children;
  if (p.network) {
    // Receivers in child processes: only the sender lives here.
    address_ = "127.0.0.1:" + std::to_string(FreeTcpPort());
    auto server = TransportRegistry::Global().Create(p.backend, OptionsFor(0, kReceivers + 1, {}));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    world.push_back(std::move(server).value());
    for (int r = 1; r <= kReceivers; ++r)
      children.push_back(SpawnReceiver(p, r, kReceivers + 1, address_));
    ASSERT_TRUE(world[0]->Start().ok());
  } else {
    world = MakeWorld(kReceivers + 1);
    ASSERT_EQ(world.size(), size_t{kReceivers + 1});
  }

  const uint64_t baseline = CurrentRss();
  Message m = PatternMessage(size, 3);
  ASSERT_TRUE(ResetPeakRss());
  std::vector<int32_t> peers;
  for (int r = 1; r <= kReceivers; ++r) peers.push_back(r);
  Status sent = world[0]->Broadcast(peers, m, 600s);
  if (!sent.ok()) {
    // Say how the receivers ended, then fail.
    for (pid_t pid : children) {
      int st = 0;
      pid_t got = 0;
      for (int i = 0; i < 100 && (got = waitpid(pid, &st, WNOHANG)) == 0; ++i)
        std::this_thread::sleep_for(100ms);
      if (got == 0) {
        ADD_FAILURE() << "receiver " << pid << " still running; killed";
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
      } else {
        ADD_FAILURE() << "receiver " << pid << " exited with status " << st;
      }
    }
    FAIL() << "broadcast: " << sent.ToString();
  }

  if (p.network) {
    for (int n = 0; n < kReceivers; ++n) {
      auto ack = world[0]->Receive(600s);
      ASSERT_TRUE(ack.ok()) << ack.status().ToString();
    }
    for (pid_t pid : children) {
      int st = 0;
      ASSERT_EQ(waitpid(pid, &st, 0), pid);
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "receiver exit status " << st;
    }
  } else {
    for (int r = 1; r <= kReceivers; ++r) {
      auto got = world[r]->Receive(600s);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(PatternIntact(*got));
    }
  }
  const uint64_t peak = PeakRss();
  const double ratio = static_cast<double>(peak - baseline) / static_cast<double>(size);
  RecordProperty("sender_peak_over_payload", std::to_string(ratio));
  EXPECT_LT(ratio, 1.2) << "sender grew by " << (peak - baseline) << " bytes for a " << size
                        << "-byte payload broadcast to " << kReceivers << " peers";
}

TEST_P(TransportConformance, StopWithSendsInFlight) {
  constexpr int kSends = 40;
  TransportOptions base;
  base.receive_queue_capacity = 1;  // the receiver backs up at once
  auto world = MakeWorld(2, base);
  ASSERT_EQ(world.size(), 2u);
  CallbackLedger ledger(kSends);
  for (int i = 0; i < kSends; ++i)
    world[1]->SendAsync(0, PatternMessage(256 << 10, i), ledger.Arm(i));
  // The first message fills the receiver's queue, which nobody reads: once
  // it is handed over, the sends behind it are in flight, held back.
  // (EXPECT, not ASSERT: the ledger must outlive the transports' Stop.)
  EXPECT_TRUE(ledger.WaitOk(1, 30s)) << "no send was handed to the receiver";
  world[1]->Stop();
  ASSERT_TRUE(ledger.WaitAll(60s)) << "a send callback never fired after Stop";
  EXPECT_FALSE(ledger.double_fire());
  EXPECT_LT(ledger.ok(), size_t{kSends});
  world[0]->Stop();
}

TEST_P(TransportConformance, ReceiverStopsUnderSender) {
  constexpr int kSends = 40;
  TransportOptions base;
  base.receive_queue_capacity = 1;
  auto world = MakeWorld(2, base);
  ASSERT_EQ(world.size(), 2u);
  CallbackLedger ledger(kSends);
  for (int i = 0; i < kSends; ++i)
    world[1]->SendAsync(0, PatternMessage(64 << 10, i), ledger.Arm(i));
  // Once the first message fills the unread queue, the sender is held back
  // by the receiver that now stops.
  EXPECT_TRUE(ledger.WaitOk(1, 30s)) << "no send was handed to the receiver";
  world[0]->Stop();
  auto r = world[0]->Receive(10ms);  // queued messages may still be read, then Cancelled
  while (r.ok()) r = world[0]->Receive(10ms);
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
  world[1]->Stop();
  ASSERT_TRUE(ledger.WaitAll(60s)) << "a send callback never fired";
  EXPECT_FALSE(ledger.double_fire());
}

}  // namespace xsilo::testing
