// What the embedded S3 server promises about the bytes it stores, as S3
// clients check it: MD5 ETags (single part, per part, multipart), Content-MD5,
// the flexible checksums in headers and in aws-chunked trailers, and bodies
// framed by Transfer-Encoding: chunked. Every refusal stores nothing. The
// expected digests come from OpenSSL's MD5 in the test and from published
// check values, never from the server's own code paths.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "net/crypto.h"
#include "s3/checksums.h"
#include "s3/raw_http.h"
#include "s3/xml.h"
#include "xsilo/s3/server.h"

namespace xsilo {
namespace {

using s3::testing::RawExchange;
using s3::testing::RawResponse;
using s3::testing::SignedRequest;

constexpr const char* kAk = "integrity-ak";
constexpr const char* kSk = "integrity-sk";

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
std::string QuotedMd5(const std::string& s) { return "\"" + net::Hex(net::Md5(Bytes(s))) + "\""; }
std::string Base64Checksum(s3::ChecksumAlgorithm a, const std::string& s) {
  return net::Base64Of(s3::ComputeChecksum(a, Bytes(s)));
}

// The published check values of "123456789" (CRC catalogue; FIPS 180).
TEST(Checksums, CheckValues) {
  const std::string nine = "123456789";
  using A = s3::ChecksumAlgorithm;
  EXPECT_EQ(net::Hex(s3::ComputeChecksum(A::kCrc32, Bytes(nine))), "cbf43926");
  EXPECT_EQ(net::Hex(s3::ComputeChecksum(A::kCrc32c, Bytes(nine))), "e3069283");
  EXPECT_EQ(net::Hex(s3::ComputeChecksum(A::kCrc64Nvme, Bytes(nine))), "ae8b14860a799888");
  EXPECT_EQ(net::Hex(s3::ComputeChecksum(A::kSha1, Bytes(nine))),
            "f7c3bc1d808e04732adf679965ccc34ca7ae3441");
  EXPECT_EQ(net::Hex(s3::ComputeChecksum(A::kSha256, Bytes(nine))),
            "15e2b0d3c33891ebb0f1ef609ec419420c20e320ce94c65fbc8c3312448eb225");
}

// Fed in pieces of every size (and through the hardware CRC-32C and the
// 8-byte-at-a-time tables at every alignment), each algorithm gives what it
// gives in one call.
TEST(Checksums, IncrementalEqualsWhole) {
  std::string data(1000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  for (s3::ChecksumAlgorithm a : s3::kAllChecksumAlgorithms) {
    const auto whole = s3::ComputeChecksum(a, Bytes(data));
    for (size_t piece : {1u, 3u, 7u, 8u, 9u, 64u, 999u}) {
      s3::ChecksumStream s(a);
      for (size_t at = 0; at < data.size(); at += piece) {
        s.Update(data.data() + at, std::min(piece, data.size() - at));
      }
      EXPECT_EQ(s.Finish(), whole) << s3::ChecksumName(a) << " in pieces of " << piece;
    }
  }
  // The software CRC-32C gives what the dispatching one gives.
  EXPECT_EQ(s3::Crc32c(0, data.data(), data.size()),
            s3::Crc32c(s3::Crc32c(0, data.data(), 5), data.data() + 5, data.size() - 5));
}

class IntegrityTest : public ::testing::TestWithParam<bool> {  // param: directory storage
 protected:
  void SetUp() override { Start(true); }
  void Start(bool md5_etags) {
    server_.reset();
    S3ServerOptions o;
    o.access_key = kAk;
    o.secret_key = kSk;
    o.buckets = {"bkt"};
    o.max_object_bytes = 1 << 20;
    o.min_part_bytes = 1;
    o.md5_etags = md5_etags;
    if (GetParam()) {
      if (dir_.empty()) {
        dir_ = std::filesystem::temp_directory_path() /
               ("xsilo-integrity-test-" + std::to_string(::getpid()));
      }
      o.directory = dir_.string();
    }
    auto s = S3Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    port_ = server_->port();
  }
  void TearDown() override {
    server_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  RawResponse Signed(const std::string& method, const std::string& path,
                     const std::string& query = "", const std::string& body = "",
                     const std::string& extra = "",
                     const std::string& payload_hash = "UNSIGNED-PAYLOAD") {
    return RawExchange(port_, SignedRequest(port_, method, path, query, body, kAk, kSk, "us-east-1",
                                            payload_hash, extra));
  }
  // A signed request whose body goes with Transfer-Encoding: chunked, in
  // the given HTTP chunks (the final empty chunk is added).
  RawResponse ChunkedTransfer(const std::string& path, const std::vector<std::string>& chunks,
                              const std::string& extra = "") {
    std::string req =
        SignedRequest(port_, "PUT", path, "", "", kAk, kSk, "us-east-1", "UNSIGNED-PAYLOAD", extra);
    const size_t cl = req.find("Content-Length: 0\r\n");
    req.replace(cl, 19, "Transfer-Encoding: chunked\r\n");
    for (const std::string& c : chunks) {
      char size[32];
      std::snprintf(size, sizeof(size), "%zx", c.size());
      req += std::string(size) + "\r\n" + c + "\r\n";
    }
    return RawExchange(port_, req + "0\r\n\r\n");
  }
  std::string UploadId(const std::string& key, const std::string& extra = "") {
    RawResponse r = Signed("POST", "/bkt/" + key, "uploads=", "", extra);
    EXPECT_EQ(r.status, 200) << r.body;
    return s3::XmlText(r.body, "UploadId").value_or("");
  }

  std::filesystem::path dir_;
  std::unique_ptr<S3Server> server_;
  int port_ = 0;
};

TEST_P(IntegrityTest, SinglePartEtagIsTheMd5OfTheBytes) {
  RawResponse put = Signed("PUT", "/bkt/k", "", "hello world");
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(put.Header("etag"), QuotedMd5("hello world"));
  EXPECT_EQ(put.Header("etag"), "\"5eb63bbbe01eeed093cb22bb8f5acdc3\"");
  EXPECT_EQ(Signed("HEAD", "/bkt/k").Header("etag"), QuotedMd5("hello world"));
  EXPECT_EQ(Signed("PUT", "/bkt/empty").Header("etag"), "\"d41d8cd98f00b204e9800998ecf8427e\"");
  // Listed with the same ETag (XML-escaped quotes).
  RawResponse list = Signed("GET", "/bkt", "list-type=2");
  EXPECT_NE(list.body.find(net::Hex(net::Md5(Bytes("hello world")))), std::string::npos);
  // A server restarted on the same directory still has it.
  if (GetParam()) {
    Start(true);
    EXPECT_EQ(Signed("HEAD", "/bkt/k").Header("etag"), QuotedMd5("hello world"));
  }
}

TEST_P(IntegrityTest, MultipartEtagsAreMd5OfPartMd5s) {
  const std::string id = UploadId("mp");
  const std::string p1(3000, 'a'), p2 = "the last part";
  RawResponse r1 = Signed("PUT", "/bkt/mp", "partNumber=1&uploadId=" + id, p1);
  RawResponse r2 = Signed("PUT", "/bkt/mp", "partNumber=2&uploadId=" + id, p2);
  ASSERT_EQ(r1.status, 200) << r1.body;
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_EQ(r1.Header("etag"), QuotedMd5(p1));
  EXPECT_EQ(r2.Header("etag"), QuotedMd5(p2));
  std::string xml = "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>" +
                    r1.Header("etag") + "</ETag></Part><Part><PartNumber>2</PartNumber><ETag>" +
                    r2.Header("etag") + "</ETag></Part></CompleteMultipartUpload>";
  RawResponse done = Signed("POST", "/bkt/mp", "uploadId=" + id, xml);
  ASSERT_EQ(done.status, 200) << done.body;
  net::Md5Digest d1 = net::Md5(Bytes(p1)), d2 = net::Md5(Bytes(p2));
  std::string raw(reinterpret_cast<const char*>(d1.data()), 16);
  raw.append(reinterpret_cast<const char*>(d2.data()), 16);
  const std::string want = "\"" + net::Hex(net::Md5(Bytes(raw))) + "-2\"";
  EXPECT_EQ(s3::XmlText(done.body, "ETag").value_or(""), want);
  EXPECT_EQ(Signed("HEAD", "/bkt/mp").Header("etag"), want);
  // A copy is one object again: its ETag is the MD5 of all its bytes. A copy
  // of a single-part object keeps its ETag.
  RawResponse copy = Signed("PUT", "/bkt/mp-copy", "", "", "x-amz-copy-source: /bkt/mp\r\n");
  ASSERT_EQ(copy.status, 200) << copy.body;
  EXPECT_EQ(s3::XmlText(copy.body, "ETag").value_or(""), QuotedMd5(p1 + p2));
  ASSERT_EQ(Signed("PUT", "/bkt/one", "", "single").status, 200);
  RawResponse copy1 = Signed("PUT", "/bkt/one-copy", "", "", "x-amz-copy-source: /bkt/one\r\n");
  EXPECT_EQ(s3::XmlText(copy1.body, "ETag").value_or(""), QuotedMd5("single"));
  // UploadPartCopy: the part's ETag is the MD5 of the copied range.
  const std::string id2 = UploadId("mp2");
  RawResponse pc =
      Signed("PUT", "/bkt/mp2", "partNumber=1&uploadId=" + id2, "",
             "x-amz-copy-source: /bkt/mp\r\nx-amz-copy-source-range: bytes=2990-3004\r\n");
  ASSERT_EQ(pc.status, 200) << pc.body;
  EXPECT_EQ(s3::XmlText(pc.body, "ETag").value_or(""), QuotedMd5((p1 + p2).substr(2990, 15)));
}

TEST_P(IntegrityTest, Xxh3EtagsWhenMd5IsOff) {
  Start(false);
  RawResponse put = Signed("PUT", "/bkt/x", "", "hello world");
  ASSERT_EQ(put.status, 200);
  EXPECT_EQ(put.Header("etag").size(), 34u);
  EXPECT_NE(put.Header("etag"), QuotedMd5("hello world"));
}

TEST_P(IntegrityTest, ContentMd5IsVerified) {
  const std::string md5 = net::Base64Of(net::Md5(Bytes("right")));
  EXPECT_EQ(Signed("PUT", "/bkt/c", "", "right", "Content-MD5: " + md5 + "\r\n").status, 200);
  RawResponse bad = Signed("PUT", "/bkt/d", "", "wrong", "Content-MD5: " + md5 + "\r\n");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("BadDigest"), std::string::npos) << bad.body;
  EXPECT_EQ(Signed("GET", "/bkt/d").status, 404);
  RawResponse invalid = Signed("PUT", "/bkt/d", "", "wrong", "Content-MD5: AAAA\r\n");
  EXPECT_EQ(invalid.status, 400);
  EXPECT_NE(invalid.body.find("InvalidDigest"), std::string::npos) << invalid.body;
}

TEST_P(IntegrityTest, FlexibleChecksumHeadersAreVerifiedStoredAndReturned) {
  const std::string body = "checksummed bytes";
  for (s3::ChecksumAlgorithm a : s3::kAllChecksumAlgorithms) {
    SCOPED_TRACE(std::string(s3::ChecksumName(a)));
    const std::string header = s3::ChecksumHeader(a);
    const std::string value = Base64Checksum(a, body);
    RawResponse put = Signed("PUT", "/bkt/f", "", body,
                             header + ": " + value + "\r\nx-amz-sdk-checksum-algorithm: " +
                                 std::string(s3::ChecksumName(a)) + "\r\n");
    ASSERT_EQ(put.status, 200) << put.body;
    EXPECT_EQ(put.Header(header), value);
    RawResponse got = Signed("GET", "/bkt/f", "", "", "x-amz-checksum-mode: ENABLED\r\n");
    EXPECT_EQ(got.body, body);
    EXPECT_EQ(got.Header(header), value);
    // The checksum of other bytes: refused, and the stored object stays.
    RawResponse bad = Signed("PUT", "/bkt/f", "", "other bytes", header + ": " + value + "\r\n");
    EXPECT_EQ(bad.status, 400);
    EXPECT_NE(bad.body.find("BadDigest"), std::string::npos) << bad.body;
    EXPECT_EQ(Signed("GET", "/bkt/f").body, body);
  }
  // Malformed, two at once, and an SDK algorithm without a value: 400.
  EXPECT_EQ(Signed("PUT", "/bkt/g", "", body, "x-amz-checksum-crc32: AAAA\r\n").status, 400);
  RawResponse two =
      Signed("PUT", "/bkt/g", "", body,
             "x-amz-checksum-crc32: " + Base64Checksum(s3::ChecksumAlgorithm::kCrc32, body) +
                 "\r\nx-amz-checksum-sha1: " + Base64Checksum(s3::ChecksumAlgorithm::kSha1, body) +
                 "\r\n");
  EXPECT_EQ(two.status, 400);
  EXPECT_NE(two.body.find("InvalidRequest"), std::string::npos) << two.body;
  EXPECT_EQ(Signed("PUT", "/bkt/g", "", body, "x-amz-sdk-checksum-algorithm: CRC32C\r\n").status,
            400);
  EXPECT_EQ(Signed("GET", "/bkt/g").status, 404);
}

// Every algorithm's trailer is checked against the data, whatever the last
// (zero-length) chunk feeds it: CRC32 once took that chunk's null pointer
// for zlib's "initial value" request and accepted only AAAAAA== (found by
// bench/malformed_flood).
TEST_P(IntegrityTest, UnsignedChunksWithAChecksumTrailer) {
  const std::string payload = "abcdefghij";
  for (s3::ChecksumAlgorithm a : s3::kAllChecksumAlgorithms) {
    std::string name(s3::ChecksumName(a));
    SCOPED_TRACE(name);
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const std::string header = "x-amz-checksum-" + lower;
    const std::string sum = Base64Checksum(a, payload);
    auto put = [&](const std::string& key, const std::string& trailer_value) {
      const std::string body =
          "4\r\nabcd\r\n6\r\nefghij\r\n0\r\n" + header + ":" + trailer_value + "\r\n\r\n";
      return Signed("PUT", "/bkt/" + key, "", body,
                    "Content-Encoding: aws-chunked\r\nx-amz-decoded-content-length: 10\r\n"
                    "x-amz-trailer: " +
                        header + "\r\nx-amz-sdk-checksum-algorithm: " + name + "\r\n",
                    "STREAMING-UNSIGNED-PAYLOAD-TRAILER");
    };
    RawResponse ok = put("t", sum);
    ASSERT_EQ(ok.status, 200) << ok.body;
    EXPECT_EQ(ok.Header("etag"), QuotedMd5(payload));
    EXPECT_EQ(ok.Header(header), sum);
    RawResponse got = Signed("GET", "/bkt/t");
    EXPECT_EQ(got.body, payload);
    EXPECT_EQ(got.Header("content-encoding"), "");  // aws-chunked describes the upload only
    RawResponse bad = put("u", Base64Checksum(a, "other"));
    EXPECT_EQ(bad.status, 400);
    EXPECT_NE(bad.body.find("BadDigest"), std::string::npos) << bad.body;
    EXPECT_EQ(Signed("GET", "/bkt/u").status, 404);
    ASSERT_EQ(Signed("DELETE", "/bkt/t").status / 100, 2);
  }
  // The declared trailer missing from the body.
  RawResponse missing =
      Signed("PUT", "/bkt/u", "", "3\r\nabc\r\n0\r\n\r\n",
             "x-amz-decoded-content-length: 3\r\nx-amz-trailer: x-amz-checksum-crc32\r\n",
             "STREAMING-UNSIGNED-PAYLOAD-TRAILER");
  EXPECT_EQ(missing.status, 400) << missing.body;
  EXPECT_EQ(Signed("GET", "/bkt/u").status, 404);
}

TEST_P(IntegrityTest, TransferEncodingChunked) {
  RawResponse put = ChunkedTransfer("/bkt/te", {"hello ", "chunked ", "world"});
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(put.Header("etag"), QuotedMd5("hello chunked world"));
  EXPECT_EQ(Signed("GET", "/bkt/te").body, "hello chunked world");
  // With a checksum, verified over the decoded bytes.
  const std::string crc = Base64Checksum(s3::ChecksumAlgorithm::kCrc32, "abcdef");
  EXPECT_EQ(
      ChunkedTransfer("/bkt/te2", {"abc", "def"}, "x-amz-checksum-crc32: " + crc + "\r\n").status,
      200);
  RawResponse bad =
      ChunkedTransfer("/bkt/te3", {"abc", "deX"}, "x-amz-checksum-crc32: " + crc + "\r\n");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(Signed("GET", "/bkt/te3").status, 404);
  // Over max_object_bytes (1 MiB) in chunks: refused, nothing stored.
  RawResponse big =
      ChunkedTransfer("/bkt/te4", std::vector<std::string>(3, std::string(400000, 'z')));
  EXPECT_EQ(big.status, 400);
  EXPECT_NE(big.body.find("EntityTooLarge"), std::string::npos) << big.body;
  EXPECT_EQ(Signed("GET", "/bkt/te4").status, 404);
  // Framing errors and the unsupported cases.
  std::string req = SignedRequest(port_, "PUT", "/bkt/te5", "", "", kAk, kSk);
  std::string chunked = req;
  chunked.replace(chunked.find("Content-Length: 0\r\n"), 19, "Transfer-Encoding: chunked\r\n");
  EXPECT_EQ(RawExchange(port_, chunked + "zz\r\nabc\r\n0\r\n\r\n").status, 400);
  EXPECT_EQ(RawExchange(port_, chunked + "2\r\nabc\r\n0\r\n\r\n").status, 400);
  std::string both = req;
  both.replace(both.find("Content-Length: 0\r\n"), 0, "Transfer-Encoding: chunked\r\n");
  EXPECT_EQ(RawExchange(port_, both + "0\r\n\r\n").status, 400);
  std::string gzip = req;
  gzip.replace(gzip.find("Content-Length: 0\r\n"), 19, "Transfer-Encoding: gzip, chunked\r\n");
  EXPECT_EQ(RawExchange(port_, gzip + "0\r\n\r\n").status, 501);
  EXPECT_EQ(Signed("GET", "/bkt/te5").status, 404);
}

TEST_P(IntegrityTest, MultipartCompositeChecksum) {
  using A = s3::ChecksumAlgorithm;
  const std::string id = UploadId("cc", "x-amz-checksum-algorithm: CRC32\r\n");
  const std::string p1(2000, 'q'), p2 = "tail";
  RawResponse r1 = Signed("PUT", "/bkt/cc", "partNumber=1&uploadId=" + id, p1,
                          "x-amz-checksum-crc32: " + Base64Checksum(A::kCrc32, p1) + "\r\n");
  // A part without the declared checksum gets it computed.
  RawResponse r2 = Signed("PUT", "/bkt/cc", "partNumber=2&uploadId=" + id, p2);
  ASSERT_EQ(r1.status, 200) << r1.body;
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_EQ(r2.Header("x-amz-checksum-crc32"), Base64Checksum(A::kCrc32, p2));
  // A part with another algorithm than the declared one is refused.
  EXPECT_EQ(Signed("PUT", "/bkt/cc", "partNumber=3&uploadId=" + id, p2,
                   "x-amz-checksum-sha1: " + Base64Checksum(A::kSha1, p2) + "\r\n")
                .status,
            400);
  std::string xml = "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>" +
                    r1.Header("etag") + "</ETag></Part><Part><PartNumber>2</PartNumber><ETag>" +
                    r2.Header("etag") + "</ETag></Part></CompleteMultipartUpload>";
  RawResponse done = Signed("POST", "/bkt/cc", "uploadId=" + id, xml);
  ASSERT_EQ(done.status, 200) << done.body;
  auto c1 = s3::ComputeChecksum(A::kCrc32, Bytes(p1)),
       c2 = s3::ComputeChecksum(A::kCrc32, Bytes(p2));
  std::string raw(c1.begin(), c1.end());
  raw.append(c2.begin(), c2.end());
  const std::string want = Base64Checksum(A::kCrc32, raw) + "-2";
  EXPECT_EQ(s3::XmlText(done.body, "ChecksumCRC32").value_or(""), want);
  EXPECT_EQ(Signed("HEAD", "/bkt/cc", "", "", "x-amz-checksum-mode: ENABLED\r\n")
                .Header("x-amz-checksum-crc32"),
            want);
}

// Behaviours ceph/s3-tests checks where RGW and S3 agree.
TEST_P(IntegrityTest, AsS3AnswersThem) {
  using A = s3::ChecksumAlgorithm;
  // A stored checksum comes back only when asked for.
  const std::string crc = Base64Checksum(A::kCrc32, "abc");
  ASSERT_EQ(Signed("PUT", "/bkt/c", "", "abc", "x-amz-checksum-crc32: " + crc + "\r\n").status,
            200);
  EXPECT_EQ(Signed("HEAD", "/bkt/c").Header("x-amz-checksum-crc32"), "");
  EXPECT_EQ(Signed("HEAD", "/bkt/c", "", "", "x-amz-checksum-mode: ENABLED\r\n")
                .Header("x-amz-checksum-crc32"),
            crc);
  // CORS preflights come before authentication: without Origin 400, with
  // it 403 (no CORS configuration here).
  const std::string options = "OPTIONS /bkt/c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
  EXPECT_EQ(RawExchange(port_, options + "\r\n").status, 400);
  RawResponse cors = RawExchange(
      port_, options + "Origin: https://a.example\r\nAccess-Control-Request-Method: GET\r\n\r\n");
  EXPECT_EQ(cors.status, 403);
  EXPECT_NE(cors.body.find("CORSResponse"), std::string::npos) << cors.body;
  // An unsigned request: NoSuchBucket for a bucket that does not exist,
  // AccessDenied for one that does.
  const std::string del = "DELETE /gone/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  RawResponse gone = RawExchange(port_, del);
  EXPECT_EQ(gone.status, 404);
  EXPECT_NE(gone.body.find("NoSuchBucket"), std::string::npos) << gone.body;
  EXPECT_EQ(
      RawExchange(port_, "DELETE /bkt/c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").status,
      403);
  EXPECT_EQ(Signed("GET", "/bkt/c").body, "abc");
  // A part listed twice in a row (re-sent while the list was made) counts
  // once, with the ETag listed last; a claimed object checksum that is not
  // the composite is BadDigest and the upload stays completable.
  const std::string id = UploadId("dup", "x-amz-checksum-algorithm: SHA256\r\n");
  RawResponse first = Signed("PUT", "/bkt/dup", "partNumber=1&uploadId=" + id, "BBBBBBBB");
  RawResponse second = Signed("PUT", "/bkt/dup", "partNumber=1&uploadId=" + id, "AAAAAAAA");
  ASSERT_EQ(second.status, 200);
  const std::string xml = "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>" +
                          first.Header("etag") +
                          "</ETag></Part><Part><PartNumber>1</PartNumber><ETag>" +
                          second.Header("etag") + "</ETag></Part></CompleteMultipartUpload>";
  RawResponse bad = Signed("POST", "/bkt/dup", "uploadId=" + id, xml,
                           "x-amz-checksum-sha256: " + Base64Checksum(A::kSha256, "x") + "\r\n");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("BadDigest"), std::string::npos) << bad.body;
  RawResponse done = Signed("POST", "/bkt/dup", "uploadId=" + id, xml);
  ASSERT_EQ(done.status, 200) << done.body;
  EXPECT_EQ(Signed("GET", "/bkt/dup").body, "AAAAAAAA");
}

INSTANTIATE_TEST_SUITE_P(Storage, IntegrityTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Directory" : "Memory"; });

}  // namespace
}  // namespace xsilo
