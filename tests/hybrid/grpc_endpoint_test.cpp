// grpc+endpoint: the hybrid backend over per-site object endpoints
// (docs/endpoint.md). One relay and one endpoint per party, all in this
// process: the server (rank 0) broadcasts a model that stays on its own
// endpoint; each client pulls it through its own endpoint (directly, when
// the server's endpoint has a peer listener, else through the relay) and
// sends an update back (the server's endpoint reaching the clients' ones
// by a dial back when it listens, else through the relay). Once every ack
// is in, every endpoint is empty: the server keeps no copy after the
// clients pulled.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "endpoint/endpoint_test_util.h"
#include "net/http_client.h"
#include "transport/test_util.h"
#include "xsilo/hybrid/hybrid.h"
#include "xsilo/transport/registry.h"

namespace xsilo::testing {
namespace {

using namespace std::chrono_literals;
using endpoint::Path;

constexpr int kClients = 2;
constexpr uint64_t kModelBytes = 24ull << 20;   // above the default 10 MiB threshold
constexpr uint64_t kUpdateBytes = 12ull << 20;  // also above it

// A relay and one endpoint per party: [0] the server's, [1..] the clients'.
struct Federation {
  std::string ca;
  std::unique_ptr<endpoint::Relay> relay;
  std::array<std::unique_ptr<endpoint::Endpoint>, kClients + 1> ep;

  // server_reachable: the server's endpoint listens for peers (the clients'
  // never do: they are the sites behind NAT).
  explicit Federation(bool server_reachable) {
    relay = StartRelay({}, &ca);
    if (!relay) return;
    for (int i = 0; i <= kClients; ++i) {
      endpoint::EndpointOptions o;
      o.relay = "127.0.0.1:" + std::to_string(relay->port());
      o.relay_ca = ca;
      o.punch = false;  // on one machine a punched path always works: these are the relay's cases
      if (i == 0 && server_reachable) o.peer_listen = "127.0.0.1:0";
      ep[i] = StartEndpoint(o);
    }
  }

  bool Up() const {
    if (!relay) return false;
    for (const auto& e : ep)
      if (!e || !e->registered()) return false;
    return true;
  }

  uint64_t Objects() const {
    uint64_t n = 0;
    for (const auto& e : ep) n += e->table().objects();
    return n;
  }
};

TransportOptions PartyOptions(int rank, const std::string& address, const endpoint::Endpoint& e,
                              std::map<std::string, std::string> extra = {}) {
  TransportOptions o;
  o.rank = rank;
  o.world_size = kClients + 1;
  o.address = address;
  o.backend = {{"store.address", "127.0.0.1:" + std::to_string(e.port())}};
  o.backend.insert(extra.begin(), extra.end());
  return o;
}

// The endpoint's /status, as a caller of the local API sees it.
std::string StatusOf(const endpoint::Endpoint& e) {
  auto r = net::HttpCall({"127.0.0.1", e.port()}, "GET", "/status", nullptr, 10s);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::string(r->body.view()) : "";
}

bool SameBytes(const Message& a, const Message& b) {
  const Tensor& x = a.tensors.at("w");
  const Tensor& y = b.tensors.at("w");
  return x.nbytes() == y.nbytes() &&
         std::memcmp(x.data.data(), y.data.data(), static_cast<size_t>(x.nbytes())) == 0;
}

// Polls `done` every 10 ms for at most `limit`.
template <typename F>
bool WaitFor(F done, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// Every remote call of `e` took `path`: none took another.
void ExpectOnlyPath(const endpoint::Endpoint& e, Path path, uint64_t calls) {
  EXPECT_EQ(e.served(path), calls) << StatusOf(e);
  for (Path other : {Path::kDirect, Path::kReverse, Path::kPunched, Path::kRelayed}) {
    if (other != path) {
      EXPECT_EQ(e.served(other), 0u) << endpoint::PathName(other);
    }
  }
}

// One round: the model down to both clients, an update from each back up,
// every endpoint empty once the acks are in. `down` is the path the
// clients' endpoints take to the server's, `up` the one the server's takes
// to theirs (no client endpoint listens for peers: the server's endpoint is
// dialled back when it listens, else the relay pipes).
void ModelDownUpdatesUp(Federation& f, Path down, Path up,
                        std::map<std::string, std::string> extra = {}) {
  ASSERT_TRUE(f.Up());
  const std::string address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  auto server = TransportRegistry::Global().Create("grpc+endpoint",
                                                   PartyOptions(0, address, *f.ep[0], extra));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ((*server)->name(), "grpc+endpoint");
  ASSERT_TRUE((*server)->Start().ok());
  std::array<std::unique_ptr<Transport>, kClients + 1> clients;
  {
    std::vector<std::future<Status>> started;
    for (int c = 1; c <= kClients; ++c) {
      auto t = TransportRegistry::Global().Create("grpc+endpoint",
                                                  PartyOptions(c, address, *f.ep[c], extra));
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      clients[c] = std::move(t).value();
      started.push_back(
          std::async(std::launch::async, [t = clients[c].get()] { return t->Start(); }));
    }
    for (auto& s : started) {
      Status st = s.get();
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
  }

  Message model = PatternMessage(kModelBytes, 7, 1);
  model.type = "model";
  ASSERT_TRUE((*server)->Broadcast({1, 2}, model, 120s).ok());
  std::vector<Message> sent_updates(kClients + 1);
  for (int c = 1; c <= kClients; ++c) {
    auto got = clients[c]->Receive(120s);
    ASSERT_TRUE(got.ok()) << "client " << c << ": " << got.status().ToString();
    EXPECT_EQ(got->type, "model");
    EXPECT_TRUE(PatternIntact(*got));
    EXPECT_TRUE(SameBytes(*got, model)) << "client " << c << " got other bytes";
    sent_updates[c] = PatternMessage(kUpdateBytes, 100 + c, 1);
    sent_updates[c].type = "update";
    ASSERT_TRUE(clients[c]->Send(0, sent_updates[c], 120s).ok());
  }
  std::set<int32_t> from;
  for (int n = 0; n < kClients; ++n) {
    auto u = (*server)->Receive(120s);
    ASSERT_TRUE(u.ok()) << u.status().ToString();
    EXPECT_EQ(u->type, "update");
    ASSERT_GE(u->sender, 1);
    ASSERT_LE(u->sender, kClients);
    EXPECT_TRUE(PatternIntact(*u));
    EXPECT_TRUE(SameBytes(*u, sent_updates[u->sender])) << "update of rank " << u->sender;
    from.insert(u->sender);
  }
  EXPECT_EQ(from.size(), size_t{kClients});

  // Acks travel after the deliveries: wait for the evictions they cause.
  EXPECT_TRUE(WaitFor([&] { return f.Objects() == 0; }, 30s))
      << "objects left: server " << f.ep[0]->table().objects() << ", client 1 "
      << f.ep[1]->table().objects() << ", client 2 " << f.ep[2]->table().objects();
  for (const auto& e : f.ep) {
    const std::string status = StatusOf(*e);
    EXPECT_NE(status.find("\"objects\":0,"), std::string::npos) << status;
  }
  // The model went down on `down`, one read by each client's endpoint; the
  // updates came up on `up`, the server's endpoint's reads.
  for (int c = 1; c <= kClients; ++c) {
    SCOPED_TRACE("client " + std::to_string(c));
    ExpectOnlyPath(*f.ep[c], down, 1);
  }
  ExpectOnlyPath(*f.ep[0], up, kClients);
  // Each party stored its object on its own endpoint and evicted it there
  // (a put and a delete at least; nothing is empty for want of a put).
  for (const auto& e : f.ep) EXPECT_GE(e->served(Path::kLocal), 2u) << StatusOf(*e);

  for (int c = 1; c <= kClients; ++c) clients[c]->Stop();
  (*server)->Stop();
}

TEST(GrpcEndpoint, ModelPulledDirectlyFromTheServersEndpointLeavesNoCopy) {
  Federation f(/*server_reachable=*/true);
  ModelDownUpdatesUp(f, Path::kDirect, Path::kReverse);
  EXPECT_EQ(f.relay->pipes_opened(), 0u) << "no byte went through the relay";
}

TEST(GrpcEndpoint, ModelPulledThroughTheRelayLeavesNoCopy) {
  Federation f(/*server_reachable=*/false);
  const uint64_t pipes_before = f.relay ? f.relay->pipes_opened() : 0;
  ModelDownUpdatesUp(f, Path::kRelayed, Path::kRelayed);
  // Both models down and both updates up were piped.
  EXPECT_GE(f.relay->pipes_opened() - pipes_before, uint64_t{2 * kClients});
}

// threshold=always: every tensor goes through the endpoints, however small.
TEST(GrpcEndpoint, ThresholdAlwaysSendsSmallTensorsThroughTheEndpoints) {
  Federation f(/*server_reachable=*/true);
  ASSERT_TRUE(f.Up());
  const std::string address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  auto server = TransportRegistry::Global().Create(
      "grpc+endpoint", PartyOptions(0, address, *f.ep[0], {{"threshold", "always"}}));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_TRUE((*server)->Start().ok());
  auto client = TransportRegistry::Global().Create(
      "grpc+endpoint", PartyOptions(1, address, *f.ep[1], {{"threshold", "always"}}));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE((*client)->Start().ok());
  Message m = PatternMessage(4096, 3, 0);
  ASSERT_TRUE((*server)->Send(1, m, 60s).ok());
  auto got = (*client)->Receive(60s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(SameBytes(*got, m));
  ExpectOnlyPath(*f.ep[1], Path::kDirect, 1);
  EXPECT_TRUE(WaitFor([&] { return f.Objects() == 0; }, 30s));
  (*client)->Stop();
  (*server)->Stop();
}

// A party without store.address cannot reach its endpoint: refused when the
// transport is made, with a message that says what to give.
TEST(GrpcEndpoint, MissingStoreAddressIsAClearError) {
  TransportOptions o;
  o.rank = 0;
  o.world_size = 2;
  o.address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  auto t = TransportRegistry::Global().Create("grpc+endpoint", o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("store.address"), std::string::npos) << t.status().ToString();
}

}  // namespace
}  // namespace xsilo::testing
