// mode=unary, the single-call-per-message baseline.
#include <gtest/gtest.h>

#include <chrono>

#include "transport/test_util.h"
#include "xsilo/transport/registry.h"

namespace xsilo::testing {
namespace {

using namespace std::chrono_literals;

TEST(GrpcUnary, MessagesTravelBothWaysInOrder) {
  const int port = FreeTcpPort(3);  // rank r listens at port + r
  std::vector<std::unique_ptr<Transport>> world;
  for (int r = 0; r < 3; ++r) {
    TransportOptions o;
    o.rank = r;
    o.world_size = 3;
    o.address = "127.0.0.1:" + std::to_string(port);
    o.backend = {{"mode", "unary"}};
    auto t = TransportRegistry::Global().Create("grpc", o);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_TRUE((*t)->Start().ok());
    world.push_back(std::move(t).value());
  }
  for (int i = 0; i < 5; ++i)
    world[1]->SendAsync(0, PatternMessage(1000 + i, i, i), [](const Status&) {});
  for (int i = 0; i < 5; ++i) {
    auto r = world[0]->Receive(30s);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->round, i);
    EXPECT_EQ(r->sender, 1);
    EXPECT_TRUE(PatternIntact(*r));
  }
  ASSERT_TRUE(world[0]->Broadcast({1, 2}, PatternMessage(8 << 20, 9, 9), 60s).ok());
  for (int r = 1; r <= 2; ++r) {
    auto m = world[r]->Receive(30s);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_TRUE(PatternIntact(*m));
  }
  EXPECT_EQ(world[1]->Send(2, PatternMessage(1, 1), 5s).code(), StatusCode::kInvalidArgument);
  for (auto& t : world) t->Stop();
}

}  // namespace
}  // namespace xsilo::testing
