// FedAvg end to end over the inproc transport: weighting through the
// transport, learning with the built-in MLP, quorum and deadline with a dead
// client, a hung client that rejoins, and the per-state report; and faults
// (corrupt and duplicated updates, a restarted server, and over grpc+s3 a
// killed object server).
#include "xsilo/fl/fedavg.h"
#include "transport/faulty/faulty.h"
#include "transport/test_util.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "xsilo/fl/checkpoint.h"
#include "xsilo/fl/mlp.h"
#include "xsilo/hybrid/hybrid.h"
#include "xsilo/store/connector.h"
#include "xsilo/transport/registry.h"

namespace xsilo::fl {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kWidth = 8;

Tensor Filled(float v) {
  Tensor t = *Tensor::Zeros(DType::kF32, {kWidth});
  float* p = reinterpret_cast<float*>(t.data.mutable_data());
  std::fill(p, p + kWidth, v);
  return t;
}

float First(const TensorMap& m) { return reinterpret_cast<const float*>(m.at("w").data.data())[0]; }

// Client k turns the global model g into g + k and weighs it 10 k, so the
// aggregate of contributors C is g + sum(k^2) / sum(k): a value that tells
// exactly which updates went in.
class OffsetTrainer : public Trainer {
 public:
  explicit OffsetTrainer(int rank) : rank_(rank) { params_["w"] = Filled(0); }

  Result<TensorMap> GetParameters() override {
    TensorMap out;
    out["w"] = Filled(First(params_));
    return out;
  }
  Status SetParameters(const TensorMap& p) override {
    if (!p.count("w")) return InvalidArgument("no w");
    params_["w"] = Filled(First(p));
    return Status::OK();
  }
  Result<TrainResult> Train(const LocalWork& work) override {
    if (before_train) before_train();
    last_work = work;
    params_["w"] = Filled(First(params_) + static_cast<float>(rank_));
    TrainResult r;
    r.samples = 10 * rank_;
    r.metrics["loss"] = 1.0 / rank_;
    return r;
  }
  Result<EvalResult> Evaluate() override {
    return EvalResult{First(params_), 0.5, static_cast<uint64_t>(rank_)};
  }

  std::function<void()> before_train;
  LocalWork last_work;

 private:
  int rank_;
  TensorMap params_;
};

double Step(const std::vector<int32_t>& contributors) {
  double num = 0, den = 0;
  for (int32_t k : contributors) {
    num += double{10.0} * k * k;
    den += 10.0 * k;
  }
  return num / den;
}

std::atomic<int> g_fabric{0};

// A server and `clients` clients on a private inproc fabric.
struct Federation {
  explicit Federation(int clients, std::map<std::string, std::string> backend = {}) {
    const std::string fabric = "fl-test-" + std::to_string(g_fabric++);
    for (int r = 0; r <= clients; ++r) {
      TransportOptions o;
      o.rank = r;
      o.world_size = clients + 1;
      o.address = fabric;
      o.backend = backend;
      o.connect_timeout = 5s;
      auto t = TransportRegistry::Global().Create("inproc", o);
      EXPECT_TRUE(t.ok()) << t.status().ToString();
      EXPECT_TRUE((*t)->Start().ok());
      parties.push_back(std::move(t).value());
    }
  }
  ~Federation() {
    for (auto& p : parties) p->Stop();
  }
  Transport& server() { return *parties[0]; }
  Transport& client(int r) { return *parties[r]; }

  std::vector<std::unique_ptr<Transport>> parties;
};

// Runs FedAvgClient::Run on its own thread.
struct ClientThread {
  ClientThread(Transport& t, Trainer& trainer, ClientOptions o = {}) {
    o.idle_timeout = 60s;
    o.send_timeout = 30s;
    result = std::async(std::launch::async, [&t, &trainer, o] {
      FedAvgClient c(t, trainer, o);
      return c.Run();
    });
  }
  std::future<Result<ClientReport>> result;
};

// OffsetTrainers for ranks 1..n, each run by a ClientThread on party(r).
struct Clients {
  Clients(int n, const std::function<Transport&(int)>& party) {
    for (int r = 1; r <= n; ++r) {
      trainers.push_back(std::make_unique<OffsetTrainer>(r));
      threads.push_back(std::make_unique<ClientThread>(party(r), *trainers.back()));
    }
  }
  std::vector<std::unique_ptr<OffsetTrainer>> trainers;
  std::vector<std::unique_ptr<ClientThread>> threads;
};

TEST(FedAvg, AggregatesEveryUpdateWeightedBySamplesThroughTheTransport) {
  // serialize=1: the payload goes through the wire format codec both ways.
  Federation f(4, {{"serialize", "1"}});
  Clients clients(4, [&](int r) -> Transport& { return f.client(r); });
  auto& trainers = clients.trainers;
  auto& threads = clients.threads;
  ServerOptions o;
  o.rounds = 3;
  o.local_work = {0, 7};
  o.round_deadline = 60s;
  FedAvgServer server(f.server(), o);
  auto job = server.Run({{"w", Filled(1.0f)}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_EQ(job->rounds.size(), 3u);
  const double step = Step({1, 2, 3, 4});  // (1 + 4 + 9 + 16) / 10 = 3
  for (const auto& r : job->rounds) {
    EXPECT_TRUE(r.completed);
    EXPECT_EQ(r.received, 4u);
    EXPECT_EQ(r.contributors, (std::vector<int32_t>{1, 2, 3, 4}));
    EXPECT_EQ(r.bytes_sent, 4u * kWidth * 4);
    EXPECT_EQ(r.bytes_received, 4u * kWidth * 4);
    // Train loss 1/k weighted by 10k: 4 / 10; eval: each evaluates g.
    EXPECT_NEAR(r.train_loss, 0.4, 1e-12);
    EXPECT_NEAR(r.eval_loss, 1.0 + step * r.round, 1e-5);
  }
  EXPECT_NEAR(First(job->model), 1.0 + 3 * step, 1e-5);
  EXPECT_EQ(job->final_evaluation.clients, 4u);
  EXPECT_NEAR(job->final_evaluation.loss, 1.0 + 3 * step, 1e-5);
  for (auto& t : trainers) EXPECT_EQ(t->last_work.steps, 7u);
  for (auto& t : threads) {
    auto r = t->result.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->finished);
    EXPECT_EQ(r->rounds_trained, 3u);
    EXPECT_EQ(r->seconds[static_cast<size_t>(PartyState::kMigration)], 0.0);
  }
  // One row for the server and one per client, each with the six states.
  ASSERT_EQ(job->times.size(), 5u);
  EXPECT_EQ(job->times[0].party, "server");
  EXPECT_EQ(job->times[4].rank, 4);
  EXPECT_GT(job->times[0].seconds[static_cast<size_t>(PartyState::kAggregate)], 0.0);
  EXPECT_GT(job->times[2].seconds[static_cast<size_t>(PartyState::kTrain)], 0.0);
  EXPECT_GT(job->times[2].seconds[static_cast<size_t>(PartyState::kSerialization)], 0.0);
}

// Each round's timeline puts every aggregated update's stamps in the order
// they happen: the client has the model, trains, starts sending, and the
// server has the update, all within the round.
TEST(FedAvg, TheRoundTimelineOrdersEachUpdatesStamps) {
  Federation f(3, {{"serialize", "1"}});
  Clients clients(3, [&](int r) -> Transport& { return f.client(r); });
  clients.trainers[1]->before_train = [] { std::this_thread::sleep_for(50ms); };
  ServerOptions o;
  o.rounds = 2;
  o.round_deadline = 60s;
  FedAvgServer server(f.server(), o);
  auto job = server.Run({{"w", Filled(1.0f)}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_EQ(job->rounds.size(), 2u);
  constexpr double kClockSlack = 1e-3;  // two clocks read a moment apart
  for (const auto& r : job->rounds) {
    ASSERT_TRUE(std::isfinite(r.broadcast_s));
    EXPECT_GE(r.broadcast_s, 0.0);
    EXPECT_LE(r.broadcast_s, r.seconds);
    ASSERT_EQ(r.timeline.size(), 3u);
    std::set<int32_t> ranks;
    double previous = 0;
    for (const auto& u : r.timeline) {
      ranks.insert(u.rank);
      ASSERT_TRUE(std::isfinite(u.model_at_s) && std::isfinite(u.train_s) &&
                  std::isfinite(u.sent_at_s) && std::isfinite(u.arrived_s));
      EXPECT_GE(u.model_at_s, -kClockSlack);
      EXPECT_LE(u.model_at_s + u.train_s, u.sent_at_s + kClockSlack) << "rank " << u.rank;
      EXPECT_LE(u.sent_at_s, u.arrived_s + kClockSlack) << "rank " << u.rank;
      EXPECT_GE(u.arrived_s, previous);  // arrival order
      EXPECT_LE(u.arrived_s, r.seconds);
      previous = u.arrived_s;
      if (u.rank == 2) {
        EXPECT_GE(u.train_s, 0.05);  // it slept that long in Train
      }
    }
    EXPECT_EQ(ranks, (std::set<int32_t>{1, 2, 3}));
  }
}

TEST(FedAvg, SelectsASubsetOfClientsPerRound) {
  Federation f(5);
  Clients clients(5, [&](int r) -> Transport& { return f.client(r); });
  auto& threads = clients.threads;
  ServerOptions o;
  o.rounds = 4;
  o.clients_per_round = 2;
  o.quorum_fraction = 1.0;
  o.round_deadline = 60s;
  FedAvgServer server(f.server(), o);
  auto job = server.Run({{"w", Filled(0.0f)}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  double expected = 0;
  std::set<int32_t> seen;
  for (const auto& r : job->rounds) {
    EXPECT_EQ(r.selected, 2u);
    ASSERT_EQ(r.contributors.size(), 2u);
    seen.insert(r.contributors.begin(), r.contributors.end());
    expected += Step(r.contributors);
  }
  EXPECT_GT(seen.size(), 2u);  // not always the same two
  EXPECT_NEAR(First(job->model), expected, 1e-4);
  for (auto& t : threads) EXPECT_TRUE(t->result.get().ok());
}

TEST(FedAvg, ADeadClientCannotStallARoundQuorumAndDeadlineCloseIt) {
  Federation f(4);
  // Client 4's transport is up but nothing serves it: it never answers.
  Clients clients(3, [&](int r) -> Transport& { return f.client(r); });
  auto& threads = clients.threads;
  ServerOptions o;
  o.rounds = 2;
  o.quorum_fraction = 0.75;  // 3 of 4
  o.round_deadline = 1500ms;
  o.finish_deadline = 1500ms;
  FedAvgServer server(f.server(), o);
  const auto start = std::chrono::steady_clock::now();
  auto job = server.Run({{"w", Filled(0.0f)}});
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  for (const auto& r : job->rounds) {
    EXPECT_EQ(r.selected, 4u);
    EXPECT_EQ(r.required, 3u);
    EXPECT_EQ(r.received, 3u);
    EXPECT_TRUE(r.completed);
    EXPECT_EQ(r.contributors, (std::vector<int32_t>{1, 2, 3}));
    // Each such round waited out its deadline for the missing client.
    EXPECT_GE(r.seconds, 1.4);
  }
  EXPECT_NEAR(First(job->model), 2 * Step({1, 2, 3}), 1e-5);
  EXPECT_EQ(job->final_evaluation.clients, 3u);
  EXPECT_GE(took, 3 * 1400ms);  // two rounds and the final evaluation
  for (auto& t : threads) EXPECT_TRUE(t->result.get().ok());
}

TEST(FedAvg, RoundsBelowQuorumLeaveTheModelAndFailTheJobAfterTheLimit) {
  Federation f(3);
  // client 3 is dead
  Clients clients(2, [&](int r) -> Transport& { return f.client(r); });
  auto& threads = clients.threads;
  std::vector<RoundReport> seen;
  ServerOptions o;
  o.rounds = 5;
  o.quorum_count = 3;
  o.quorum_fraction = 0;
  o.round_deadline = 800ms;
  o.max_failed_rounds = 2;
  o.on_round = [&](const RoundReport& r) { seen.push_back(r); };
  FedAvgServer server(f.server(), o);
  auto job = server.Run({{"w", Filled(5.0f)}});
  EXPECT_EQ(job.status().code(), StatusCode::kUnavailable) << job.status().ToString();
  ASSERT_EQ(seen.size(), 2u);
  for (const auto& r : seen) {
    EXPECT_FALSE(r.completed);
    EXPECT_EQ(r.received, 2u);
    EXPECT_EQ(r.required, 3u);
    // The round-start model was evaluated as 5 both times: it never moved.
    EXPECT_NEAR(r.eval_loss, 5.0, 1e-6);
  }
  // The server told the clients the job is over.
  for (auto& t : threads) {
    auto r = t->result.get();
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
    EXPECT_NE(r.status().message().find("aborted"), std::string::npos);
  }
}

TEST(FedAvg, AHungClientsLateUpdateIsDiscardedAndItRejoinsLater) {
  Federation f(4);
  std::vector<std::unique_ptr<OffsetTrainer>> trainers;
  for (int r = 1; r <= 4; ++r) trainers.push_back(std::make_unique<OffsetTrainer>(r));
  // Client 4 hangs inside its first round's training until round 1 is over.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> calls{0};
  trainers[3]->before_train = [&] {
    if (calls++ == 0) released.wait();
  };
  std::vector<std::unique_ptr<ClientThread>> threads;
  for (int r = 1; r <= 4; ++r) {
    threads.push_back(std::make_unique<ClientThread>(f.client(r), *trainers[r - 1]));
  }
  ServerOptions o;
  o.rounds = 5;
  o.quorum_fraction = 0.5;
  o.round_deadline = 1500ms;
  o.on_round = [&](const RoundReport& r) {
    if (r.round == 1) release.set_value();
  };
  FedAvgServer server(f.server(), o);
  auto job = server.Run({{"w", Filled(0.0f)}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const auto& rounds = job->rounds;
  ASSERT_EQ(rounds.size(), 5u);
  EXPECT_EQ(rounds[0].contributors, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(rounds[1].contributors, (std::vector<int32_t>{1, 2, 3}));
  // Back by round 3 at the latest (round 2 may still see its stale answer).
  EXPECT_EQ(rounds[3].contributors, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(rounds[4].contributors, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_GE(job->late_updates_discarded, 1u);
  uint32_t discarded = 0;
  for (const auto& r : rounds) discarded += r.discarded;
  EXPECT_GE(discarded, 1u);
  // The model is exactly the sum over the accepted contributors: the late
  // round-0 update (which would add 4 on top of a stale model) never went in.
  double expected = 0;
  for (const auto& r : rounds) {
    EXPECT_TRUE(r.completed);
    expected += Step(r.contributors);
  }
  EXPECT_NEAR(First(job->model), expected, 1e-4);
  auto hung = threads[3]->result.get();
  ASSERT_TRUE(hung.ok()) << hung.status().ToString();
  EXPECT_TRUE(hung->finished);
  EXPECT_GE(hung->rounds_trained, 3u);  // round 0 (too late), then rounds 3 and 4 at least
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(threads[i]->result.get().ok());
}

TEST(FedAvg, TheMlpLearnsLossAndAccuracyImproveRoundAfterRound) {
  const int clients = 3;
  Federation f(clients);
  auto shape = MlpShapeForTier("small");
  ASSERT_TRUE(shape.ok());
  SyntheticOptions data;
  std::vector<std::unique_ptr<Trainer>> trainers;
  std::vector<std::unique_ptr<ClientThread>> threads;
  for (int r = 1; r <= clients; ++r) {
    MlpOptions m;
    m.shape = *shape;
    m.seed = 100 + r;
    auto t = MakeMlpTrainer(m, *GenerateSyntheticShard(data, r - 1));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    trainers.push_back(std::move(t).value());
    threads.push_back(std::make_unique<ClientThread>(f.client(r), *trainers.back()));
  }
  ServerOptions o;
  o.rounds = 4;
  o.local_work = {0, 10};
  o.quorum_fraction = 1.0;
  o.round_deadline = 120s;
  FedAvgServer server(f.server(), o);
  auto job = server.Run(*MlpInitialParameters(*shape, 1));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  std::vector<double> loss, acc;
  for (const auto& r : job->rounds) {
    ASSERT_EQ(r.received, 3u);
    loss.push_back(r.eval_loss);
    acc.push_back(r.eval_accuracy);
    std::printf("round %lld: eval loss %.4f accuracy %.4f train loss %.4f\n",
                static_cast<long long>(r.round), r.eval_loss, r.eval_accuracy, r.train_loss);
  }
  loss.push_back(job->final_evaluation.loss);
  acc.push_back(job->final_evaluation.accuracy);
  std::printf("final: eval loss %.4f accuracy %.4f\n", loss.back(), acc.back());
  for (size_t i = 1; i < loss.size(); ++i) {
    EXPECT_LT(loss[i], loss[i - 1]) << "after round " << i - 1;
  }
  EXPECT_GT(acc.back(), acc.front() + 0.2);
  EXPECT_GT(acc.back(), acc[1]);
  EXPECT_EQ(TotalBytes(job->model), shape->ParameterCount() * 4);
  for (auto& t : threads) EXPECT_TRUE(t->result.get().ok());
}

std::string TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("xsilo-fl-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

TEST(Checkpoint, RoundTripsAndRefusesACorruptModel) {
  const std::string dir = TempDir("checkpoint");
  auto none = ReadCheckpoint(dir);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(WriteCheckpoint(dir, 3, {{"w", Filled(2.5f)}, {"b", Filled(-1.0f)}}).ok());
  ASSERT_TRUE(WriteCheckpoint(dir, 4, {{"w", Filled(3.5f)}, {"b", Filled(-2.0f)}}).ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/model-3.safetensors"));  // superseded
  auto cp = ReadCheckpoint(dir);
  ASSERT_TRUE(cp.ok()) << cp.status().ToString();
  ASSERT_TRUE(cp->has_value());
  EXPECT_EQ((*cp)->next_round, 4u);
  EXPECT_EQ(reinterpret_cast<const float*>((*cp)->model.at("b").data.data())[0], -2.0f);
  EXPECT_EQ(reinterpret_cast<const float*>((*cp)->model.at("w").data.data())[kWidth - 1], 3.5f);

  // A flipped bit in the model file is refused, never loaded.
  {
    std::fstream f(dir + "/model-4.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    f.seekp(-3, std::ios::end);
    c ^= 0x10;
    f.write(&c, 1);
  }
  auto bad = ReadCheckpoint(dir);
  EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt) << bad.status().ToString();
  std::ofstream(dir + "/checkpoint.json") << "{\"format\": \"something else\"}";
  EXPECT_EQ(ReadCheckpoint(dir).status().code(), StatusCode::kCorrupt);
  std::filesystem::remove_all(dir);
}

TEST(FedAvg, ARestartedServerResumesFromItsCheckpoint) {
  const std::string dir = TempDir("resume");
  const double step = Step({1, 2, 3});
  ServerOptions o;
  o.rounds = 5;
  o.round_deadline = 60s;
  o.checkpoint_dir = dir;
  {
    // The first server dies after finishing round 1 (the second round).
    Federation f(3);
    Clients clients(3, [&](int r) -> Transport& { return f.client(r); });
    auto& threads = clients.threads;
    ServerOptions first = o;
    first.on_round = [&](const RoundReport& r) {
      if (r.round == 1) f.server().Stop();
    };
    FedAvgServer server(f.server(), first);
    auto job = server.Run({{"w", Filled(1.0f)}});
    EXPECT_FALSE(job.ok());
    for (int r = 1; r <= 3; ++r) f.client(r).Stop();
    for (auto& t : threads) (void)t->result.get();
  }
  auto cp = ReadCheckpoint(dir);
  ASSERT_TRUE(cp.ok() && cp->has_value());
  EXPECT_EQ((*cp)->next_round, 2u);
  EXPECT_NEAR(First((*cp)->model), 1.0 + 2 * step, 1e-5);

  // A model of another shape does not resume from it.
  {
    Federation f(1);
    FedAvgServer server(f.server(), o);
    TensorMap other;
    other["w"] = *Tensor::Zeros(DType::kF32, {kWidth + 1});
    EXPECT_EQ(server.Run(other).status().code(), StatusCode::kInvalidArgument);
  }

  // The restarted server runs rounds 2..4 only, from the checkpointed model,
  // and ends where an uninterrupted job would.
  Federation f(3);
  Clients clients(3, [&](int r) -> Transport& { return f.client(r); });
  auto& threads = clients.threads;
  FedAvgServer server(f.server(), o);
  auto job = server.Run({{"w", Filled(1.0f)}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_EQ(job->rounds.size(), 3u);
  EXPECT_EQ(job->rounds.front().round, 2);
  EXPECT_NEAR(job->rounds.front().eval_loss, 1.0 + 2 * step, 1e-5);
  EXPECT_NEAR(First(job->model), 1.0 + 5 * step, 1e-5);
  for (auto& t : threads) EXPECT_TRUE(t->result.get().ok());
  std::filesystem::remove_all(dir);
}

TEST(FedAvg, AClientTrainsARoundAgainForANewServerSession) {
  Federation f(1);
  OffsetTrainer trainer(1);
  ClientThread client(f.client(1), trainer);
  auto model = [](int64_t round, int64_t session, float w) {
    Message m;
    m.type = "fl.model";
    m.round = round;
    m.params["local_steps"] = int64_t{1};
    m.params["fl.session"] = session;
    m.tensors["w"] = Filled(w);
    return m;
  };
  ASSERT_TRUE(f.server().Send(1, model(0, 111, 1.0f), 10s).ok());
  auto first = f.server().Receive(30s);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(First(first->tensors), 2.0f);
  // The same session's round 0 again is stale; a new session's round 0 is not.
  ASSERT_TRUE(f.server().Send(1, model(0, 111, 10.0f), 10s).ok());
  ASSERT_TRUE(f.server().Send(1, model(0, 222, 20.0f), 10s).ok());
  auto second = f.server().Receive(30s);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->type, "fl.update");
  EXPECT_EQ(First(second->tensors), 21.0f);
  Message fin;
  fin.type = "fl.finish";
  fin.round = 1;
  fin.params["fl.session"] = int64_t{222};
  fin.tensors["w"] = Filled(0);
  ASSERT_TRUE(f.server().Send(1, fin, 10s).ok());
  auto report = client.result.get();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->rounds_trained, 2u);
  EXPECT_EQ(report->stale_models_skipped, 1u);
}

// Scenario 5 of issue 17 in a FedAvg run: every tensor travels through the
// store (hybrid inproc+file), and client 4's connector damages what it
// stores (one flipped bit per object). The server's fetches of its update
// fail the checksum every time, so the update is refused and never
// aggregated: the rounds close at quorum with clients 1-3, and the model is
// exactly their average. (Client 4 still trains and evaluates: its
// downloads are clean.)
TEST(FedAvgFaults, ACorruptUpdateIsNeverAggregated) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("xsilo-fedavg-faults-" + std::to_string(::getpid())))
                              .string();
  const std::string fabric = "fl-faults-" + std::to_string(g_fabric++);
  std::vector<std::unique_ptr<Transport>> parties;
  for (int r = 0; r <= 4; ++r) {
    TransportOptions o;
    o.rank = r;
    o.world_size = 5;
    o.address = fabric;
    o.connect_timeout = 5s;
    auto inner = TransportRegistry::Global().Create("inproc", o);
    ASSERT_TRUE(inner.ok()) << inner.status().ToString();
    ConnectorConfig store{"file", {{"dir", dir}}};
    if (r == 4) {
      store = {"faulty", {{"inner", "file"}, {"inner.dir", dir}, {"fault.corrupt_put", "1"}}};
    }
    auto connector = MakeConnector(store);
    ASSERT_TRUE(connector.ok()) << connector.status().ToString();
    parties.push_back(MakeHybridTransport(o, std::move(inner).value(),
                                          std::shared_ptr<Connector>(std::move(connector).value()),
                                          {.threshold_bytes = 1}));
    ASSERT_TRUE(parties.back()->Start().ok());
  }
  Clients clients(4, [&](int r) -> Transport& { return *parties[r]; });
  auto& threads = clients.threads;
  ServerOptions o;
  o.rounds = 2;
  o.quorum_fraction = 0.75;  // 3 of 4
  // Each round waits this long for the update that never comes. Honest
  // updates take milliseconds; the deadline is wide so that a loaded CI
  // machine (ctest -j2 on 2 cores) cannot push one past it.
  o.round_deadline = 20s;
  o.finish_deadline = 30s;
  FedAvgServer server(*parties[0], o);
  auto job = server.Run({{"w", Filled(1.0f)}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_EQ(job->rounds.size(), 2u);
  for (const auto& r : job->rounds) {
    EXPECT_TRUE(r.completed);
    EXPECT_EQ(r.received, 3u);
    EXPECT_EQ(r.contributors, (std::vector<int32_t>{1, 2, 3}));
  }
  EXPECT_NEAR(First(job->model), 1.0 + 2 * Step({1, 2, 3}), 1e-5);
  for (auto& t : threads) EXPECT_TRUE(t->result.get().ok());
  for (auto& p : parties) p->Stop();
  std::filesystem::remove_all(dir);
}

// Each client's update counts at most once per round: a client whose
// update arrives twice (as after a transport's redelivery) moves the model
// exactly as much as if it had arrived once. Client 2 sends only after both
// copies of client 1's update are in the server's queue, so the copy
// arrives while the round is still open.
TEST(FedAvgFaults, ADuplicatedUpdateIsAggregatedOnce) {
  Federation f(2);
  constexpr uint64_t kRounds = 3;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t first_client_rounds = 0;
  std::vector<std::future<Status>> clients;
  for (int k = 1; k <= 2; ++k) {
    clients.push_back(std::async(std::launch::async, [&, k]() -> Status {
      Transport& t = f.client(k);
      for (uint64_t answered = 0; answered < kRounds;) {
        XSILO_ASSIGN_OR_RETURN(Message model, t.Receive(60s));
        if (model.type != "fl.model") continue;
        if (k == 2) {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return first_client_rounds > answered; });
        }
        Message update;
        update.type = "fl.update";
        update.round = model.round;
        update.params["samples"] = int64_t{10} * k;
        update.tensors["w"] = Filled(First(model.tensors) + static_cast<float>(k));
        XSILO_RETURN_IF_ERROR(t.Send(0, update, 30s));
        XSILO_RETURN_IF_ERROR(t.Send(0, update, 30s));
        ++answered;
        if (k == 1) {
          std::lock_guard<std::mutex> lock(mu);
          first_client_rounds = answered;
          cv.notify_all();
        }
      }
      return Status::OK();
    }));
  }
  ServerOptions o;
  o.rounds = kRounds;
  o.quorum_fraction = 1.0;
  o.round_deadline = 60s;
  o.finish = false;
  FedAvgServer server(f.server(), o);
  auto job = server.Run({{"w", Filled(1.0f)}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  for (const auto& r : job->rounds) {
    EXPECT_EQ(r.received, 2u);
    EXPECT_EQ(r.contributors, (std::vector<int32_t>{1, 2}));
    // These clients stamp nothing: their timeline has only the arrival.
    ASSERT_EQ(r.timeline.size(), 2u);
    for (const auto& u : r.timeline) {
      EXPECT_TRUE(std::isnan(u.model_at_s) && std::isnan(u.train_s) && std::isnan(u.sent_at_s));
      EXPECT_TRUE(std::isfinite(u.arrived_s));
    }
  }
  EXPECT_NEAR(First(job->model), 1.0 + kRounds * Step({1, 2}), 1e-5);
  for (auto& c : clients) EXPECT_TRUE(c.get().ok());
}

// FedAvg over the faulty transport decorator: messages both ways are
// duplicated, corrupted (one flipped bit of the frame) or dropped. Whatever
// arrives damaged is refused by the receiving transport and never
// aggregated; a copy is aggregated once; so the model after each round is
// exactly the step of that round's contributors, whoever they were.
TEST(FedAvgFaults, OverAFaultyTransportTheModelIsExactlyItsContributorsAverage) {
  const std::string fabric = "fl-faulty-" + std::to_string(g_fabric++);
  constexpr int kClients = 4;
  std::vector<std::unique_ptr<Transport>> parties;
  for (int r = 0; r <= kClients; ++r) {
    TransportOptions o;
    o.rank = r;
    o.world_size = kClients + 1;
    o.address = fabric;
    o.connect_timeout = 5s;
    o.backend = {{"serialize", "1"},
                 {"fault.seed", std::to_string(100 + r)},
                 {"fault.duplicate", "0.3"},
                 {"fault.corrupt", "0.2"},
                 {"fault.drop", "0.1"}};
    auto t = TransportRegistry::Global().Create("faulty(inproc)", o);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_TRUE((*t)->Start().ok());
    parties.push_back(std::move(t).value());
  }
  Clients clients(kClients, [&](int r) -> Transport& { return *parties[r]; });
  auto& threads = clients.threads;
  ServerOptions o;
  o.rounds = 6;
  o.quorum_count = 1;
  o.quorum_fraction = 0;
  o.max_failed_rounds = 6;
  // A round whose model or update was lost waits this out; the assertions
  // hold for any set of contributors, so a slow machine changes who
  // contributes, not the outcome.
  o.round_deadline = 3s;
  o.finish = false;
  FedAvgServer server(*parties[0], o);
  auto job = server.Run({{"w", Filled(1.0f)}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  double expected = 1.0;
  size_t contributions = 0;
  for (const auto& r : job->rounds) {
    std::set<int32_t> unique(r.contributors.begin(), r.contributors.end());
    EXPECT_EQ(unique.size(), r.contributors.size()) << "an update was aggregated twice";
    if (r.completed) expected += Step(r.contributors);
    contributions += r.contributors.size();
  }
  EXPECT_NEAR(First(job->model), expected, 1e-4);
  EXPECT_GT(contributions, 0u);
  uint64_t injected = 0, refused = 0;
  for (auto& p : parties) {
    auto f = InjectedFaultsOf(*p);
    ASSERT_TRUE(f.has_value());
    injected += f->duplicates + f->corruptions + f->drops;
    refused += f->refused;
  }
  EXPECT_GT(injected, 0u);
  EXPECT_GT(refused, 0u) << "no damaged message reached a receiver";
  for (auto& p : parties) p->Stop();
  for (auto& t : threads) (void)t->result.get();
}

// /proc/<pid>'s children (every thread's list).
std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(task.path() / "children");
    pid_t child;
    while (in >> child) out.push_back(child);
  }
  return out;
}

bool Accepting(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// Regular files under `dir`, recursively.
size_t FilesUnder(const std::filesystem::path& dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    n += e.is_regular_file() ? 1 : 0;
  }
  return n;
}

// Scenario 3 of issue 17: the embedded S3 server of a grpc+s3 job (every
// tensor through the object store: threshold=always) is SIGKILLed in round
// 1, once every client has its model and before any uploads its update.
// Its supervisor starts another server on the same directory and port; the
// grants rank 0 issued before the kill name multipart uploads that died
// with the server, so those updates fall back to inline; the next rounds
// go through the new server. Every round completes with every client, the
// model is exact, and the bucket is empty once the job is done. (That
// stored objects survive a restart byte for byte, and that cut transfers
// are retried with backoff, is tested on the embedded server directly:
// tests/hybrid/grpc_s3_test.cpp, GrpcS3Embedded.*Restart*.)
TEST(FedAvgFaults, AKilledObjectServerIsRestartedAndTheJobFinishes) {
  constexpr int kClients = 3;
  const int s3_port = testing::FreeTcpPort();
  const std::string address = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  std::vector<std::unique_ptr<Transport>> parties(kClients + 1);
  for (int r = 0; r <= kClients; ++r) {
    TransportOptions o;
    o.rank = r;
    o.world_size = kClients + 1;
    o.address = address;
    o.connect_timeout = 30s;
    o.backend = {{"threshold", "always"}, {"store.embedded_port", std::to_string(s3_port)}};
    auto t = TransportRegistry::Global().Create("grpc+s3", o);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    parties[r] = std::move(t).value();
  }
  // The supervisor is our only child; the server is its only child.
  std::vector<pid_t> supervisors = ChildrenOf(::getpid());
  ASSERT_EQ(supervisors.size(), 1u);
  std::vector<pid_t> first_server = ChildrenOf(supervisors[0]);
  ASSERT_EQ(first_server.size(), 1u);
  const std::string prefix = "xsilo-s3-" + std::to_string(::getpid()) + "-";
  std::filesystem::path bucket;
  for (const char* base : {"/dev/shm", "/tmp"}) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
      if (e.path().filename().string().rfind(prefix, 0) == 0) bucket = e.path() / "xsilo";
    }
  }
  ASSERT_FALSE(bucket.empty());

  std::vector<std::future<Status>> started;
  for (auto& p : parties) {
    started.push_back(std::async(std::launch::async, [&p] { return p->Start(); }));
  }
  for (auto& s : started) ASSERT_TRUE(s.get().ok());

  // Round 1: every client waits in Train until all have arrived (so every
  // download is done and no upload has begun) and the server was replaced.
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  bool replaced = false;
  pid_t second_server = -1;
  std::vector<std::unique_ptr<OffsetTrainer>> trainers;
  for (int r = 1; r <= kClients; ++r) {
    trainers.push_back(std::make_unique<OffsetTrainer>(r));
    auto calls = std::make_shared<int>(0);
    trainers.back()->before_train = [&, r, calls] {
      if ((*calls)++ != 1) return;
      std::unique_lock<std::mutex> lock(mu);
      ++arrived;
      cv.notify_all();
      if (r != 1) {
        cv.wait(lock, [&] { return replaced; });
        return;
      }
      cv.wait(lock, [&] { return arrived == kClients; });
      // The round's model object goes once all three confirmed it.
      for (int i = 0; i < 3000 && FilesUnder(bucket) > 0; ++i) std::this_thread::sleep_for(10ms);
      EXPECT_EQ(::kill(first_server[0], SIGKILL), 0);
      for (int i = 0; i < 3000 && second_server < 0; ++i) {
        for (pid_t p : ChildrenOf(supervisors[0])) {
          if (p != first_server[0] && Accepting(s3_port)) second_server = p;
        }
        if (second_server < 0) std::this_thread::sleep_for(10ms);
      }
      replaced = true;
      cv.notify_all();
    };
  }
  std::vector<std::unique_ptr<ClientThread>> threads;
  for (int r = 1; r <= kClients; ++r) {
    threads.push_back(std::make_unique<ClientThread>(*parties[r], *trainers[r - 1]));
  }
  ServerOptions o;
  o.rounds = 3;
  o.quorum_fraction = 1.0;
  o.round_deadline = 60s;
  FedAvgServer server(*parties[0], o);
  auto job = server.Run({{"w", Filled(1.0f)}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_GT(second_server, 0) << "the supervisor did not restart the server";
  ASSERT_EQ(job->rounds.size(), 3u);
  for (const auto& r : job->rounds) {
    EXPECT_TRUE(r.completed);
    EXPECT_EQ(r.contributors, (std::vector<int32_t>{1, 2, 3}));
  }
  EXPECT_NEAR(First(job->model), 1.0 + 3 * Step({1, 2, 3}), 1e-5);
  for (auto& t : threads) EXPECT_TRUE(t->result.get().ok());
  // Every object is evicted once its receivers confirmed it; the last
  // confirmations may still be on their way when Run returns.
  for (int i = 0; i < 3000 && FilesUnder(bucket) > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(FilesUnder(bucket), 0u);
  for (auto& p : parties) p->Stop();
}

}  // namespace
}  // namespace xsilo::fl
