// The hole-punched path on its own: two ICE agents in one process, the
// relay's UDP port as their STUN server, a byte stream both ways.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "endpoint/endpoint_test_util.h"
#include "endpoint/punch.h"
#include "net/socket.h"
#include "transport/test_util.h"

namespace xsilo::testing {
namespace {

using endpoint::PunchedPath;
using endpoint::PunchOptions;

PunchOptions Options(const endpoint::Relay& relay, bool controlling) {
  PunchOptions o;
  o.stun_host = "127.0.0.1";
  o.stun_port = relay.port();
  o.controlling = controlling;
  return o;
}

TEST(Punch, TwoAgentsCarryAStreamBothWays) {
  std::string ca;
  auto relay = StartRelay({}, &ca);
  auto a = PunchedPath::Gather(Options(*relay, true));
  auto b = PunchedPath::Gather(Options(*relay, false));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_LT((*a)->description().size(), 3000u);
  Result<int> fb = Unavailable("not run");
  std::thread tb([&] { fb = (*b)->Connect((*a)->description()); });
  auto fa = (*a)->Connect((*b)->description());
  tb.join();
  ASSERT_TRUE(fa.ok()) << fa.status().ToString();
  ASSERT_TRUE(fb.ok()) << fb.status().ToString();
  Buffer object = PatternTensor(8ull << 20, 5).data;
  std::thread writer([&] {
    EXPECT_TRUE(net::SendAll(*fb, object.data(), object.size()).ok());
    ::shutdown(*fb, SHUT_WR);
  });
  std::string got(object.size(), '\0');
  ASSERT_TRUE(net::RecvExact(*fa, got.data(), got.size()).ok());
  writer.join();
  EXPECT_EQ(
      Checksum(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(got.data()), got.size())),
      Checksum(object.span()));
  ::close(*fa);
  ::close(*fb);
}

TEST(Punch, ABadDescriptionIsRefused) {
  std::string ca;
  auto relay = StartRelay({}, &ca);
  auto a = PunchedPath::Gather(Options(*relay, true));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->Connect("zz").status().code(), StatusCode::kInvalidArgument);
}

// The peer gathered and handed out its description, then never ran its
// checks (it went away): the error says how far ICE got, so a failure seen
// once in a long run can be told apart from a lost handshake.
TEST(Punch, APeerThatNeverAnswersFailsWithWhatTheAgentDid) {
  std::string ca;
  auto relay = StartRelay({}, &ca);
  auto a_options = Options(*relay, true);
  a_options.connect_timeout = std::chrono::milliseconds(1500);
  auto a = PunchedPath::Gather(a_options);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::string silent;
  {
    auto b = PunchedPath::Gather(Options(*relay, false));
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    silent = (*b)->description();
  }
  auto fa = (*a)->Connect(silent);
  ASSERT_FALSE(fa.ok());
  EXPECT_EQ(fa.status().code(), StatusCode::kUnavailable);
  const std::string m = fa.status().message();
  EXPECT_NE(m.find("states: "), std::string::npos) << m;
  EXPECT_NE(m.find("selected pair: none"), std::string::npos) << m;
  EXPECT_NE(m.find("reflexive candidate here: "), std::string::npos) << m;
}

}  // namespace
}  // namespace xsilo::testing
