// SigV4 against the examples AWS publishes in the S3 API reference
// ("Signature Calculations for the Authorization Header" and
// "Authenticating Requests: Using Query Parameters").
#include "s3/sigv4.h"

#include <gtest/gtest.h>

#include "net/crypto.h"

namespace xsilo::s3 {
namespace {

constexpr std::string_view kSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
constexpr std::string_view kDate = "20130524T000000Z";
constexpr std::string_view kHost = "examplebucket.s3.amazonaws.com";

std::string Sign(std::string_view method, std::string uri, std::string query, Params headers,
                 std::string payload, std::string* canonical_hash = nullptr) {
  CanonicalRequestParts p;
  p.method = method;
  p.canonical_uri = std::move(uri);
  p.canonical_query = std::move(query);
  p.headers = std::move(headers);
  p.payload_hash = std::move(payload);
  std::string creq = CanonicalRequest(p, nullptr);
  if (canonical_hash) *canonical_hash = net::Hex(net::Sha256(creq));
  std::string scope = CredentialScope("20130524", "us-east-1", "s3");
  return Signature(kSecret, "20130524", "us-east-1", "s3", StringToSign(kDate, scope, creq));
}

TEST(SigV4, GetObjectExample) {
  std::string creq_hash;
  std::string sig = Sign("GET", CanonicalUri("/test.txt"), "",
                         {{"host", std::string(kHost)},
                          {"range", "bytes=0-9"},
                          {"x-amz-content-sha256", std::string(net::kEmptySha256Hex)},
                          {"x-amz-date", std::string(kDate)}},
                         std::string(net::kEmptySha256Hex), &creq_hash);
  EXPECT_EQ(creq_hash, "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(sig, "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(SigV4, PutObjectExample) {
  std::string payload = net::Hex(net::Sha256("Welcome to Amazon S3."));
  EXPECT_EQ(payload, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  // Header names arrive mixed-case and unsorted; the canonical form fixes both.
  std::string sig = Sign("PUT", CanonicalUri("/test$file.text"), "",
                         {{"x-amz-storage-class", "REDUCED_REDUNDANCY"},
                          {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                          {"Host", std::string(kHost)},
                          {"x-amz-date", std::string(kDate)},
                          {"x-amz-content-sha256", payload}},
                         payload);
  EXPECT_EQ(CanonicalUri("/test$file.text"), "/test%24file.text");
  EXPECT_EQ(sig, "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(SigV4, ListObjectsExampleSortsQuery) {
  Params q;
  ASSERT_TRUE(ParseQuery("prefix=J&max-keys=2", &q));
  EXPECT_EQ(CanonicalQuery(q), "max-keys=2&prefix=J");
  std::string sig = Sign("GET", "/", CanonicalQuery(q),
                         {{"host", std::string(kHost)},
                          {"x-amz-content-sha256", std::string(net::kEmptySha256Hex)},
                          {"x-amz-date", std::string(kDate)}},
                         std::string(net::kEmptySha256Hex));
  EXPECT_EQ(sig, "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(SigV4, LifecycleExampleValuelessParameter) {
  Params q;
  ASSERT_TRUE(ParseQuery("lifecycle", &q));
  EXPECT_EQ(CanonicalQuery(q), "lifecycle=");
  std::string sig = Sign("GET", "/", CanonicalQuery(q),
                         {{"host", std::string(kHost)},
                          {"x-amz-content-sha256", std::string(net::kEmptySha256Hex)},
                          {"x-amz-date", std::string(kDate)}},
                         std::string(net::kEmptySha256Hex));
  EXPECT_EQ(sig, "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(SigV4, PresignedGetExample) {
  Params q = {{"X-Amz-Algorithm", "AWS4-HMAC-SHA256"},
              {"X-Amz-Credential", "AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request"},
              {"X-Amz-Date", std::string(kDate)},
              {"X-Amz-Expires", "86400"},
              {"X-Amz-SignedHeaders", "host"}};
  std::string sig = Sign("GET", "/test.txt", CanonicalQuery(q), {{"host", std::string(kHost)}},
                         std::string(kUnsignedPayload));
  EXPECT_EQ(sig, "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404");
}

TEST(SigV4, UriEncodingKeepsSlashesAndUnreserved) {
  EXPECT_EQ(UriEncode("a b/c~d_e-f.g+h=", false), "a%20b/c~d_e-f.g%2Bh%3D");
  EXPECT_EQ(UriEncode("a/b"), "a%2Fb");
  EXPECT_EQ(UriEncode("\xc3\xa9"), "%C3%A9");
  std::string out;
  EXPECT_TRUE(UriDecode("a%20b%2fc+", &out));
  EXPECT_EQ(out, "a b/c+");
  EXPECT_FALSE(UriDecode("bad%2", &out));
  EXPECT_FALSE(UriDecode("bad%zz", &out));
}

TEST(SigV4, HeaderValuesAreTrimmedAndCollapsed) {
  EXPECT_EQ(CanonicalHeaderValue("  a   b  c "), "a b c");
}

TEST(SigV4, AmzDateRoundTrip) {
  std::time_t t = 0;
  ASSERT_TRUE(ParseAmzDate("20130524T000000Z", &t));
  EXPECT_EQ(t, 1369353600);
  EXPECT_EQ(FormatAmzDate(t), "20130524T000000Z");
  EXPECT_EQ(FormatHttpDate(t), "Fri, 24 May 2013 00:00:00 GMT");
  EXPECT_FALSE(ParseAmzDate("2013-05-24T00:00Z", &t));
  EXPECT_FALSE(ParseAmzDate("20131324T000000Z", &t));
}

TEST(SigV4, ParsesAuthorizationHeader) {
  SigV4Auth a;
  ASSERT_TRUE(ParseAuthorizationHeader(
                  "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
                  "aws4_request, SignedHeaders=host;range;x-amz-date,Signature=abc",
                  &a)
                  .ok());
  EXPECT_EQ(a.access_key, "AKIAIOSFODNN7EXAMPLE");
  EXPECT_EQ(a.region, "us-east-1");
  EXPECT_EQ(a.signed_headers, (std::vector<std::string>{"host", "range", "x-amz-date"}));
  EXPECT_EQ(a.signature, "abc");
  EXPECT_FALSE(ParseAuthorizationHeader("AWS4-HMAC-SHA256 Credential=x", &a).ok());
  EXPECT_FALSE(ParseAuthorizationHeader("Basic dXNlcjpwYXNz", &a).ok());
}

}  // namespace
}  // namespace xsilo::s3
