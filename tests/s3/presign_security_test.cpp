// Presigned URLs made by our client, checked by our server: any change to
// what was signed (key, method, expiry, signing date, the part number or
// upload id of a multipart part) is refused with 403, and so is a URL past
// its expiry. Expired URLs are signed at a time in the past (hours away from
// the boundary), never by waiting for the clock.
//
// What is not signed: the Range header. A presigned GET covers every range
// of its object (docs/s3.md), as S3's does when "range" is not among the
// signed headers; ranged downloads by credential-less parties rely on it.
#include <gtest/gtest.h>

#include <ctime>
#include <string>

#include "s3/raw_http.h"
#include "xsilo/s3/client.h"
#include "xsilo/s3/server.h"

namespace xsilo {
namespace {

using s3::testing::RawExchange;
using s3::testing::RawResponse;
using s3::testing::SignedRequest;

constexpr const char* kAk = "presign-access";
constexpr const char* kSk = "presign-secret";

class PresignSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    S3ServerOptions o;
    o.access_key = kAk;
    o.secret_key = kSk;
    o.buckets = {"bkt"};
    o.min_part_bytes = 1;
    auto s = S3Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    port_ = server_->port();
    S3ClientOptions c;
    c.endpoint = server_->endpoint();
    c.addressing = S3Addressing::kPath;
    c.credentials = StaticCredentials({kAk, kSk});
    auto client = S3Client::Create(c);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(client).value();
    ASSERT_EQ(Put("obj", "the signed object"), 200);
    ASSERT_EQ(Put("other", "another object"), 200);
  }

  int Put(const std::string& key, const std::string& body) {
    return RawExchange(port_, SignedRequest(port_, "PUT", "/bkt/" + key, "", body, kAk, kSk))
        .status;
  }
  RawResponse Get(const std::string& key) {
    return RawExchange(port_, SignedRequest(port_, "GET", "/bkt/" + key, "", "", kAk, kSk));
  }

  std::string Presign(const std::string& method, const std::string& key,
                      std::chrono::seconds expires = std::chrono::seconds(3600),
                      std::time_t signing_time = 0,
                      std::vector<std::pair<std::string, std::string>> query = {}) {
    PresignArgs a;
    a.method = method;
    a.bucket = "bkt";
    a.key = key;
    a.expires = expires;
    a.signing_time = signing_time;
    a.query = std::move(query);
    auto url = client_->PresignUrl(a);
    EXPECT_TRUE(url.ok()) << url.status().ToString();
    return url.ok() ? *url : "";
  }

  // Sends `method` to the path and query of `url` on our server.
  RawResponse Use(const std::string& method, const std::string& url, const std::string& body = "",
                  const std::string& extra_headers = "") {
    const std::string prefix = server_->endpoint();
    EXPECT_EQ(url.compare(0, prefix.size(), prefix), 0) << url;
    std::string target = url.substr(prefix.size());
    std::string req = method + " " + target +
                      " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port_) + "\r\n" +
                      extra_headers;
    if (method == "PUT" || method == "POST") {
      req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    }
    return RawExchange(port_, req + "\r\n" + body);
  }

  static std::string Replace(std::string s, const std::string& from, const std::string& to) {
    size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from << " not in " << s;
    if (at != std::string::npos) s.replace(at, from.size(), to);
    return s;
  }

  static void ExpectDenied(const RawResponse& r, const std::string& code) {
    EXPECT_EQ(r.status, 403) << r.head << r.body;
    EXPECT_NE(r.body.find("<Code>" + code + "</Code>"), std::string::npos) << r.body;
  }

  std::unique_ptr<S3Server> server_;
  std::unique_ptr<S3Client> client_;
  int port_ = 0;
};

TEST_F(PresignSecurityTest, AnUntouchedUrlWorksForAnyRange) {
  const std::string url = Presign("GET", "obj");
  RawResponse whole = Use("GET", url);
  EXPECT_EQ(whole.status, 200);
  EXPECT_EQ(whole.body, "the signed object");
  RawResponse part = Use("GET", url, "", "Range: bytes=4-9\r\n");
  EXPECT_EQ(part.status, 206);
  EXPECT_EQ(part.body, "signed");
}

TEST_F(PresignSecurityTest, AnotherKeyIsRefused) {
  const std::string url = Presign("GET", "obj");
  ExpectDenied(Use("GET", Replace(url, "/bkt/obj?", "/bkt/other?")), "SignatureDoesNotMatch");
  ExpectDenied(Use("GET", Replace(url, "/bkt/obj?", "/bkt/obj2?")), "SignatureDoesNotMatch");
  ExpectDenied(Use("GET", Replace(url, "/bkt/obj?", "/bkt/%6Fbj/../obj?")),
               "SignatureDoesNotMatch");

  // A PUT URL for one key cannot write another: the other stays as it was.
  const std::string put = Presign("PUT", "obj");
  ExpectDenied(Use("PUT", Replace(put, "/bkt/obj?", "/bkt/other?"), "overwritten"),
               "SignatureDoesNotMatch");
  ExpectDenied(Use("PUT", Replace(put, "/bkt/obj?", "/bkt/new?"), "created"),
               "SignatureDoesNotMatch");
  EXPECT_EQ(Get("other").body, "another object");
  EXPECT_EQ(Get("new").status, 404);
  EXPECT_EQ(Use("PUT", put, "replaced").status, 200);  // the untouched URL still works
  EXPECT_EQ(Get("obj").body, "replaced");
}

TEST_F(PresignSecurityTest, AnotherMethodIsRefused) {
  const std::string get = Presign("GET", "obj");
  ExpectDenied(Use("PUT", get, "overwritten"), "SignatureDoesNotMatch");
  ExpectDenied(Use("DELETE", get), "SignatureDoesNotMatch");
  ExpectDenied(Use("POST", Replace(get, "?", "?uploads&")), "SignatureDoesNotMatch");
  RawResponse head = Use("HEAD", get);
  EXPECT_EQ(head.status, 403) << head.head;
  EXPECT_EQ(Get("obj").body, "the signed object");

  const std::string put = Presign("PUT", "obj");
  ExpectDenied(Use("GET", put), "SignatureDoesNotMatch");
  ExpectDenied(Use("DELETE", put), "SignatureDoesNotMatch");
  EXPECT_EQ(Get("obj").body, "the signed object");
}

TEST_F(PresignSecurityTest, AChangedExpiryOrSigningDateIsRefused) {
  const std::time_t now = std::time(nullptr);
  const std::string url = Presign("GET", "obj", std::chrono::seconds(600));
  ExpectDenied(Use("GET", Replace(url, "X-Amz-Expires=600", "X-Amz-Expires=604800")),
               "SignatureDoesNotMatch");
  ExpectDenied(Use("GET", Replace(url, "X-Amz-Expires=600", "X-Amz-Expires=60")),
               "SignatureDoesNotMatch");

  // Moving the signing date forward to revive an old URL breaks the signature.
  const std::time_t old_time = now - 2 * 3600;
  const std::string old = Presign("GET", "obj", std::chrono::seconds(3600), old_time);
  ExpectDenied(Use("GET", old), "AccessDenied");
  char fresh_date[17], old_date[17];
  std::tm tm{};
  gmtime_r(&old_time, &tm);
  std::strftime(old_date, sizeof(old_date), "%Y%m%dT%H%M%SZ", &tm);
  gmtime_r(&now, &tm);
  std::strftime(fresh_date, sizeof(fresh_date), "%Y%m%dT%H%M%SZ", &tm);
  std::string revived =
      Replace(old, std::string("X-Amz-Date=") + old_date, std::string("X-Amz-Date=") + fresh_date);
  if (std::string(old_date, 8) != std::string(fresh_date, 8)) {
    // Across midnight the credential scope names the old day.
    revived = Replace(revived, std::string("%2F") + std::string(old_date, 8) + "%2F",
                      std::string("%2F") + std::string(fresh_date, 8) + "%2F");
  }
  ExpectDenied(Use("GET", revived), "SignatureDoesNotMatch");
  // Dropping the signature turns it into an anonymous request: refused too.
  ExpectDenied(Use("GET", url.substr(0, url.find("&X-Amz-Signature="))), "AccessDenied");
}

TEST_F(PresignSecurityTest, AnExpiredUrlIsRefusedForEveryMethod) {
  const std::time_t two_hours_ago = std::time(nullptr) - 2 * 3600;
  const auto hour = std::chrono::seconds(3600);
  RawResponse get = Use("GET", Presign("GET", "obj", hour, two_hours_ago));
  ExpectDenied(get, "AccessDenied");
  EXPECT_NE(get.body.find("Request has expired"), std::string::npos) << get.body;
  ExpectDenied(Use("PUT", Presign("PUT", "obj", hour, two_hours_ago), "late"), "AccessDenied");
  ExpectDenied(Use("DELETE", Presign("DELETE", "obj", hour, two_hours_ago)), "AccessDenied");
  EXPECT_EQ(Get("obj").body, "the signed object");
  // Signed in the future (beyond the allowed clock skew): not valid yet.
  RawResponse early = Use("GET", Presign("GET", "obj", hour, std::time(nullptr) + 2 * 3600));
  ExpectDenied(early, "AccessDenied");
  // The client refuses to sign an expiry S3 would not accept.
  PresignArgs a{.method = "GET", .bucket = "bkt", .key = "obj"};
  a.expires = std::chrono::seconds(604801);
  EXPECT_EQ(client_->PresignUrl(a).status().code(), StatusCode::kInvalidArgument);
}

// The URLs of an upload grant: each part URL is bound to its part number
// and upload id, the completion URL to its upload id.
TEST_F(PresignSecurityTest, AGrantPartUrlIsBoundToItsPartAndUpload) {
  auto upload = client_->CreateMultipartUpload({.bucket = "bkt", .key = "granted"});
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();
  auto other = client_->CreateMultipartUpload({.bucket = "bkt", .key = "granted"});
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  const std::string part1 = Presign("PUT", "granted", std::chrono::seconds(3600), 0,
                                    {{"partNumber", "1"}, {"uploadId", *upload}});
  ExpectDenied(Use("PUT", Replace(part1, "partNumber=1", "partNumber=2"), "x"),
               "SignatureDoesNotMatch");
  ExpectDenied(Use("PUT", Replace(part1, *upload, *other), "x"), "SignatureDoesNotMatch");
  ExpectDenied(Use("PUT", Replace(part1, "/bkt/granted?", "/bkt/obj?"), "x"),
               "SignatureDoesNotMatch");
  RawResponse ok = Use("PUT", part1, "part one");
  ASSERT_EQ(ok.status, 200) << ok.body;

  const std::string complete =
      Presign("POST", "granted", std::chrono::seconds(3600), 0, {{"uploadId", *upload}});
  const std::string xml = CompleteMultipartXml({ok.Header("etag")});
  ExpectDenied(Use("POST", Replace(complete, *upload, *other), xml), "SignatureDoesNotMatch");
  ExpectDenied(Use("PUT", complete, xml), "SignatureDoesNotMatch");
  EXPECT_EQ(Get("granted").status, 404);
  EXPECT_EQ(Use("POST", complete, xml).status, 200);
  EXPECT_EQ(Get("granted").body, "part one");
  EXPECT_TRUE(client_->AbortMultipartUpload({.bucket = "bkt", .key = "granted"}, *other).ok());
}

// An upload grant whose URLs have expired uploads nothing: its part and
// completion URLs (signed two hours ago for one hour, as a grant handed out
// then would be) are refused, and the object never appears.
TEST_F(PresignSecurityTest, AnExpiredGrantCannotUpload) {
  auto upload = client_->CreateMultipartUpload({.bucket = "bkt", .key = "late"});
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();
  const std::time_t two_hours_ago = std::time(nullptr) - 2 * 3600;
  const auto hour = std::chrono::seconds(3600);
  UrlUploadArgs up;
  up.part_urls = {
      Presign("PUT", "late", hour, two_hours_ago, {{"partNumber", "1"}, {"uploadId", *upload}})};
  up.complete_url = Presign("POST", "late", hour, two_hours_ago, {{"uploadId", *upload}});
  GatherList body;
  body.Append(Buffer::CopyFrom("too late"));
  up.body = body;
  up.min_part_bytes = 1;
  auto parts = HttpPutUrlParts(up);
  EXPECT_EQ(parts.status().code(), StatusCode::kPermissionDenied) << parts.status().ToString();
  ExpectDenied(Use("PUT", up.part_urls[0], "too late"), "AccessDenied");
  ExpectDenied(Use("POST", up.complete_url, CompleteMultipartXml({"\"x\""})), "AccessDenied");
  // A single-PUT grant, expired.
  Status put = HttpPutUrl(Presign("PUT", "late", hour, two_hours_ago), body);
  EXPECT_EQ(put.code(), StatusCode::kPermissionDenied) << put.ToString();
  EXPECT_EQ(Get("late").status, 404);
  EXPECT_TRUE(client_->AbortMultipartUpload({.bucket = "bkt", .key = "late"}, *upload).ok());
}

// SigV4 binds a signature to its server through the signed host header;
// a request or URL whose SignedHeaders leave host out is refused, whatever
// else it signed correctly.
TEST_F(PresignSecurityTest, ASignatureThatLeavesOutHostIsRefused) {
  using namespace s3;
  const std::string host = "127.0.0.1:" + std::to_string(port_);
  const std::string amz_date = FormatAmzDate(std::time(nullptr));
  const std::string date = amz_date.substr(0, 8);
  const std::string scope = CredentialScope(date, "us-east-1", "s3");
  {
    CanonicalRequestParts p;
    p.method = "GET";
    p.canonical_uri = CanonicalUri("/bkt/obj");
    p.headers = {{"x-amz-date", amz_date}, {"x-amz-content-sha256", "UNSIGNED-PAYLOAD"}};
    p.payload_hash = "UNSIGNED-PAYLOAD";
    std::string signed_headers;
    const std::string creq = CanonicalRequest(p, &signed_headers);
    ASSERT_EQ(signed_headers.find("host"), std::string::npos);
    const std::string sig =
        Signature(kSk, date, "us-east-1", "s3", StringToSign(amz_date, scope, creq));
    RawResponse r = RawExchange(
        port_, "GET /bkt/obj HTTP/1.1\r\nHost: " + host + "\r\nx-amz-date: " + amz_date +
                   "\r\nx-amz-content-sha256: UNSIGNED-PAYLOAD\r\nAuthorization: "
                   "AWS4-HMAC-SHA256 Credential=" +
                   std::string(kAk) + "/" + scope + ", SignedHeaders=" + signed_headers +
                   ", Signature=" + sig + "\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(r.status, 400) << r.head << r.body;
    EXPECT_NE(r.body.find("<Code>AuthorizationHeaderMalformed</Code>"), std::string::npos)
        << r.body;
    EXPECT_NE(r.body.find("SignedHeaders must include host"), std::string::npos) << r.body;
  }
  {
    Params q = {{"X-Amz-Algorithm", "AWS4-HMAC-SHA256"},
                {"X-Amz-Credential", std::string(kAk) + "/" + scope},
                {"X-Amz-Date", amz_date},
                {"X-Amz-Expires", "600"},
                {"X-Amz-SignedHeaders", "range"}};
    CanonicalRequestParts p;
    p.method = "GET";
    p.canonical_uri = CanonicalUri("/bkt/obj");
    p.canonical_query = CanonicalQuery(q);
    p.headers = {{"range", "bytes=0-3"}};
    p.payload_hash = std::string(kUnsignedPayload);
    const std::string sig = Signature(kSk, date, "us-east-1", "s3",
                                      StringToSign(amz_date, scope, CanonicalRequest(p, nullptr)));
    RawResponse r = RawExchange(
        port_, "GET " + p.canonical_uri + "?" + p.canonical_query + "&X-Amz-Signature=" + sig +
                   " HTTP/1.1\r\nHost: " + host + "\r\nRange: bytes=0-3\r\n\r\n");
    EXPECT_EQ(r.status, 400) << r.head << r.body;
    EXPECT_NE(r.body.find("<Code>AuthorizationQueryParametersError</Code>"), std::string::npos)
        << r.body;
  }
}

// A presigned URL is a bearer token until it expires: a failed transfer
// through one names its host and path, never its signed query.
TEST_F(PresignSecurityTest, AFailedTransferByUrlDoesNotQuoteTheSignature) {
  const std::string url = Presign("PUT", "obj");
  const std::string signature = url.substr(url.find("X-Amz-Signature=") + 16);
  ASSERT_EQ(signature.size(), 64u) << url;
  server_.reset();  // nothing listens at the URL's port any more
  Buffer body = Buffer::CopyFrom(std::string("payload"));
  GatherList gather;
  gather.Append(std::move(body));
  Status put = HttpPutUrl(url, gather, std::chrono::milliseconds(5000));
  ASSERT_FALSE(put.ok());
  const std::string m = put.ToString();
  EXPECT_EQ(m.find("X-Amz-Signature"), std::string::npos) << m;
  EXPECT_EQ(m.find(signature), std::string::npos) << m;
  EXPECT_EQ(m.find("X-Amz-Credential"), std::string::npos) << m;
  EXPECT_NE(m.find("127.0.0.1:" + std::to_string(port_) + "/bkt/obj"), std::string::npos) << m;
  Result<Buffer> get = HttpGetUrl(url, std::chrono::milliseconds(5000));
  ASSERT_FALSE(get.ok());
  EXPECT_EQ(get.status().ToString().find(signature), std::string::npos) << get.status().ToString();
}

TEST(RedactSignedQuery, EverySecretParameterIsReplacedWhateverItsCase) {
  EXPECT_EQ(s3::RedactSignedQuery("GET http://h/b/k?X-Amz-Credential=AK%2F1&x-amz-signature=ab12 "
                                  "failed; X-AMZ-SECURITY-TOKEN=tok)"),
            "GET http://h/b/k?X-Amz-Credential=REDACTED&x-amz-signature=REDACTED "
            "failed; X-AMZ-SECURITY-TOKEN=REDACTED)");
  EXPECT_EQ(s3::RedactSignedQuery("no secret here"), "no secret here");
  EXPECT_EQ(s3::RedactUrl("https://h:9/b/k?X-Amz-Signature=ab"),
            "https://h:9/b/k?<signed query redacted>");
  EXPECT_EQ(s3::RedactUrl("https://h:9/b/k"), "https://h:9/b/k");
}

}  // namespace
}  // namespace xsilo
