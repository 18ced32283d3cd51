// Failures in the middle of a transfer, reached by handshakes (a hook that
// holds the sender after N bytes), not by timing: the owner endpoint dies
// and restarts, the relay dies. The get in flight fails with Unavailable,
// never with a truncated object, and the requesting side keeps nothing.
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "endpoint/endpoint_test_util.h"
#include "transport/test_util.h"

namespace xsilo::testing {
namespace {

using endpoint::Path;
constexpr uint64_t kBig = 64ull << 20;

// Holds the first sender that passes `at` bytes until Open(), and tells the
// test it is there.
class Gate {
 public:
  explicit Gate(uint64_t at) : at_(at) {}
  void Pass(uint64_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    if (fired_ || bytes < at_) return;
    fired_ = true;
    cv_.notify_all();
    cv_.wait_for(lock, std::chrono::seconds(120), [&] { return open_; });
  }
  bool WaitReached() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(120), [&] { return fired_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  const uint64_t at_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool fired_ = false, open_ = false;
};

TEST(EndpointFailure, OwnerRestartedMidTransferFailsTheGetAndARetryAfterRestartSucceeds) {
  std::string ca;
  auto relay = StartRelay({}, &ca);
  endpoint::EndpointOptions o;
  o.relay = "127.0.0.1:" + std::to_string(relay->port());
  o.relay_ca = ca;
  o.punch = false;  // the relay's cases: no hole-punched path on loopback
  auto a = StartEndpoint(o);
  endpoint::EndpointOptions bo = o;
  bo.peer_listen = "127.0.0.1:0";
  bo.dir = TempDir("endpoint-restart");
  auto gate = std::make_shared<Gate>(8 << 20);
  bo.on_peer_send = [gate](uint64_t sent) { gate->Pass(sent); };
  auto b = StartEndpoint(bo);
  const std::string b_uuid = b->uuid();

  Buffer big = PatternTensor(kBig, 9).data;
  auto key = ConnectorFor(*b)->Put(big);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto via_a = ConnectorFor(*a);

  Result<std::optional<Buffer>> got = std::optional<Buffer>();
  std::thread reader([&] { got = via_a->Get(*key); });
  ASSERT_TRUE(gate->WaitReached());
  b->Abort();  // the owner dies with 8 MiB of 64 sent
  gate->Open();
  reader.join();
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  EXPECT_EQ(a->table().objects(), 0u);
  b.reset();

  bo.on_peer_send = nullptr;
  b = StartEndpoint(bo);  // same directory: same uuid, same certificate, same objects
  ASSERT_EQ(b->uuid(), b_uuid);
  ASSERT_TRUE(b->registered());
  got = via_a->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ(Checksum((*got)->span()), Checksum(big.span()));
  EXPECT_EQ(a->served(Path::kDirect), 1u);
  b.reset();
  std::filesystem::remove_all(bo.dir);
}

TEST(EndpointFailure, RelayDyingMidRelayedTransferIsUnavailableAndLeavesNoPartialObject) {
  std::string ca;
  auto gate = std::make_shared<Gate>(8 << 20);
  endpoint::RelayOptions ro;
  ro.on_pipe_progress = [gate](uint64_t forwarded) { gate->Pass(forwarded); };
  auto relay = StartRelay(ro, &ca);
  endpoint::EndpointOptions o;
  o.relay = "127.0.0.1:" + std::to_string(relay->port());
  o.relay_ca = ca;
  o.punch = false;  // the relay's cases: no hole-punched path on loopback
  auto a = StartEndpoint(o);
  auto b = StartEndpoint(o);  // no peer listener: only the relay reaches it

  Buffer big = PatternTensor(kBig, 10).data;
  auto via_b = ConnectorFor(*b);
  auto key = via_b->Put(big);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto via_a = ConnectorFor(*a);

  Result<std::optional<Buffer>> got = std::optional<Buffer>();
  std::thread reader([&] { got = via_a->Get(*key); });
  ASSERT_TRUE(gate->WaitReached());
  relay->Abort();  // the relay dies with 8 MiB forwarded
  gate->Open();
  reader.join();
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  // Nothing partial on the requesting side: A stored nothing, counted no
  // relayed serve, and cannot claim the object exists without the relay.
  EXPECT_EQ(a->table().objects(), 0u);
  EXPECT_EQ(a->table().bytes(), 0u);
  EXPECT_EQ(a->served(Path::kRelayed), 0u);
  EXPECT_EQ(via_a->Exists(*key).status().code(), StatusCode::kUnavailable);
  // The owner still has it whole.
  auto at_b = via_b->Get(*key);
  ASSERT_TRUE(at_b.ok() && at_b->has_value());
  EXPECT_EQ(Checksum((*at_b)->span()), Checksum(big.span()));
}

// True once pred() holds; polls (an event with no hook to wait on: the
// endpoints' re-registration), bounded by a generous deadline.
template <typename Pred>
bool Eventually(Pred pred) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

TEST(EndpointFailure, EndpointsRegisterAgainWithARestartedRelay) {
  std::string ca;
  auto relay = StartRelay({}, &ca);
  const int port = relay->port();
  endpoint::EndpointOptions o;
  o.relay = "127.0.0.1:" + std::to_string(port);
  o.relay_ca = ca;
  o.punch = false;  // the relay's cases: no hole-punched path on loopback
  auto a = StartEndpoint(o);
  auto b = StartEndpoint(o);  // relayed only
  auto key = ConnectorFor(*b)->Put(Buffer::CopyFrom("survives the relay"));
  ASSERT_TRUE(key.ok());
  relay.reset();
  EXPECT_EQ(ConnectorFor(*a)->Get(*key).status().code(), StatusCode::kUnavailable);
  ASSERT_TRUE(Eventually([&] { return !a->registered() && !b->registered(); }));

  endpoint::RelayOptions ro;
  ro.listen = "127.0.0.1:" + std::to_string(port);
  ro.cert_file = ca;
  ro.key_file = ca.substr(0, ca.rfind('/')) + "/key.pem";
  auto again = endpoint::Relay::Start(ro);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(Eventually([&] { return a->registered() && b->registered(); }));
  auto got = ConnectorFor(*a)->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->view(), "survives the relay");
  EXPECT_EQ(a->served(Path::kRelayed), 1u);
}

}  // namespace
}  // namespace xsilo::testing
