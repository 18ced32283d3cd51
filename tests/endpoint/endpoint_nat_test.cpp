// Endpoints behind the emulator's NATs (xsilo netem, docs/netem.md "NAT"):
// a relay on a public site, endpoints A and B each in a site of its own,
// public or behind a full-cone or symmetric NAT. A reads B's Big-tier
// object (253 MiB) through its endpoint, and the path it took is the one
// the NAT types allow: direct when B can be dialled, reverse when only A
// can, punched (ICE over UDP) when both are behind NATs that keep one
// mapping per host port, relayed when both are symmetric. Needs root and
// /dev/net/tun; skips otherwise.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "endpoint/endpoint_test_util.h"
#include "net/tls.h"
#include "netem/netem_fixture.h"
#include "transport/test_util.h"
#include "xsilo/core/tiers.h"

namespace xsilo::testing {
namespace {

using endpoint::Path;
using netem::NatType;

constexpr int kRelaySite = 0, kA = 1, kB = 2;

// Runs fn on a thread inside the site's namespace; every thread it starts
// (an endpoint's listeners, sessions and ICE loop) stays in that namespace.
void InSite(const netem::State& state, int site, const std::function<void()>& fn) {
  std::thread t([&] {
    Status s = netem::EnterSite(state, site);
    ASSERT_TRUE(s.ok()) << s.ToString();
    fn();
  });
  t.join();
}

class EndpointNat : public netem::testing::NetemFixture {
 protected:
  struct Sites {
    netem::State state;
    std::unique_ptr<endpoint::Relay> relay;
    std::unique_ptr<endpoint::Endpoint> a, b;
  };

  // a_listens / b_listens: the endpoint has a peer listener on its host's
  // address (behind a NAT, a private one nobody outside can dial).
  Sites Up(NatType a_nat, bool a_listens, NatType b_nat, bool b_listens) {
    Sites s;
    netem::Topology t;
    t.sites = {netem::Site{.name = "relay"}, netem::Site{.name = "a", .nat = a_nat},
               netem::Site{.name = "b", .nat = b_nat}};
    t.links.assign(3, std::vector<netem::LinkShape>(3));
    s.state = UpOrDie(t);
    const std::string relay_host = s.state.sites[kRelaySite].address;
    std::string dir = TempDir("nat-relay");
    endpoint::RelayOptions ro;
    ro.listen = relay_host + ":0";
    ro.cert_file = dir + "/cert.pem";
    ro.key_file = dir + "/key.pem";
    EXPECT_TRUE(net::GenerateSelfSignedCertificate(ro.cert_file, ro.key_file, {relay_host}).ok());
    InSite(s.state, kRelaySite, [&] {
      auto r = endpoint::Relay::Start(ro);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      s.relay = std::move(r).value();
    });
    if (!s.relay) return s;
    auto start = [&](int site, bool listens, std::unique_ptr<endpoint::Endpoint>* out) {
      endpoint::EndpointOptions o;
      o.relay = relay_host + ":" + std::to_string(s.relay->port());
      o.relay_ca = ro.cert_file;
      if (listens) o.peer_listen = s.state.sites[site].address + ":0";
      o.connect_timeout = std::chrono::milliseconds(1500);
      o.punch_timeout = std::chrono::milliseconds(8000);
      InSite(s.state, site, [&] { *out = StartEndpoint(o); });
    };
    start(kA, a_listens, &s.a);
    start(kB, b_listens, &s.b);
    return s;
  }

  // B stores a Big-tier object; A reads it through its own endpoint. The
  // bytes, the path A reports and A's counters are checked.
  void ExpectBigObjectThroughA(Sites& s, Path want) {
    ASSERT_TRUE(s.relay && s.a && s.b);
    ASSERT_TRUE(s.a->registered() && s.b->registered());
    const uint64_t big = FindTier("big")->parameters * 4;
    Buffer object = PatternTensor(big, 11).data;
    Result<Key> key = Unavailable("not run");
    InSite(s.state, kB, [&] { key = ConnectorFor(*s.b)->Put(object); });
    ASSERT_TRUE(key.ok()) << key.status().ToString();
    Result<std::optional<Buffer>> got = Unavailable("not run");
    InSite(s.state, kA, [&] { got = ConnectorFor(*s.a)->Get(*key); });
    ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
    EXPECT_EQ((*got)->size(), big);
    EXPECT_EQ(Checksum((*got)->span()), Checksum(object.span()));
    std::string failures;
    for (const auto& f : s.a->path_failures()) failures += "\n  A: " + f;
    for (const auto& f : s.b->path_failures()) failures += "\n  B: " + f;
    for (Path p : {Path::kDirect, Path::kReverse, Path::kPunched, Path::kRelayed}) {
      EXPECT_EQ(s.a->served(p), p == want ? 1u : 0u)
          << endpoint::PathName(p) << "; paths that failed before:" << failures;
    }
    EXPECT_EQ(s.relay->pipes_opened(), want == Path::kRelayed ? 1u : 0u);
    EXPECT_EQ(s.a->table().objects(), 0u) << "A keeps no copy of B's object";
  }
};

TEST_F(EndpointNat, DirectWhenTheOwnerIsPublic) {
  Sites s = Up(NatType::kFullCone, false, NatType::kNone, true);
  ExpectBigObjectThroughA(s, Path::kDirect);
}

TEST_F(EndpointNat, ReverseWhenOnlyTheRequesterIsPublic) {
  Sites s = Up(NatType::kNone, true, NatType::kSymmetric, true);
  ExpectBigObjectThroughA(s, Path::kReverse);
}

TEST_F(EndpointNat, PunchedBetweenTwoFullConeNats) {
  Sites s = Up(NatType::kFullCone, true, NatType::kFullCone, true);
  ExpectBigObjectThroughA(s, Path::kPunched);
}

TEST_F(EndpointNat, RelayedBetweenTwoSymmetricNats) {
  Sites s = Up(NatType::kSymmetric, true, NatType::kSymmetric, true);
  ExpectBigObjectThroughA(s, Path::kRelayed);
}

}  // namespace
}  // namespace xsilo::testing
