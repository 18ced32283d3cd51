// An endpoint serves only the peers the relay vouched for: a session on B's
// peer API needs a ticket the relay signed with B's secret, for B, unexpired,
// and issued to the certificate the session's client presents.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <thread>

#include "endpoint/endpoint_test_util.h"
#include "endpoint/ticket.h"
#include "net/socket.h"

namespace xsilo::testing {
namespace {

struct Sites {
  std::string ca;
  std::unique_ptr<endpoint::Relay> relay;
  std::unique_ptr<endpoint::Endpoint> a, b, c;
  Key key;  // an object on B

  explicit Sites(std::chrono::milliseconds ticket_ttl = std::chrono::minutes(2)) {
    endpoint::RelayOptions ro;
    ro.ticket_ttl = ticket_ttl;
    relay = StartRelay(ro, &ca);
    endpoint::EndpointOptions o;
    o.relay = "127.0.0.1:" + std::to_string(relay->port());
    o.relay_ca = ca;
    o.peer_listen = "127.0.0.1:0";
    a = StartEndpoint(o);
    b = StartEndpoint(o);
    c = StartEndpoint(o);
    auto k = ConnectorFor(*b)->Put(Buffer::CopyFrom("secret bytes"));
    EXPECT_TRUE(k.ok());
    key = *k;
  }

  // A ticket the relay issues to `from` for `to`.
  std::string TicketFor(endpoint::Endpoint& from, const endpoint::Endpoint& to) {
    auto peer = from.AskRelay("LOOKUP " + to.uuid());
    EXPECT_TRUE(peer.ok() && peer->rfind("PEER ", 0) == 0) << peer.status().ToString();
    return peer->substr(peer->rfind(' ') + 1);
  }

  // The status line B answers a GET of `key` with, the session opened with
  // `as`'s certificate and carrying `ticket`.
  std::string AskB(const endpoint::Endpoint& as, const std::string& ticket) {
    auto fd = net::ConnectTcp({"127.0.0.1", b->peer_port()}, std::chrono::seconds(5),
                              std::chrono::seconds(30));
    EXPECT_TRUE(fd.ok());
    auto s = net::TlsStream::Connect(as.identity().pinned_client_ctx(), *fd, "");
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)->peer_fingerprint(), b->fingerprint());
    EXPECT_TRUE((*s)->WriteLine("XSP/1 GET " + key.id + " 0 " + ticket).ok());
    auto line = (*s)->ReadLine();
    return line.ok() ? *line : "(no reply: " + line.status().ToString() + ")";
  }
};

bool Refused(const std::string& reply) { return reply.rfind("XSP/1 403 0 ", 0) == 0; }

TEST(EndpointRefusal, AVouchedPeerIsServed) {
  Sites s;
  EXPECT_EQ(s.AskB(*s.a, s.TicketFor(*s.a, *s.b)), "XSP/1 200 12 ok");
}

TEST(EndpointRefusal, NoTicketIsRefused) {
  Sites s;
  std::string r = s.AskB(*s.a, "-");
  EXPECT_TRUE(Refused(r)) << r;
}

TEST(EndpointRefusal, ForgedTicketIsRefused) {
  Sites s;
  std::string forged =
      endpoint::MakeTicket("not-the-relays-secret", s.a->uuid(), s.a->fingerprint(), s.b->uuid(),
                           endpoint::UnixMillis() + 60000);
  std::string r = s.AskB(*s.a, forged);
  EXPECT_TRUE(Refused(r)) << r;
  // A real ticket with one field changed (a later expiry) breaks the MAC.
  std::string real = s.TicketFor(*s.a, *s.b);
  std::string tampered = real;
  size_t mac = tampered.rfind('.');
  tampered[mac - 1] = tampered[mac - 1] == '9' ? '8' : '9';
  r = s.AskB(*s.a, tampered);
  EXPECT_TRUE(Refused(r)) << r;
  EXPECT_TRUE(Refused(s.AskB(*s.a, "garbage"))) << r;
}

TEST(EndpointRefusal, TicketForAnotherEndpointIsRefused) {
  Sites s;
  std::string r = s.AskB(*s.a, s.TicketFor(*s.a, *s.c));
  EXPECT_TRUE(Refused(r)) << r;
}

TEST(EndpointRefusal, TicketPresentedByAnotherCertificateIsRefused) {
  Sites s;
  // C holds A's ticket (stolen), but its session shows C's certificate.
  std::string r = s.AskB(*s.c, s.TicketFor(*s.a, *s.b));
  EXPECT_TRUE(Refused(r)) << r;
}

TEST(EndpointRefusal, ExpiredTicketIsRefused) {
  Sites s(std::chrono::milliseconds(-1000));  // the relay issues tickets already expired
  std::string r = s.AskB(*s.a, s.TicketFor(*s.a, *s.b));
  EXPECT_TRUE(Refused(r)) << r;
  // Through the connector the refusal is PermissionDenied, and nothing is served.
  auto got = ConnectorFor(*s.a)->Get(s.key);
  EXPECT_EQ(got.status().code(), StatusCode::kPermissionDenied) << got.status().ToString();
}

// A ticket admits a peer, not every write: a peer may replace or delete
// only the objects it wrote itself (#58 gap 4).
TEST(EndpointRefusal, APeerMayChangeOnlyTheObjectsItWrote) {
  Sites s;
  auto bytes = [](std::string_view text) {
    GatherList g;
    g.Append(Buffer::CopyFrom(text));
    return g;
  };
  // A writes an object onto B (put_to); B's own object is s.key.
  auto a_to_b = MakeConnector(
      {"endpoint",
       {{"address", "127.0.0.1:" + std::to_string(s.a->port())}, {"put_to", s.b->uuid()}}});
  ASSERT_TRUE(a_to_b.ok()) << a_to_b.status().ToString();
  auto written = (*a_to_b)->Put(Buffer::CopyFrom("a's bytes"));
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  ASSERT_EQ(written->attrs.at("endpoint"), s.b->uuid());

  // C, vouched for by the relay, may read B's object (its readers are "*")
  // but not A's (readable by A and B's grants only), and changes neither.
  auto c = ConnectorFor(*s.c);
  auto readable = c->Get(s.key);
  ASSERT_TRUE(readable.ok() && readable->has_value()) << readable.status().ToString();
  EXPECT_EQ(c->Get(*written).status().code(), StatusCode::kPermissionDenied);
  for (const Key& k : {s.key, *written}) {
    Status replaced = c->Set(k, bytes("c was here"));
    EXPECT_EQ(replaced.code(), StatusCode::kPermissionDenied) << replaced.ToString();
    Status evicted = c->Evict(k);
    EXPECT_EQ(evicted.code(), StatusCode::kPermissionDenied) << evicted.ToString();
  }
  auto intact = ConnectorFor(*s.b)->Get(*written);
  ASSERT_TRUE(intact.ok() && intact->has_value());
  EXPECT_EQ((*intact)->view(), "a's bytes") << "a refused Set changed the object";
  // A cannot change B's own object either.
  auto a = ConnectorFor(*s.a);
  EXPECT_EQ(a->Evict(s.key).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(s.b->table().objects(), 2u);
  auto kept = ConnectorFor(*s.b)->Get(s.key);
  ASSERT_TRUE(kept.ok() && kept->has_value());
  EXPECT_EQ((*kept)->view(), "secret bytes");

  // The writer replaces and deletes its own; B, the site, may delete anything.
  ASSERT_TRUE((*a_to_b)->Set(*written, bytes("a again")).ok());
  auto again = (*a_to_b)->Get(*written);
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ((*again)->view(), "a again");
  EXPECT_TRUE((*a_to_b)->Evict(*written).ok());
  EXPECT_EQ(s.b->table().objects(), 1u);
  EXPECT_TRUE(ConnectorFor(*s.b)->Evict(s.key).ok());
  EXPECT_EQ(s.b->table().objects(), 0u);
}

// A peer reads an object only when it wrote it, the object names it among
// its readers (the local PUT's readers=, the connector's `readers`), or the
// owner's --grant covers its id. An absent id is None to every peer, as a
// missing key is for every connector.
TEST(EndpointRefusal, APeerReadsOnlyWhatItWasGranted) {
  std::string ca;
  auto relay = StartRelay({}, &ca);
  endpoint::EndpointOptions o;
  o.relay = "127.0.0.1:" + std::to_string(relay->port());
  o.relay_ca = ca;
  o.peer_listen = "127.0.0.1:0";
  auto a = StartEndpoint(o);
  auto c = StartEndpoint(o);
  o.read_grants = {{c->uuid(), "shared-"}};
  auto b = StartEndpoint(o);  // the owner: C may read B's "shared-*"
  auto b_with = [&](const std::string& readers) {
    auto conn = MakeConnector(
        {"endpoint",
         {{"address", "127.0.0.1:" + std::to_string(b->port())}, {"readers", readers}}});
    EXPECT_TRUE(conn.ok()) << conn.status().ToString();
    return std::move(conn).value();
  };
  auto put = [](Connector& conn, const std::string& id, std::string_view text) {
    Key k = *conn.NewKey();
    k.id = id;
    GatherList g;
    g.Append(Buffer::CopyFrom(text));
    EXPECT_TRUE(conn.Set(k, g).ok());
    return k;
  };
  Key priv = put(*b_with(""), "private-1", "b's own");
  Key for_a = put(*b_with(a->uuid()), "for-a", "to a");
  Key any = put(*b_with("*"), "for-all", "to all");
  Key shared = put(*b_with(""), "shared-1", "granted by prefix");
  Key missing = shared;
  missing.id = "shared-none";
  Key absent = priv;
  absent.id = "private-none";

  auto ra = ConnectorFor(*a);
  auto rc = ConnectorFor(*c);
  auto read = [](Connector& conn, const Key& k) -> std::string {
    auto got = conn.Get(k);
    if (!got.ok()) return got.status().code() == StatusCode::kPermissionDenied ? "403" : "error";
    return got->has_value() ? std::string((*got)->view()) : "404";
  };
  EXPECT_EQ(read(*ra, priv), "403");
  EXPECT_EQ(read(*rc, priv), "403");
  EXPECT_EQ(read(*ra, for_a), "to a");
  EXPECT_EQ(read(*rc, for_a), "403");
  EXPECT_EQ(read(*ra, any), "to all");
  EXPECT_EQ(read(*rc, any), "to all");
  EXPECT_EQ(read(*ra, shared), "403");
  EXPECT_EQ(read(*rc, shared), "granted by prefix");
  EXPECT_EQ(read(*rc, missing), "404");
  EXPECT_EQ(read(*ra, absent), "404");
  auto exists = ra->Exists(priv);
  EXPECT_EQ(exists.status().code(), StatusCode::kPermissionDenied) << "HEAD is a read too";
  // B's own processes read everything; a rewrite without readers revokes them.
  EXPECT_EQ(read(*ConnectorFor(*b), priv), "b's own");
  put(*b_with(""), "for-a", "revoked");
  EXPECT_EQ(read(*ra, for_a), "403");
  // Bad readers and grants are refused with a clear error.
  auto bad = MakeConnector(
      {"endpoint", {{"address", "127.0.0.1:" + std::to_string(b->port())}, {"readers", "a/b"}}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  endpoint::EndpointOptions g;
  g.read_grants = {{"not a uuid", ""}};
  auto refused = endpoint::Endpoint::Start(g);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
}

TEST(EndpointRefusal, TheRelayAnswersOnlyRegisteredEndpoints) {
  Sites s;
  // A certificate no endpoint registered with: the relay vouches for nothing.
  auto stranger = net::TlsIdentity::LoadOrCreate(TempDir("stranger"), {"stranger"}, s.ca);
  ASSERT_TRUE(stranger.ok()) << stranger.status().ToString();
  auto fd = net::ConnectTcp({"127.0.0.1", s.relay->port()}, std::chrono::seconds(5),
                            std::chrono::seconds(30));
  ASSERT_TRUE(fd.ok());
  auto t = net::TlsStream::Connect((*stranger)->relay_client_ctx(), *fd, "127.0.0.1");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*t)->WriteLine("LOOKUP " + s.b->uuid()).ok());
  auto reply = (*t)->ReadLine();
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->rfind("ERR PermissionDenied", 0), 0u) << *reply;
  // Nor may it take over B's registration: B's certificate is another one.
  auto fd2 = net::ConnectTcp({"127.0.0.1", s.relay->port()}, std::chrono::seconds(5),
                             std::chrono::seconds(30));
  ASSERT_TRUE(fd2.ok());
  auto t2 = net::TlsStream::Connect((*stranger)->relay_client_ctx(), *fd2, "127.0.0.1");
  ASSERT_TRUE(t2.ok());
  ASSERT_TRUE((*t2)->WriteLine("REGISTER " + s.b->uuid() + " 127.0.0.1:1").ok());
  reply = (*t2)->ReadLine();
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->rfind("ERR PermissionDenied", 0), 0u) << *reply;
}

// A relay given the certificates it may admit registers those and refuses
// every other one: a stranger who reaches it gets no registration, so no
// ticket to anyone.
TEST(EndpointRefusal, AnAdmittingRelayRegistersOnlyTheCertificatesItWasGiven) {
  const std::string admitted_dir = TempDir("admitted"), stranger_dir = TempDir("stranger");
  auto admitted = net::TlsIdentity::LoadOrCreate(admitted_dir, {"admitted"});
  ASSERT_TRUE(admitted.ok()) << admitted.status().ToString();
  endpoint::RelayOptions ro;
  ro.admit = {(*admitted)->fingerprint()};
  std::string ca;
  auto relay = StartRelay(ro, &ca);
  ASSERT_TRUE(relay);
  auto reply_to = [&](const std::string& dir, const std::string& uuid) -> std::string {
    auto id = net::TlsIdentity::LoadOrCreate(dir, {"x"}, ca);  // the same pair, relay CA
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    auto fd = net::ConnectTcp({"127.0.0.1", relay->port()}, std::chrono::seconds(5),
                              std::chrono::seconds(30));
    EXPECT_TRUE(fd.ok());
    auto t = net::TlsStream::Connect((*id)->relay_client_ctx(), *fd, "127.0.0.1");
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_TRUE((*t)->WriteLine("REGISTER " + uuid + " 127.0.0.1:1").ok());
    auto reply = (*t)->ReadLine();
    return reply.ok() ? *reply : reply.status().ToString();
  };
  EXPECT_EQ(reply_to(stranger_dir, "stranger-uuid").rfind("ERR PermissionDenied", 0), 0u);
  EXPECT_FALSE(relay->registered("stranger-uuid"));
  EXPECT_EQ(reply_to(admitted_dir, "admitted-uuid").rfind("OK ", 0), 0u);
  EXPECT_TRUE(relay->registered("admitted-uuid"));
}

// A flood of connections cannot exhaust the relay's threads: past
// max_connections a connection is closed as soon as it is accepted, and one
// is served again once a slot is free.
TEST(EndpointRefusal, TheRelayRefusesConnectionsPastItsBound) {
  endpoint::RelayOptions ro;
  ro.max_connections = 1;
  std::string ca;
  auto relay = StartRelay(ro, &ca);
  ASSERT_TRUE(relay);
  const net::HostPort at{"127.0.0.1", relay->port()};
  auto idle = net::ConnectTcp(at, std::chrono::seconds(5), std::chrono::seconds(30));
  ASSERT_TRUE(idle.ok());
  ASSERT_EQ(::send(*idle, "J", 1, MSG_NOSIGNAL), 1);  // its thread now waits for the rest
  auto extra = net::ConnectTcp(at, std::chrono::seconds(5), std::chrono::seconds(30));
  ASSERT_TRUE(extra.ok());
  char c = 0;
  EXPECT_EQ(::recv(*extra, &c, 1, 0), 0) << "the connection past the bound is closed";
  EXPECT_EQ(relay->refused(), 1u);
  int fd = *idle;
  net::CloseFd(fd);
  fd = *extra;
  net::CloseFd(fd);
  // The slot is free once the idle connection's thread saw it close.
  endpoint::EndpointOptions o;
  o.relay = "127.0.0.1:" + std::to_string(relay->port());
  o.relay_ca = ca;
  auto e = StartEndpoint(o);
  ASSERT_TRUE(e);
  // Its first try may still meet the bound (the idle connection's thread
  // may not have ended yet); it registers on a retry.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!e->registered() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(e->registered());
}

}  // namespace
}  // namespace xsilo::testing
