// aws-chunked uploads with signed chunks (x-amz-content-sha256:
// STREAMING-AWS4-HMAC-SHA256-PAYLOAD), as SDKs send them over plain HTTP.
// The first test replays AWS's own published example request (Signature
// Version 4 documentation, "Transferring Payload in Multiple Chunks"): its
// seed and chunk signatures were computed by AWS, so the server's chunk
// verification is checked against S3's, not against itself. The others sign
// their chunks with the library's Signature() and break them one way each.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "net/crypto.h"
#include "s3/raw_http.h"
#include "s3/sigv4.h"
#include "xsilo/s3/server.h"

namespace xsilo {
namespace {

using s3::testing::RawExchange;
using s3::testing::RawResponse;
using s3::testing::SignedRequest;

constexpr const char* kAwsAk = "AKIAIOSFODNN7EXAMPLE";
constexpr const char* kAwsSk = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
constexpr const char* kStreaming = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";

class ChunkedUploadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    S3ServerOptions o;
    o.access_key = kAwsAk;
    o.secret_key = kAwsSk;
    o.buckets = {"examplebucket"};
    // The example was signed on 2013-05-24.
    o.max_clock_skew = std::chrono::hours(24 * 366 * 40);
    auto s = S3Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    port_ = server_->port();
  }
  RawResponse Get(const std::string& path) {
    return RawExchange(port_, SignedRequest(port_, "GET", path, "", "", kAwsAk, kAwsSk));
  }

  // A signed aws-chunked PUT of `chunks` to `path`, signed now; `mutate`
  // may change the encoded body after signing.
  std::string ChunkedPut(const std::string& path, const std::vector<std::string>& chunks,
                         uint64_t decoded_length, std::string* body_out = nullptr) {
    const std::time_t now = std::time(nullptr);
    std::string head =
        SignedRequest(port_, "PUT", path, "", "", kAwsAk, kAwsSk, "us-east-1", kStreaming, "", now);
    const size_t at = head.find("Signature=") + 10;
    std::string previous = head.substr(at, 64);
    const std::string amz_date = s3::FormatAmzDate(now);
    const std::string date = amz_date.substr(0, 8);
    const std::string scope = s3::CredentialScope(date, "us-east-1", "s3");
    std::string body;
    for (const std::string& c : chunks) {
      const std::string to_sign = "AWS4-HMAC-SHA256-PAYLOAD\n" + amz_date + "\n" + scope + "\n" +
                                  previous + "\n" + std::string(net::kEmptySha256Hex) + "\n" +
                                  net::Hex(net::Sha256(std::string_view(c)));
      previous = s3::Signature(kAwsSk, date, "us-east-1", "s3", to_sign);
      char size[32];
      std::snprintf(size, sizeof(size), "%zx", c.size());
      body += std::string(size) + ";chunk-signature=" + previous + "\r\n" + c + "\r\n";
    }
    if (body_out) *body_out = body;
    // SignedRequest ends with the header block and an empty body.
    head.resize(head.find("Content-Length: "));
    return head + "Content-Length: " + std::to_string(body.size()) +
           "\r\nx-amz-decoded-content-length: " + std::to_string(decoded_length) +
           "\r\nContent-Encoding: aws-chunked\r\nConnection: close\r\n\r\n" + body;
  }

  std::unique_ptr<S3Server> server_;
  int port_ = 0;
};

TEST_F(ChunkedUploadTest, AwsPublishedExampleIsAccepted) {
  const std::string a64k(65536, 'a'), a1k(1024, 'a');
  const std::string body =
      "10000;chunk-signature=ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648\r\n" +
      a64k +
      "\r\n400;chunk-signature="
      "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497\r\n" +
      a1k +
      "\r\n0;chunk-signature="
      "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9\r\n\r\n";
  ASSERT_EQ(body.size(), 66824u);
  const std::string head =
      "PUT /examplebucket/chunkObject.txt HTTP/1.1\r\n"
      "Host: s3.amazonaws.com\r\n"
      "x-amz-date: 20130524T000000Z\r\n"
      "x-amz-storage-class: REDUCED_REDUNDANCY\r\n"
      "Authorization: AWS4-HMAC-SHA256 "
      "Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
      "SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
      "x-amz-decoded-content-length;x-amz-storage-class,"
      "Signature=4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9\r\n"
      "x-amz-content-sha256: STREAMING-AWS4-HMAC-SHA256-PAYLOAD\r\n"
      "Content-Encoding: aws-chunked\r\n"
      "x-amz-decoded-content-length: 66560\r\n"
      "Content-Length: 66824\r\n"
      "Connection: close\r\n\r\n";
  // One byte of the first chunk changed: the request's own signature holds
  // (it covers the headers), the first chunk's does not; nothing is stored.
  std::string tampered = body;
  tampered[200] = 'b';
  RawResponse bad = RawExchange(port_, head + tampered);
  EXPECT_EQ(bad.status, 403) << bad.body;
  EXPECT_NE(bad.body.find("SignatureDoesNotMatch"), std::string::npos) << bad.body;
  EXPECT_NE(bad.body.find("chunk signature"), std::string::npos) << bad.body;
  EXPECT_EQ(Get("/examplebucket/chunkObject.txt").status, 404);

  RawResponse put = RawExchange(port_, head + body);
  ASSERT_EQ(put.status, 200) << put.head << put.body;
  RawResponse got = Get("/examplebucket/chunkObject.txt");
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.body, a64k + a1k);
  // aws-chunked describes the upload, not the object.
  EXPECT_EQ(got.Header("content-encoding"), "");
}

// Each chunk's signature chains from the one before: chunks that are each
// signed correctly, but in another order, are refused at the first one out
// of place.
TEST_F(ChunkedUploadTest, ChunksOutOfTheirChainAreRefused) {
  std::string body;
  std::string req = ChunkedPut("/examplebucket/k", {"first", "second", ""}, 11, &body);
  const std::string first = body.substr(0, body.find("first") + 7);  // header, bytes, CRLF
  const std::string rest = body.substr(first.size());
  const std::string second = rest.substr(0, rest.find("second") + 8);
  const std::string last = rest.substr(second.size());
  req.replace(req.size() - body.size(), body.size(), second + first + last);
  RawResponse r = RawExchange(port_, req);
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_NE(r.body.find("chunk signature"), std::string::npos) << r.body;
  EXPECT_EQ(Get("/examplebucket/k").status, 404);
  // The same chunks in their order are accepted.
  req.replace(req.size() - body.size(), body.size(), body);
  r = RawExchange(port_, req);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Get("/examplebucket/k").body, "firstsecond");
}

TEST_F(ChunkedUploadTest, ChunksSignedNowRoundTrip) {
  const std::string a(100000, 'x'), b(37, 'y');
  RawResponse put = RawExchange(port_, ChunkedPut("/examplebucket/k", {a, b, ""}, a.size() + 37));
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(Get("/examplebucket/k").body, a + b);
  RawResponse empty = RawExchange(port_, ChunkedPut("/examplebucket/e", {""}, 0));
  ASSERT_EQ(empty.status, 200) << empty.body;
  RawResponse got = Get("/examplebucket/e");
  EXPECT_EQ(got.status, 200);
  EXPECT_EQ(got.body, "");
}

TEST_F(ChunkedUploadTest, BrokenFramingIsRefusedAndStoresNothing) {
  // The decoded length does not add up.
  RawResponse r = RawExchange(port_, ChunkedPut("/examplebucket/k", {"abc", ""}, 4));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("IncompleteBody"), std::string::npos) << r.body;
  // No final chunk.
  r = RawExchange(port_, ChunkedPut("/examplebucket/k", {"abc"}, 3));
  EXPECT_EQ(r.status, 400) << r.body;
  // A chunk that claims more bytes than follow.
  std::string req = ChunkedPut("/examplebucket/k", {"abcd", ""}, 4);
  req.replace(req.find("\r\n\r\n") + 4, 1, "9");
  r = RawExchange(port_, req);
  EXPECT_EQ(r.status, 400) << r.body;
  // Without x-amz-decoded-content-length.
  req = ChunkedPut("/examplebucket/k", {"abc", ""}, 3);
  req.replace(req.find("x-amz-decoded-content-length"), 28, "x-amz-decoded-content-lengtx");
  r = RawExchange(port_, req);
  EXPECT_EQ(r.status, 411) << r.body;
  // The signed-trailer variant is not implemented (the unsigned one is:
  // integrity_test.cpp).
  r = RawExchange(
      port_, SignedRequest(port_, "PUT", "/examplebucket/k", "", "3\r\nabc\r\n0\r\n\r\n", kAwsAk,
                           kAwsSk, "us-east-1", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
                           "x-amz-decoded-content-length: 3\r\n"));
  EXPECT_EQ(r.status, 501) << r.body;
  EXPECT_EQ(Get("/examplebucket/k").status, 404);
}

}  // namespace
}  // namespace xsilo
