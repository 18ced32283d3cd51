// Every decorator keeps every capability of what it wraps (capabilities.h):
// over a transport without capabilities it has none, over one with them
// it has them too and they reach the inner transport's, for each decorator
// (compression, metrics, faults) alone and stacked, over a fake inner
// transport and over the hybrid backends that have them for real.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "transport/builtin.h"
#include "transport/faulty/faulty.h"
#include "transport/test_util.h"
#include "xsilo/core/encode_stream.h"
#include "xsilo/metrics/metered_transport.h"
#include "xsilo/metrics/metrics.h"
#include "xsilo/transport/compression.h"
#include "xsilo/transport/forwarding.h"
#include "xsilo/transport/registry.h"

namespace xsilo {
namespace {

using namespace std::chrono_literals;

// An inner transport with both capabilities: given link figures, and
// streamed sends to rank 1 that go, once finished, as ordinary sends.
class Capable final : public ForwardingTransport, public LinkObserver, public StreamSink {
 public:
  explicit Capable(std::unique_ptr<Transport> inner) : ForwardingTransport(std::move(inner)) {}
  ~Capable() override {
    Stop();
    for (auto& t : threads_) t.join();
  }
  LinkObserver* link_observer() override { return this; }
  StreamSink* stream_sink() override { return this; }

  double MeasuredGoodputBps(int32_t peer) override { return peer == 1 ? 4.5e6 : 0; }
  double MeasuredRttS(int32_t peer) override { return peer == 1 ? 0.123 : -1; }
  void LearnLink(const std::vector<int32_t>&, uint64_t) override { ++learned; }
  std::string RouteReason() const override { return "fake: why"; }
  bool StreamsSends(int32_t peer) override { return peer == 1; }
  void SendStreamAsync(int32_t peer, std::shared_ptr<EncodeStream> stream,
                       SendCallback done) override {
    ++streamed;
    threads_.emplace_back([this, peer, stream, done = std::move(done)] {
      auto m = stream->TakeMessage();
      if (!m.ok()) return done(m.status());
      inner().SendAsync(peer, std::move(m).value(), done);
    });
  }

  std::atomic<int> learned{0}, streamed{0};

 private:
  std::vector<std::thread> threads_;
};

struct Decorator {
  std::string name;
  std::function<std::unique_ptr<Transport>(std::unique_ptr<Transport>)> wrap;
};

metrics::Registry& Metrics() {
  static metrics::Registry* r = new metrics::Registry();
  return *r;
}

std::unique_ptr<Transport> Compress(std::unique_ptr<Transport> t) {
  TransportOptions o;
  o.backend = {{"compression", "lossless"}};
  CompressionPolicy policy;
  TransportOptions rest;
  EXPECT_TRUE(ParseCompressionOptions(o, &policy, &rest).ok());
  return MakeCompressingTransport(std::move(t), policy);
}

std::unique_ptr<Transport> Meter(std::unique_ptr<Transport> t) {
  return metrics::MakeMeteredTransport(std::move(t), Metrics(), {});
}

std::unique_ptr<Transport> Fault(std::unique_ptr<Transport> t) {
  TransportOptions o;
  o.rank = t->rank();
  o.world_size = t->world_size();
  o.address = t->options().address;
  o.backend = {{"fault.seed", "1"}};  // every rate 0: every draw clean
  auto f = MakeFaultyTransport(std::move(t), o);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return std::move(f).value();
}

std::vector<Decorator> Decorators() {
  return {
      {"compress", Compress},
      {"metered", Meter},
      {"faulty", Fault},
      {"metered(compress(faulty))",
       [](std::unique_ptr<Transport> t) { return Meter(Compress(Fault(std::move(t)))); }},
  };
}

TransportOptions Inproc(const std::string& fabric, int32_t rank) {
  TransportOptions o;
  o.rank = rank;
  o.world_size = 2;
  o.address = fabric;
  return o;
}

TEST(Capabilities, ADecoratorOverATransportWithoutThemHasNone) {
  for (const Decorator& d : Decorators()) {
    SCOPED_TRACE(d.name);
    auto inner = TransportRegistry::Global().Create("inproc", Inproc("caps-none-" + d.name, 0));
    ASSERT_TRUE(inner.ok()) << inner.status().ToString();
    ASSERT_EQ((*inner)->link_observer(), nullptr);
    ASSERT_EQ((*inner)->stream_sink(), nullptr);
    std::unique_ptr<Transport> t = d.wrap(std::move(inner).value());
    EXPECT_EQ(t->link_observer(), nullptr);
    EXPECT_EQ(t->stream_sink(), nullptr);
  }
}

TEST(Capabilities, ADecoratorKeepsEveryCapabilityOfItsInnerTransport) {
  for (const Decorator& d : Decorators()) {
    SCOPED_TRACE(d.name);
    const std::string fabric = "caps-fake-" + d.name;
    auto inner = TransportRegistry::Global().Create("inproc", Inproc(fabric, 0));
    ASSERT_TRUE(inner.ok()) << inner.status().ToString();
    auto capable = std::make_unique<Capable>(std::move(inner).value());
    Capable* fake = capable.get();
    std::unique_ptr<Transport> t = d.wrap(std::move(capable));
    auto receiver = TransportRegistry::Global().Create("inproc", Inproc(fabric, 1));
    ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();

    LinkObserver* observer = t->link_observer();
    ASSERT_NE(observer, nullptr);
    EXPECT_EQ(observer->MeasuredGoodputBps(1), 4.5e6);
    EXPECT_EQ(observer->MeasuredRttS(1), 0.123);
    EXPECT_LT(observer->MeasuredRttS(0), 0);
    EXPECT_EQ(observer->RouteReason(), "fake: why");
    observer->LearnLink({1}, 1 << 20);
    EXPECT_EQ(fake->learned.load(), 1);

    StreamSink* sink = t->stream_sink();
    ASSERT_NE(sink, nullptr);
    EXPECT_TRUE(sink->StreamsSends(1));
    EXPECT_FALSE(sink->StreamsSends(0));

    auto started = std::async(std::launch::async, [&] { return t->Start(); });
    ASSERT_TRUE((*receiver)->Start().ok());
    ASSERT_TRUE(started.get().ok());
    Message m = testing::PatternMessage(1 << 20, 5);
    m.type = "caps";
    auto stream = std::make_shared<EncodeStream>(m.payload_bytes());
    std::promise<Status> done;
    sink->SendStreamAsync(1, stream, [&](const Status& s) { done.set_value(s); });
    stream->Finish(m);
    auto f = done.get_future();
    ASSERT_EQ(f.wait_for(60s), std::future_status::ready);
    EXPECT_TRUE(f.get().ok());
    EXPECT_EQ(fake->streamed.load(), 1) << "the streamed send did not reach the inner sink";
    auto got = (*receiver)->Receive(60s);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->type, "caps");
    EXPECT_TRUE(testing::PatternIntact(*got));
    t->Stop();
    (*receiver)->Stop();
  }
}

// The hybrid backends have both capabilities for real; each decorator over
// each of them hands out the hybrid's own.
TEST(Capabilities, ADecoratorOverAHybridBackendKeepsItsCapabilities) {
  for (const std::string backend : {"inproc+memory", "auto+memory"}) {
    for (const Decorator& d : Decorators()) {
      SCOPED_TRACE(backend + " under " + d.name);
      auto inner =
          TransportRegistry::Global().Create(backend, Inproc("caps-hybrid-" + backend + d.name, 0));
      ASSERT_TRUE(inner.ok()) << inner.status().ToString();
      LinkObserver* observer = (*inner)->link_observer();
      StreamSink* sink = (*inner)->stream_sink();
      ASSERT_NE(observer, nullptr);
      ASSERT_NE(sink, nullptr);
      std::unique_ptr<Transport> t = d.wrap(std::move(inner).value());
      EXPECT_EQ(t->link_observer(), observer);
      ASSERT_NE(t->stream_sink(), nullptr);
      // Metrics and faults keep a sink of their own (they count and draw
      // streamed sends); it answers as the hybrid's does.
      EXPECT_EQ(t->stream_sink()->StreamsSends(1), sink->StreamsSends(1));
    }
  }
}

// A key of another layer than the backend's own names the layer it belongs
// to; a misspelt key of a composite names the nearest of all its layers'.
TEST(BackendKeys, AKeyOfAnotherLayerNamesThatLayer) {
  struct Case {
    std::string backend, key, says;
  };
  for (const Case& c :
       {Case{"grpc", "threshold", "hybrid's"}, Case{"grpc", "fault.fail", "fault injection's"},
        Case{"grpc", "inline_bytes", "is mpi's, not grpc's"},
        Case{"inproc", "store.bucket", "connector's"},
        Case{"inproc+memory", "treshold", "did you mean 'threshold'?"}}) {
    SCOPED_TRACE(c.backend + " " + c.key);
    TransportOptions o;
    o.world_size = 2;
    o.address = c.backend == "grpc" ? "127.0.0.1:1" : "misplaced-key";
    o.backend[c.key] = "1";
    auto r = TransportRegistry::Global().Create(c.backend, o);
    ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace xsilo
