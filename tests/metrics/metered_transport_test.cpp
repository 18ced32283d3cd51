#include "xsilo/metrics/metered_transport.h"

#include <gtest/gtest.h>

#include <future>

#include "metrics/http_get.h"
#include "xsilo/transport/registry.h"

namespace xsilo::metrics {
namespace {

using namespace std::chrono_literals;
using testing::SeriesValue;

TensorMap Payload(size_t bytes) {
  TensorMap m;
  m["w"] = Tensor::Zeros(DType::kU8, {static_cast<int64_t>(bytes)}).value();
  return m;
}

std::unique_ptr<Transport> Inproc(int32_t rank, int32_t world, const std::string& fabric) {
  TransportOptions o;
  o.rank = rank;
  o.world_size = world;
  o.address = fabric;
  auto t = TransportRegistry::Global().Create("inproc", o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

std::string Series(const std::string& name, const std::string& party, int peer,
                   const std::string& route = "inproc") {
  return name + "{party=\"" + party + "\",peer=\"" + std::to_string(peer) + "\",route=\"" + route +
         "\"}";
}

TEST(MeteredTransport, CountsBroadcastsSendsAndReceivesPerPeer) {
  Registry reg;
  auto server = MakeMeteredTransport(Inproc(0, 3, "metered-test"), reg, {.party = "server"});
  auto c1 = MakeMeteredTransport(Inproc(1, 3, "metered-test"), reg, {.party = "client 1"});
  auto c2 = Inproc(2, 3, "metered-test");  // not metered
  EXPECT_EQ(server->name(), "inproc");
  EXPECT_EQ(server->rank(), 0);
  EXPECT_EQ(server->world_size(), 3);
  std::vector<std::future<Status>> starts;
  for (Transport* t : {server.get(), c1.get(), c2.get()}) {
    starts.push_back(std::async(std::launch::async, [t] { return t->Start(); }));
  }
  for (auto& f : starts) ASSERT_TRUE(f.get().ok());

  Message model;
  model.type = "test.model";
  model.tensors = Payload(1000);
  ASSERT_TRUE(server->Broadcast({1, 2}, model, 10s).ok());
  Message extra;
  extra.type = "test.extra";
  extra.tensors = Payload(10);
  ASSERT_TRUE(server->Send(2, extra, 10s).ok());

  auto got1 = c1->Receive(10s);
  ASSERT_TRUE(got1.ok());
  EXPECT_EQ(got1->payload_bytes(), 1000u);
  Message update;
  update.type = "test.update";
  update.tensors = Payload(300);
  ASSERT_TRUE(c1->Send(0, update, 10s).ok());
  auto got0 = server->Receive(10s);
  ASSERT_TRUE(got0.ok());
  EXPECT_EQ(got0->sender, 1);
  EXPECT_EQ(got0->payload_bytes(), 300u);

  const std::string text = reg.Render();
  EXPECT_EQ(SeriesValue(text, Series("xsilo_transport_sent_bytes_total", "server", 1)), 1000);
  EXPECT_EQ(SeriesValue(text, Series("xsilo_transport_sent_bytes_total", "server", 2)), 1010);
  EXPECT_EQ(SeriesValue(text, Series("xsilo_transport_sent_messages_total", "server", 2)), 2);
  EXPECT_EQ(SeriesValue(text, Series("xsilo_transport_send_errors_total", "server", 1)), 0);
  EXPECT_EQ(SeriesValue(text, Series("xsilo_transport_received_bytes_total", "client 1", 0)), 1000);
  EXPECT_EQ(SeriesValue(text, Series("xsilo_transport_sent_bytes_total", "client 1", 0)), 300);
  EXPECT_EQ(SeriesValue(text, Series("xsilo_transport_received_bytes_total", "server", 1)), 300);
  EXPECT_EQ(SeriesValue(text, Series("xsilo_transport_received_messages_total", "server", 1)), 1);
  EXPECT_GE(SeriesValue(text, Series("xsilo_transport_send_seconds_total", "server", 1)), 0);

  // A send to a rank outside the world fails and is counted as an error.
  EXPECT_FALSE(server->Send(7, extra, 10s).ok());
  EXPECT_EQ(SeriesValue(reg.Render(), Series("xsilo_transport_send_errors_total", "server", 7)), 1);

  c1->Stop();
  c2->Stop();
  server->Stop();
  server->Stop();  // idempotent
  EXPECT_FALSE(server->Receive(10ms).ok());
}

}  // namespace
}  // namespace xsilo::metrics
