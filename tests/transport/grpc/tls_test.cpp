// TLS, mutual TLS and the shared token. A throwaway CA and certificates are
// made with the openssl command line for each test process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "transport/conformance.h"
#include "transport/test_util.h"
#include "xsilo/transport/registry.h"

namespace xsilo::testing {
namespace {

using namespace std::chrono_literals;

const std::string& TlsDir() {
  static const std::string dir = "/tmp/xsilo-grpc-tls-" + std::to_string(getpid());
  return dir;
}

bool Run(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

// ca.pem signs peer.pem (usable by server and clients, SAN localhost and
// 127.0.0.1); rogue-ca.pem signs rogue.pem.
bool MakeCertificates(const std::string& d) {
  std::filesystem::create_directories(d);
  std::ofstream(d + "/ext.cnf") << "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  for (const std::string ca : {"ca", "rogue-ca"}) {
    if (!Run("openssl req -x509 " + ec + " -keyout " + d + "/" + ca + ".key -out " + d + "/" + ca +
             ".pem -days 2 -subj /CN=xsilo-test-" + ca))
      return false;
  }
  for (const auto& [name, ca] :
       {std::pair<std::string, std::string>{"peer", "ca"}, {"rogue", "rogue-ca"}}) {
    if (!Run("openssl req " + ec + " -keyout " + d + "/" + name + ".key -out " + d + "/" + name +
             ".csr -subj /CN=localhost") ||
        !Run("openssl x509 -req -in " + d + "/" + name + ".csr -CA " + d + "/" + ca +
             ".pem -CAkey " + d + "/" + ca + ".key -CAcreateserial -days 2 -out " + d + "/" + name +
             ".pem -extfile " + d + "/ext.cnf"))
      return false;
  }
  return true;
}

class TlsEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { ASSERT_TRUE(MakeCertificates(TlsDir())) << "openssl failed"; }
  void TearDown() override { std::filesystem::remove_all(TlsDir()); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new TlsEnvironment);

std::map<std::string, std::string> MutualTls(const std::string& name = "peer",
                                             const std::string& ca = "ca") {
  const std::string& d = TlsDir();
  return {{"tls_ca", d + "/" + ca + ".pem"},
          {"tls_cert", d + "/" + name + ".pem"},
          {"tls_key", d + "/" + name + ".key"},
          {"tls_server_name", "localhost"}};
}

std::unique_ptr<Transport> Make(int rank, int world, int port,
                                std::map<std::string, std::string> backend,
                                Duration connect_timeout = 60s) {
  TransportOptions o;
  o.rank = rank;
  o.world_size = world;
  o.address = "127.0.0.1:" + std::to_string(port);
  o.backend = std::move(backend);
  o.connect_timeout = connect_timeout;
  auto t = TransportRegistry::Global().Create("grpc", o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

TEST(GrpcTls, WrongCertificateIsRefusedAndTheServerServesOthers) {
  const int port = FreeTcpPort();
  auto server = Make(0, 3, port, MutualTls());
  ASSERT_TRUE(server->Start().ok());
  auto rogue = Make(1, 3, port, MutualTls("rogue", "ca"), 3s);  // cert from another CA
  Status s = rogue->Start();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("could not connect"), std::string::npos) << s.ToString();
  std::map<std::string, std::string> no_cert = MutualTls();
  no_cert.erase("tls_cert");
  no_cert.erase("tls_key");
  auto anonymous = Make(1, 3, port, no_cert, 3s);
  EXPECT_FALSE(anonymous->Start().ok());
  auto plaintext = Make(1, 3, port, {}, 3s);
  EXPECT_FALSE(plaintext->Start().ok());

  auto good = Make(2, 3, port, MutualTls());
  ASSERT_TRUE(good->Start().ok());
  ASSERT_TRUE(good->Send(0, PatternMessage(1 << 20, 1), 30s).ok());
  auto r = server->Receive(30s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(PatternIntact(*r));
  EXPECT_EQ(r->sender, 2);
}

TEST(GrpcTls, ServerVerifiedByTheWrongCaIsRefused) {
  const int port = FreeTcpPort();
  auto server = Make(0, 2, port, MutualTls());
  ASSERT_TRUE(server->Start().ok());
  auto client = Make(1, 2, port, MutualTls("peer", "rogue-ca"), 3s);
  EXPECT_EQ(client->Start().code(), StatusCode::kUnavailable);
}

TEST(GrpcToken, WrongTokenIsRefusedWithAClearError) {
  const int port = FreeTcpPort();
  auto server = Make(0, 3, port, {{"token", "s3cret"}});
  ASSERT_TRUE(server->Start().ok());
  auto bad = Make(1, 3, port, {{"token", "guess"}}, 10s);
  Status s = bad->Start();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_NE(s.message().find("token"), std::string::npos) << s.ToString();
  auto none = Make(1, 3, port, {}, 10s);
  EXPECT_EQ(none->Start().code(), StatusCode::kPermissionDenied);

  auto good = Make(2, 3, port, {{"token", "s3cret"}});
  ASSERT_TRUE(good->Start().ok());
  ASSERT_TRUE(server->Send(2, PatternMessage(4096, 2), 30s).ok());
  auto r = good->Receive(30s);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(PatternIntact(*r));
}

// mode=unary checks the token of every call (in constant time, as the
// streaming mode does): a wrong one is refused, the right one delivers.
TEST(GrpcToken, UnaryModeRefusesAWrongToken) {
  const int port = FreeTcpPort();
  auto server = Make(0, 3, port, {{"token", "s3cret"}, {"mode", "unary"}});
  ASSERT_TRUE(server->Start().ok());
  auto bad = Make(1, 3, port, {{"token", "s3creT"}, {"mode", "unary"}}, 10s);
  auto good = Make(2, 3, port, {{"token", "s3cret"}, {"mode", "unary"}}, 10s);
  ASSERT_TRUE(bad->Start().ok());
  ASSERT_TRUE(good->Start().ok());
  Status s = bad->Send(0, PatternMessage(4096, 1), 10s);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  ASSERT_TRUE(good->Send(0, PatternMessage(4096, 2), 10s).ok());
  auto r = server->Receive(30s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(PatternIntact(*r));
}

TEST(GrpcToken, TokenWorksTogetherWithMutualTls) {
  const int port = FreeTcpPort();
  auto opts = MutualTls();
  opts["token"] = "t";
  auto server = Make(0, 2, port, opts);
  ASSERT_TRUE(server->Start().ok());
  auto client = Make(1, 2, port, opts);
  ASSERT_TRUE(client->Start().ok());
  ASSERT_TRUE(client->Send(0, PatternMessage(100, 3), 30s).ok());
  EXPECT_TRUE(server->Receive(30s).ok());
}

}  // namespace

XSILO_TRANSPORT_CONFORMANCE(GrpcTls, {.backend = "grpc",
                                      .backend_options = MutualTls(),
                                      .network = true,
                                      .label = "grpc_tls"});

}  // namespace xsilo::testing
