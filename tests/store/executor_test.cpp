// StoreExecutor: which arguments and results cross through the store, that
// the store is empty once tasks are done (whatever their outcome), errors
// in the future, a 64-task map-reduce on 2 threads, and the serialized form
// run by another process from its text alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <future>
#include <latch>
#include <set>
#include <stdexcept>
#include <thread>

#include "store/store_test_util.h"
#include "xsilo/store/connector_wrapper.h"
#include "xsilo/store/executor.h"

// A user type joins through a Codec specialization, as documented in
// object_codec.h.
template <>
struct xsilo::Codec<std::vector<float>> {
  static Result<GatherList> Encode(const std::vector<float>& v) {
    GatherList g;
    g.Append(Buffer::CopyFrom(v.data(), v.size() * sizeof(float)));
    return g;
  }
  static Result<std::vector<float>> Decode(const Buffer& b) {
    if (b.size() % sizeof(float) != 0) return Corrupt("not a whole number of floats");
    std::vector<float> v(b.size() / sizeof(float));
    if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
    return v;
  }
};

namespace xsilo {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Remembers every key put or reserved through it and asks the connector
// which of them still exist: the ground truth for "the store is empty".
class LiveKeys final : public ConnectorWrapper {
 public:
  using Connector::Put;
  using ConnectorWrapper::ConnectorWrapper;
  Result<Key> Put(const GatherList& bytes) override {
    return Remember(ConnectorWrapper::Put(bytes));
  }
  Result<Key> NewKey() override { return Remember(ConnectorWrapper::NewKey()); }
  Result<std::vector<Key>> PutBatch(const std::vector<Buffer>& objects) override {
    return Connector::PutBatch(objects);  // one Put each, so each is remembered
  }

  std::vector<Key> keys() const {
    std::lock_guard<std::mutex> lock(mu_);
    return keys_;
  }
  // Keys the connector still holds (an Exists error counts as held).
  int Remaining() const {
    int held = 0;
    for (const Key& key : keys()) {
      Result<bool> exists = target()->Exists(key);
      if (!exists.ok() || *exists) ++held;
    }
    return held;
  }

 private:
  Result<Key> Remember(Result<Key> key) {
    if (key.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      keys_.push_back(*key);
    }
    return key;
  }

  mutable std::mutex mu_;
  std::vector<Key> keys_;
};

struct TestStore {
  std::shared_ptr<Store> store;
  LiveKeys* live = nullptr;
  std::string dir;  // the file connector's directory, else empty

  // Entries in the file connector's directory (objects and temporaries).
  int FilesLeft() const {
    if (dir.empty()) return 0;
    return static_cast<int>(std::distance(std::filesystem::directory_iterator(dir),
                                          std::filesystem::directory_iterator()));
  }
};

TestStore MakeTestStore(const std::string& kind) {
  ConnectorConfig config = testing::FreshConnectorConfig(kind);
  auto inner = MakeConnector(config);
  EXPECT_TRUE(inner.ok()) << inner.status().ToString();
  auto live = std::make_unique<LiveKeys>(std::shared_ptr<Connector>(std::move(inner).value()));
  TestStore t;
  t.live = live.get();
  if (kind == "file") t.dir = config.options.at("dir");
  t.store = *Store::Create("ex-" + kind + "-" + RandomObjectId().substr(0, 8), std::move(live));
  return t;
}

std::vector<float> Pattern(size_t floats, int seed) {
  std::vector<float> v(floats);
  for (size_t j = 0; j < floats; ++j) v[j] = static_cast<float>((seed * 31 + j) % 17);
  return v;
}

// ---- ThreadPool -------------------------------------------------------------

TEST(ExecutorThreadPool, RunsEveryTaskOnItsOwnThreadsAndDrainsAtShutdown) {
  ThreadPool pool(2);
  EXPECT_EQ(pool.threads(), 2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int> ran{0};
  constexpr int kTasks = 200;
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_TRUE(pool.Submit([&] {
                      std::lock_guard<std::mutex> lock(mu);
                      ids.insert(std::this_thread::get_id());
                      ++ran;
                    })
                    .ok());
  }
  pool.Shutdown();
  EXPECT_EQ(ran.load(), kTasks) << "Shutdown runs what was queued";
  EXPECT_LE(ids.size(), 2u) << "bounded: never more threads than asked for";
  EXPECT_EQ(ids.count(std::this_thread::get_id()), 0u);
  EXPECT_EQ(pool.Submit([] {}).code(), StatusCode::kFailedPrecondition);
}

TEST(ExecutorThreadPool, ATaskMayShutItsOwnPoolDown) {
  auto pool = std::make_shared<ThreadPool>(2);
  std::promise<void> returned;
  ASSERT_TRUE(pool->Submit([pool, &returned] {
                    pool->Shutdown();
                    returned.set_value();
                  })
                  .ok());
  pool.reset();  // the task may now hold the last reference
  EXPECT_EQ(returned.get_future().wait_for(seconds(60)), std::future_status::ready)
      << "Shutdown from a pool thread must not join that thread";
}

TEST(ExecutorPolicies, DecideBySizeTypeAndRole) {
  ProxyCandidate small{typeid(std::string), 99, false}, big{typeid(std::string), 100, false};
  EXPECT_FALSE(ProxySize(100)(small));
  EXPECT_TRUE(ProxySize(100)(big));
  EXPECT_TRUE(ProxyAlways()(small));
  EXPECT_FALSE(ProxyNever()(big));
  EXPECT_TRUE((ProxyType<Buffer, std::string>()(small)));
  EXPECT_FALSE(ProxyType<Buffer>()(small));
}

TEST(ExecutorArguments, AMoveOnlyArgumentWithoutCodecIsMovedIntoTheTask) {
  TestStore t = MakeTestStore("memory");
  StoreExecutor ex(std::make_shared<ThreadPool>(1), t.store, ProxyAlways());
  auto f = ex.Submit([](std::unique_ptr<int> p, const std::string& s) { return *p + s.size(); },
                     std::make_unique<int>(40), std::string("ab"));
  Result<uint64_t> r = f.Get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, 42u);
  EXPECT_EQ(ex.metrics().inline_arguments, 1u) << "the pointer";
  EXPECT_EQ(ex.metrics().proxied_arguments, 1u) << "the string (ProxyAlways)";
  EXPECT_EQ(t.live->Remaining(), 0);
}

// ---- StoreExecutor over each connector ---------------------------------------

class StoreExecutorTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StoreExecutorTest, ArgumentsAboveTheThresholdCrossAsProxiesOthersByValue) {
  TestStore t = MakeTestStore(GetParam());
  StoreExecutor ex(std::make_shared<ThreadPool>(2), t.store, ProxySize(4096));
  const std::string big(10000, 'b');
  auto f = ex.Submit(
      [](const std::string& b, const std::string& s, int n) {
        return static_cast<uint64_t>(std::count(b.begin(), b.end(), 'b')) + s.size() + n;
      },
      big, std::string("tiny"), 3);
  // The put happened on this thread, before Submit returned.
  EXPECT_EQ(t.store->metrics().put.count, 1u);
  EXPECT_EQ(t.store->metrics().put.max_bytes, big.size()) << "the one put is the big argument";
  Result<uint64_t> sum = f.Get();
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  EXPECT_EQ(*sum, 10000u + 4u + 3u);
  StoreMetrics m = t.store->metrics();
  EXPECT_EQ(m.put.count, 1u) << "a uint64_t result has no codec: it comes back by value";
  EXPECT_EQ(m.resolve.count, 1u) << "the task resolved exactly one proxy";
  ExecutorMetrics e = ex.metrics();
  EXPECT_EQ(e.proxied_arguments, 1u);
  EXPECT_EQ(e.inline_arguments, 2u);
  EXPECT_EQ(e.inline_results, 1u);

  // Below the threshold nothing touches the store.
  auto g =
      ex.Submit([](const std::string& s) { return s.substr(0, 3) + "!"; }, std::string(4095, 's'));
  ASSERT_TRUE(g.Get().ok());
  EXPECT_EQ(*g.Get(), "sss!");
  EXPECT_EQ(t.store->metrics().put.count, 1u);
  EXPECT_EQ(t.store->metrics().resolve.count, 1u);
  EXPECT_EQ(t.live->Remaining(), 0);
  EXPECT_EQ(t.FilesLeft(), 0);
}

TEST_P(StoreExecutorTest, LargeResultIsAProxyThatEvictsOnResolveSmallOneIsHeld) {
  TestStore t = MakeTestStore(GetParam());
  StoreExecutor ex(std::make_shared<ThreadPool>(2), t.store, ProxySize(1024));
  const std::string expected = "x" + std::string(5000, 'r');
  auto f =
      ex.Submit([](const std::string& s) { return s + std::string(5000, 'r'); }, std::string("x"));
  Result<Proxy<std::string>> proxy = f.GetProxy();
  ASSERT_TRUE(proxy.ok()) << proxy.status().ToString();
  ASSERT_TRUE(proxy->reference().has_value()) << "a stored result has a reference";
  Key key = proxy->reference()->key;
  EXPECT_EQ(t.store->metrics().put.count, 1u) << "the worker put the result, not the argument";
  EXPECT_FALSE(proxy->is_resolved());
  EXPECT_TRUE(*t.store->Exists(key));
  ASSERT_TRUE(proxy->Resolve().ok());
  EXPECT_FALSE(*t.store->Exists(key)) << "resolving evicts the result";
  EXPECT_EQ(**proxy->Get(), expected);
  EXPECT_EQ(*f.Get(), expected) << "the future shares the proxy's resolution";

  auto small = ex.Submit([](const std::string& s) { return s + "?"; }, std::string("y"));
  Result<Proxy<std::string>> held = small.GetProxy();
  ASSERT_TRUE(held.ok());
  EXPECT_FALSE(held->reference().has_value()) << "a small result is held, not stored";
  EXPECT_TRUE(held->is_resolved());
  EXPECT_EQ(**held->Get(), "y?");
  EXPECT_EQ(t.store->metrics().put.count, 1u);
  EXPECT_EQ(t.live->Remaining(), 0);
  EXPECT_EQ(t.FilesLeft(), 0);
}

TEST_P(StoreExecutorTest, AnUntakenResultIsEvictedWithItsLastFuture) {
  TestStore t = MakeTestStore(GetParam());
  StoreExecutor ex(std::make_shared<ThreadPool>(1), t.store, ProxyAlways());
  auto make = [&] { return ex.Submit([] { return std::string(2000, 'z'); }); };
  {
    TaskFuture<std::string> f = make();
    TaskFuture<std::string> copy = f;
    f.Wait();
    EXPECT_EQ(t.live->Remaining(), 1) << "the result waits in the store";
    f = TaskFuture<std::string>();
    EXPECT_EQ(t.live->Remaining(), 1) << "a copy still holds it";
  }
  EXPECT_EQ(t.live->Remaining(), 0) << "nobody can take it any more";

  // Dropped before the task ran: the worker evicts the result it made.
  std::vector<std::function<void()>> queued;
  StoreExecutor later(MakeTaskPool([&](std::function<void()> task) {
                        queued.push_back(std::move(task));
                        return Status::OK();
                      }),
                      t.store, ProxyAlways());
  later.Submit([] { return std::string(2000, 'w'); });  // the future is dropped at once
  ASSERT_EQ(queued.size(), 1u);
  queued[0]();
  EXPECT_EQ(t.store->metrics().put.count, 2u) << "the result was stored";
  EXPECT_EQ(t.live->Remaining(), 0) << "and evicted, since no future was left";

  // Handed out by GetProxy, it belongs to the proxy: it stays until resolved.
  std::optional<Proxy<std::string>> proxy;
  {
    TaskFuture<std::string> f = make();
    proxy.emplace(*f.GetProxy());
  }
  EXPECT_EQ(t.live->Remaining(), 1);
  StoreRegistry elsewhere;  // plays another process
  auto remote = Proxy<std::string>::Deserialize(*proxy->Serialize(), &elsewhere);
  ASSERT_TRUE(remote.ok());
  EXPECT_EQ(*remote->Extract(), std::string(2000, 'z'));
  EXPECT_EQ(t.live->Remaining(), 0);
  EXPECT_EQ(t.FilesLeft(), 0);
}

TEST_P(StoreExecutorTest, InputsAreEvictedWhenTheTaskThrowsOrFails) {
  TestStore t = MakeTestStore(GetParam());
  StoreExecutor ex(std::make_shared<ThreadPool>(2), t.store, ProxyAlways());
  const std::string big(3000, 'q');
  auto throws = ex.Submit(
      [](const std::string&) -> std::string { throw std::runtime_error("boom in the task"); }, big);
  auto status = ex.Submit([](const std::string&) { return Unavailable("service down"); }, big);
  auto result =
      ex.Submit([](const std::string&) -> Result<std::string> { return NotFound("no row"); }, big);

  Result<std::string> r1 = throws.Get();
  EXPECT_EQ(r1.status().code(), StatusCode::kInternal);
  EXPECT_NE(r1.status().message().find("boom in the task"), std::string::npos)
      << r1.status().ToString();
  Status r2 = status.Get();
  EXPECT_EQ(r2.code(), StatusCode::kUnavailable);
  EXPECT_EQ(r2.message(), "service down");
  Result<std::string> r3 = result.Get();
  EXPECT_EQ(r3.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r3.status().message(), "no row");

  EXPECT_EQ(t.store->metrics().put.count, 3u) << "the three inputs went through the store";
  EXPECT_EQ(t.live->keys().size(), 3u);
  EXPECT_EQ(t.live->Remaining(), 0) << "and all three are gone";
  EXPECT_EQ(t.FilesLeft(), 0);
  EXPECT_EQ(ex.metrics().failed, 3u);
  EXPECT_EQ(ex.metrics().evict_errors, 0u);
}

TEST_P(StoreExecutorTest, InputsLiveUntilTheirTaskHasRun) {
  TestStore t = MakeTestStore(GetParam());
  // A pool that runs tasks when the test says so.
  std::vector<std::function<void()>> queued;
  auto manual = MakeTaskPool([&](std::function<void()> task) {
    queued.push_back(std::move(task));
    return Status::OK();
  });
  StoreExecutor ex(manual, t.store, ProxyAlways());
  auto f = ex.Submit([](const std::string& s) { return s.size(); }, std::string(100, 'a'));
  auto g = ex.Submit([](const std::string& s) { return s.size(); }, std::string(200, 'b'));
  ASSERT_EQ(queued.size(), 2u);
  EXPECT_FALSE(f.Ready());
  EXPECT_EQ(t.live->Remaining(), 2) << "stored inputs wait for their tasks";
  queued[0]();
  ASSERT_TRUE(f.Ready()) << "the task ran on this thread";
  EXPECT_EQ(*f.Get(), 100u);
  EXPECT_EQ(t.live->Remaining(), 1) << "only the finished task's input is gone";

  // An input that vanished before its task ran: the resolve error, with
  // the argument named.
  ASSERT_TRUE(t.store->Evict(t.live->keys()[1]).ok());
  queued[1]();
  Result<uint64_t> lost = g.Get();
  EXPECT_EQ(lost.status().code(), StatusCode::kNotFound);
  EXPECT_NE(lost.status().message().find("resolving argument 0"), std::string::npos)
      << lost.status().ToString();
  queued.clear();
  EXPECT_EQ(t.live->Remaining(), 0);
}

TEST_P(StoreExecutorTest, APoolThatRefusesOrDropsATaskFailsItsFutureAndFreesItsInputs) {
  TestStore t = MakeTestStore(GetParam());
  auto refusing =
      MakeTaskPool([](std::function<void()>) -> Status { return ResourceExhausted("queue full"); });
  StoreExecutor refused(refusing, t.store, ProxyAlways());
  auto f = refused.Submit([](const std::string& s) { return s; }, std::string(500, 'r'));
  ASSERT_TRUE(f.Ready());
  EXPECT_EQ(f.Get().status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(f.Get().status().message().find("queue full"), std::string::npos);

  auto dropping = MakeTaskPool([](std::function<void()> task) {
    task = nullptr;  // accepted, then lost without running
    return Status::OK();
  });
  StoreExecutor dropped(dropping, t.store, ProxyAlways());
  auto g = dropped.Submit([](const std::string& s) { return s; }, std::string(500, 'd'));
  ASSERT_TRUE(g.Ready());
  EXPECT_EQ(g.Get().status().code(), StatusCode::kCancelled);

  EXPECT_EQ(t.store->metrics().put.count, 2u);
  EXPECT_EQ(t.live->Remaining(), 0);
  EXPECT_EQ(t.FilesLeft(), 0);
}

TEST_P(StoreExecutorTest, AClosedStoreFailsTheFutureWithAClearError) {
  TestStore t = MakeTestStore(GetParam());
  StoreExecutor ex(std::make_shared<ThreadPool>(2), t.store, ProxySize(1024));
  t.store->Close();
  auto f = ex.Submit([](const std::string& s) { return s.size(); }, std::string(5000, 'c'));
  Result<uint64_t> r = f.Get();
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("storing argument 0"), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("is closed"), std::string::npos) << r.status().ToString();

  // Closed while the task runs: the large result cannot be stored.
  TestStore u = MakeTestStore(GetParam());
  StoreExecutor late(std::make_shared<ThreadPool>(1), u.store, ProxySize(1024));
  auto g = late.Submit(
      [store = u.store](const std::string& s) {
        store->Close();
        return s + std::string(5000, '!');
      },
      std::string("small"));
  Result<std::string> rg = g.Get();
  EXPECT_EQ(rg.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(rg.status().message().find("storing the result"), std::string::npos)
      << rg.status().ToString();
  EXPECT_EQ(t.FilesLeft(), 0);
  EXPECT_EQ(u.FilesLeft(), 0);
}

TEST_P(StoreExecutorTest, MapReduceOf64MiBVectorsOnTwoThreads) {
  TestStore t = MakeTestStore(GetParam());
  constexpr int kTasks = 64;
  constexpr size_t kFloats = (1 << 20) / sizeof(float);  // 1 MiB each
  StoreExecutor ex(std::make_shared<ThreadPool>(2), t.store, ProxySize(64 << 10));
  std::vector<TaskFuture<std::vector<float>>> futures;
  for (int i = 0; i < kTasks; ++i) {
    futures.push_back(ex.Submit(
        [](const std::vector<float>& v) {
          std::vector<float> squares(v.size());
          for (size_t j = 0; j < v.size(); ++j) squares[j] = v[j] * v[j];
          return squares;
        },
        Pattern(kFloats, i)));
  }
  std::vector<float> total(kFloats, 0.0f);
  for (auto& f : futures) {
    Result<std::vector<float>> squares = f.Get();
    ASSERT_TRUE(squares.ok()) << squares.status().ToString();
    ASSERT_EQ(squares->size(), kFloats);
    for (size_t j = 0; j < kFloats; ++j) total[j] += (*squares)[j];
  }
  // Every term is a small integer, so the float sums are exact.
  for (size_t j = 0; j < kFloats; ++j) {
    double expected = 0;
    for (int i = 0; i < kTasks; ++i) {
      double x = static_cast<double>((i * 31 + j) % 17);
      expected += x * x;
    }
    ASSERT_EQ(total[j], static_cast<float>(expected)) << "element " << j;
  }
  EXPECT_EQ(t.store->metrics().put.count, 2u * kTasks) << "every input and every result";
  ExecutorMetrics e = ex.metrics();
  EXPECT_EQ(e.proxied_arguments, static_cast<uint64_t>(kTasks));
  EXPECT_EQ(e.proxied_results, static_cast<uint64_t>(kTasks));
  EXPECT_EQ(e.failed, 0u);
  EXPECT_EQ(t.live->keys().size(), 2u * kTasks);
  EXPECT_EQ(t.live->Remaining(), 0) << "the store is empty after the tasks";
  EXPECT_EQ(t.FilesLeft(), 0);
}

INSTANTIATE_TEST_SUITE_P(Connectors, StoreExecutorTest,
                         ::testing::Values("memory", "file", "redis"),
                         [](const auto& info) { return info.param; });

// ---- the serialized form ----------------------------------------------------

std::string LabelSum(const std::vector<float>& v, const std::string& label) {
  double sum = 0;
  for (float x : v) sum += x;
  return label + "=" + std::to_string(static_cast<uint64_t>(sum));
}

// Functions a worker process knows by name (the spawned child uses the same
// registry).
TaskRegistry& TestFunctions() {
  static TaskRegistry* functions = [] {
    auto* r = new TaskRegistry;
    (void)r->Register("label_sum", &LabelSum);
    (void)r->Register("refuse", [](const std::string&) { return PermissionDenied("not yours"); });
    (void)r->Register("throw", [](const std::string&) -> Result<std::string> {
      throw std::runtime_error("worker blew up");
    });
    return r;
  }();
  return *functions;
}

TEST(ExecutorTaskRegistry, RefusesATakenName) {
  TaskRegistry r;
  EXPECT_TRUE(r.Register("f", [](const std::string& s) { return s; }).ok());
  EXPECT_EQ(r.Register("f", [](const std::string& s) { return s; }).code(),
            StatusCode::kAlreadyExists);
  EXPECT_NE(r.Find("f"), nullptr);
  EXPECT_EQ(r.Find("g"), nullptr);
}

class ExecutorRemoteTask : public ::testing::TestWithParam<std::string> {};

// A fresh StoreRegistry plays the worker process: it rebuilds the store from
// the task's text.
TEST_P(ExecutorRemoteTask, RunsFromItsTextAndTheSubmitterFreesEverything) {
  TestStore t = MakeTestStore(GetParam());
  StoreExecutor ex(nullptr, t.store, ProxySize(1024));
  std::vector<float> v = Pattern(100000, 5);
  auto task = ex.Describe<std::string>("label_sum", v, std::string("sum"));
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  EXPECT_EQ(t.store->metrics().put.count, 1u) << "the vector is stored, the label inlined";
  EXPECT_EQ(task->Await(milliseconds(0)).status().code(), StatusCode::kTimeout);
  EXPECT_EQ(t.live->Remaining(), 1) << "a timed-out Await frees nothing";

  StoreRegistry worker;
  auto parsed = SerializedTask::Deserialize(task->Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_TRUE(parsed->Run(TestFunctions(), &worker).ok());
  EXPECT_EQ(worker.Names(), std::vector<std::string>{t.store->name()});
  EXPECT_EQ(t.live->Remaining(), 1) << "the worker evicted the argument and set the result";

  Result<std::string> r = task->Await(seconds(60));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, LabelSum(v, "sum"));
  EXPECT_EQ(t.live->Remaining(), 0);
  EXPECT_EQ(t.FilesLeft(), 0);
  EXPECT_EQ(task->Await(seconds(1)).status().code(), StatusCode::kFailedPrecondition);
}

TEST_P(ExecutorRemoteTask, TheWorkersErrorsReachTheSubmitter) {
  TestStore t = MakeTestStore(GetParam());
  StoreExecutor ex(nullptr, t.store, ProxyAlways());
  StoreRegistry worker;
  auto run = [&](auto& task) {
    auto parsed = SerializedTask::Deserialize(task.Serialize());
    ASSERT_TRUE(parsed.ok());
    EXPECT_TRUE(parsed->Run(TestFunctions(), &worker).ok()) << "the error is delivered";
  };

  auto refused = ex.Describe<void>("refuse", std::string("x"));
  ASSERT_TRUE(refused.ok());
  run(*refused);
  Status s = refused->Await(seconds(60));
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("not yours"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("task 'refuse'"), std::string::npos) << s.ToString();

  auto threw = ex.Describe<std::string>("throw", std::string("x"));
  ASSERT_TRUE(threw.ok());
  run(*threw);
  Result<std::string> r = threw->Await(seconds(60));
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("worker blew up"), std::string::npos);

  auto unknown = ex.Describe<std::string>("no_such_function", std::string("x"));
  ASSERT_TRUE(unknown.ok());
  run(*unknown);
  r = unknown->Await(seconds(60));
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("no_such_function"), std::string::npos);

  auto wrong_arity = ex.Describe<std::string>("label_sum", std::string("x"));
  ASSERT_TRUE(wrong_arity.ok());
  run(*wrong_arity);
  EXPECT_EQ(wrong_arity->Await(seconds(60)).status().code(), StatusCode::kInvalidArgument);

  EXPECT_EQ(t.live->keys().size(), 8u) << "four stored arguments, four result keys";
  EXPECT_EQ(t.live->Remaining(), 0) << "arguments and results of failed tasks are freed too";
  EXPECT_EQ(t.FilesLeft(), 0);
}

TEST_P(ExecutorRemoteTask, AnAbandonedTaskFreesItsObjects) {
  TestStore t = MakeTestStore(GetParam());
  StoreExecutor ex(nullptr, t.store, ProxyAlways());
  {
    auto task = ex.Describe<std::string>("label_sum", Pattern(1000, 1), std::string("l"));
    ASSERT_TRUE(task.ok());
    EXPECT_EQ(t.live->Remaining(), 2) << "both arguments stored";
  }
  EXPECT_EQ(t.live->Remaining(), 0);
  EXPECT_EQ(t.FilesLeft(), 0);
}

INSTANTIATE_TEST_SUITE_P(Connectors, ExecutorRemoteTask,
                         ::testing::Values("memory", "file", "redis"),
                         [](const auto& info) { return info.param; });

// A child process (this binary, spawned fresh: an empty StoreRegistry and
// none of the parent's memory) runs the task from its text alone.
class ExecutorCrossProcess : public ::testing::TestWithParam<std::string> {};

TEST_P(ExecutorCrossProcess, TenMiBArgumentSerializesSmallAndRunsInAChild) {
  TestStore t = MakeTestStore(GetParam());
  StoreExecutor ex(nullptr, t.store, ProxySize(64 << 10));
  std::vector<float> v = Pattern((10 << 20) / sizeof(float), 9);  // 10 MiB
  auto task = ex.Describe<std::string>("label_sum", v, std::string("total"));
  ASSERT_TRUE(task.ok()) << task.status().ToString();
  std::string text = task->Serialize();
  EXPECT_LT(text.size(), 1024u) << text;
  EXPECT_NE(text.find(t.store->name()), std::string::npos) << "names the store";

  int pid = testing::SpawnStoreChild("executor-run", text);
  ASSERT_GT(pid, 0);
  Result<std::string> r = task->Await(seconds(60));
  EXPECT_EQ(testing::WaitChild(pid), 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, LabelSum(v, "total"));
  EXPECT_EQ(t.live->Remaining(), 0);
  EXPECT_EQ(t.FilesLeft(), 0);
}

INSTANTIATE_TEST_SUITE_P(Connectors, ExecutorCrossProcess, ::testing::Values("file", "redis"),
                         [](const auto& info) { return info.param; });

}  // namespace

namespace testing {

// Child side of ExecutorCrossProcess: exit 0 when the task ran and its outcome
// was delivered, from a registry that had no store before.
bool RunExecutorChildIfRequested(int* exit_code) {
  std::optional<StoreChildRequest> request = RequestedStoreChild();
  if (!request || request->mode != "executor-run") return false;
  if (!StoreRegistry::Global().Names().empty()) return *exit_code = 2, true;
  auto task = SerializedTask::Deserialize(request->arg);
  if (!task.ok()) return *exit_code = ChildExitCode(task.status()), true;
  *exit_code = ChildExitCode(task->Run(TestFunctions()));
  return true;
}

}  // namespace testing
}  // namespace xsilo
