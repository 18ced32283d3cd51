#include "endpoint/endpoint_test_util.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <mutex>
#include <vector>

#include "net/tls.h"

namespace xsilo::testing {

namespace {
// The directories TempDir made, removed when the test binary exits.
struct TempDirs {
  std::mutex mu;
  std::vector<std::string> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};
TempDirs& AllTempDirs() {
  static TempDirs dirs;
  return dirs;
}
}  // namespace

std::string TempDir(const std::string& tag) {
  std::string t = "/tmp/xsilo-" + tag + "-XXXXXX";
  if (!mkdtemp(t.data())) return "";
  TempDirs& all = AllTempDirs();
  std::lock_guard<std::mutex> lock(all.mu);
  all.dirs.push_back(t);
  return t;
}

std::unique_ptr<endpoint::Relay> StartRelay(endpoint::RelayOptions o, std::string* ca_file) {
  std::string dir = TempDir("relay");
  o.cert_file = dir + "/cert.pem";
  o.key_file = dir + "/key.pem";
  Status s =
      net::GenerateSelfSignedCertificate(o.cert_file, o.key_file, {"127.0.0.1", "localhost"});
  EXPECT_TRUE(s.ok()) << s.ToString();
  *ca_file = o.cert_file;
  auto r = endpoint::Relay::Start(std::move(o));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::unique_ptr<endpoint::Endpoint> StartEndpoint(endpoint::EndpointOptions o) {
  auto e = endpoint::Endpoint::Start(std::move(o));
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

std::unique_ptr<Connector> ConnectorFor(const endpoint::Endpoint& e, int timeout_ms) {
  auto c = MakeConnector({"endpoint",
                          {{"address", "127.0.0.1:" + std::to_string(e.port())},
                           {"timeout_ms", std::to_string(timeout_ms)}}});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

}  // namespace xsilo::testing
