// The embedded S3 server over HTTPS: a self-signed pair made by
// GenerateSelfSignedCertificate, our client verifying it through ca_file,
// presigned URLs over https fetched without credentials, and the ways a
// TLS connection must fail: an unknown CA, a certificate for another host,
// plain HTTP to the TLS port, a key that does not match.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "s3/raw_http.h"
#include "xsilo/core/codec.h"
#include "xsilo/s3/client.h"
#include "xsilo/s3/server.h"

namespace xsilo {
namespace {

namespace fs = std::filesystem;

constexpr const char* kAk = "tls-ak";
constexpr const char* kSk = "tls-sk";

Buffer Pattern(uint64_t n, uint64_t seed) {
  Buffer b = *Buffer::Allocate(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b.mutable_data()[i] = static_cast<uint8_t>(x);
  }
  return b;
}

class TlsTest : public ::testing::TestWithParam<bool> {  // param: directory storage
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("xsilo-tls-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    cert_ = (dir_ / "cert.pem").string();
    key_ = (dir_ / "key.pem").string();
    ASSERT_TRUE(GenerateSelfSignedCertificate(cert_, key_, {"127.0.0.1", "localhost"}).ok());
    S3ServerOptions o;
    o.access_key = kAk;
    o.secret_key = kSk;
    o.buckets = {"bkt"};
    o.tls_cert_file = cert_;
    o.tls_key_file = key_;
    if (GetParam()) o.directory = (dir_ / "objects").string();
    auto s = S3Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }
  std::unique_ptr<S3Client> Client(const std::string& ca_file, bool verify = true) {
    S3ClientOptions co;
    co.endpoint = server_->endpoint();
    co.credentials = StaticCredentials({kAk, kSk});
    co.ca_file = ca_file;
    co.verify_tls = verify;
    co.max_retries = 0;
    co.connect_timeout = std::chrono::seconds(10);
    auto c = S3Client::Create(co);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(c).value();
  }

  fs::path dir_;
  std::string cert_, key_;
  std::unique_ptr<S3Server> server_;
};

TEST_P(TlsTest, RoundTripsVerifiedAgainstTheCaFile) {
  EXPECT_EQ(server_->endpoint().rfind("https://127.0.0.1:", 0), 0u) << server_->endpoint();
  auto client = Client(cert_);
  // Small, multipart (4 parts in flight) and a parallel ranged download.
  Buffer small = Pattern(1000, 1);
  GatherList g1;
  g1.Append(small);
  ASSERT_TRUE(client->PutObject({.bucket = "bkt", .key = "small", .body = g1}).ok());
  auto got = client->GetObject({.bucket = "bkt", .key = "small"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->data.view(), small.view());
  Buffer big = Pattern(24ull << 20, 2);
  GatherList g2;
  g2.Append(big);
  auto up = client->UploadObject(
      {.bucket = "bkt", .key = "big", .body = g2, .part_size = 5ull << 20, .concurrency = 4});
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  auto down = client->DownloadObject({.bucket = "bkt", .key = "big", .connections = 6});
  ASSERT_TRUE(down.ok()) << down.status().ToString();
  EXPECT_EQ(Checksum(down->data.span()), Checksum(big.span()));
  // Presigned over https, fetched without credentials: whole and by ranges.
  auto url = client->PresignUrl({.method = "GET", .bucket = "bkt", .key = "big"});
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(url->rfind("https://", 0), 0u) << *url;
  auto whole = HttpGetUrl(*url, std::chrono::minutes(2), UrlTlsOptions{.ca_file = cert_});
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(Checksum(whole->span()), Checksum(big.span()));
  UrlDownloadArgs ranges;
  ranges.url = *url;
  ranges.size = big.size();
  ranges.connections = 4;
  ranges.tls.ca_file = cert_;
  auto ranged = HttpGetUrlRanges(ranges);
  ASSERT_TRUE(ranged.ok()) << ranged.status().ToString();
  EXPECT_EQ(Checksum(ranged->data.span()), Checksum(big.span()));
  // A presigned PUT over https.
  auto put_url = client->PresignUrl({.method = "PUT", .bucket = "bkt", .key = "by-url"});
  ASSERT_TRUE(put_url.ok());
  ASSERT_TRUE(
      HttpPutUrl(*put_url, g1, std::chrono::minutes(1), UrlTlsOptions{.ca_file = cert_}).ok());
  auto back = client->GetObject({.bucket = "bkt", .key = "by-url"});
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->data.view(), small.view());
}

TEST_P(TlsTest, AnUntrustedServerIsRefused) {
  // The system's roots do not include our self-signed certificate.
  auto untrusted = Client("");
  auto r = untrusted->GetObject({.bucket = "bkt", .key = "any"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
  auto url = Client(cert_)->PresignUrl({.method = "GET", .bucket = "bkt", .key = "any"});
  ASSERT_TRUE(url.ok());
  auto fetched = HttpGetUrl(*url, std::chrono::seconds(30));
  ASSERT_FALSE(fetched.ok());
  EXPECT_EQ(fetched.status().code(), StatusCode::kPermissionDenied) << fetched.status().ToString();
  // A certificate for another host, trusted as a CA but not naming 127.0.0.1.
  const std::string other_cert = (dir_ / "other.pem").string();
  ASSERT_TRUE(GenerateSelfSignedCertificate(other_cert, (dir_ / "other-key.pem").string(),
                                            {"example.invalid"})
                  .ok());
  auto wrong = Client(other_cert)->GetObject({.bucket = "bkt", .key = "any"});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied) << wrong.status().ToString();
}

TEST_P(TlsTest, PlainHttpToTheTlsPortFailsAndTheServerGoesOn) {
  s3::testing::RawResponse r = s3::testing::RawExchange(
      server_->port(), "GET /bkt/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 5000);
  EXPECT_NE(r.status, 200);
  auto client = Client(cert_);
  GatherList g;
  Buffer b = Pattern(10, 3);
  g.Append(b);
  EXPECT_TRUE(client->PutObject({.bucket = "bkt", .key = "after", .body = g}).ok());
}

TEST(TlsOptions, ABadPairIsRefusedAtStart) {
  const fs::path dir = fs::temp_directory_path() / ("xsilo-tls-bad-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string a = (dir / "a.pem").string(), ak = (dir / "a-key.pem").string();
  const std::string b = (dir / "b.pem").string(), bk = (dir / "b-key.pem").string();
  ASSERT_TRUE(GenerateSelfSignedCertificate(a, ak, {"127.0.0.1"}).ok());
  ASSERT_TRUE(GenerateSelfSignedCertificate(b, bk, {"127.0.0.1"}).ok());
  EXPECT_EQ(fs::status(ak).permissions() & fs::perms::others_read, fs::perms::none);
  S3ServerOptions o;
  o.access_key = kAk;
  o.secret_key = kSk;
  o.tls_cert_file = a;
  o.tls_key_file = bk;  // another pair's key
  auto s = S3Server::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("does not match"), std::string::npos) << s.status().message();
  o.tls_key_file = "";
  EXPECT_EQ(S3Server::Start(o).status().code(), StatusCode::kInvalidArgument);
  o.tls_key_file = (dir / "missing.pem").string();
  EXPECT_EQ(S3Server::Start(o).status().code(), StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Storage, TlsTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Directory" : "Memory"; });

}  // namespace
}  // namespace xsilo
