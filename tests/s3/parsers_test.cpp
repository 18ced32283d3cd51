// The parsers of untrusted S3 input, on their own (each also has a fuzzer
// in fuzz/): the server's request head and CompleteMultipartUpload body,
// the client's ListObjectsV2 page.
#include <gtest/gtest.h>

#include "net/http_parse.h"
#include "s3/xml_bodies.h"

namespace xsilo::s3 {
namespace {

TEST(ParseHead, RequestLineHeadersAndContentLength) {
  net::HttpRequest r;
  std::string why;
  ASSERT_EQ(net::ParseHead("PUT /b/k%20x?partNumber=2&uploadId=u HTTP/1.1\r\nHost: h\r\n"
                           "Content-Length:  42 \r\nX-Amz-Date: 20240101T000000Z",
                           &r, &why),
            net::ParseResult::kOk)
      << why;
  EXPECT_EQ(r.method, "PUT");
  EXPECT_EQ(r.raw_path, "/b/k%20x");
  EXPECT_EQ(r.raw_query, "partNumber=2&uploadId=u");
  EXPECT_TRUE(r.has_content_length);
  EXPECT_EQ(r.content_length, 42u);
  ASSERT_NE(r.Header("x-amz-date"), nullptr);
  EXPECT_TRUE(r.keep_alive);
}

TEST(ParseHead, MalformedHeadsAreRefusedWithAReason) {
  for (const char* bad :
       {"GET / HTTP/2", "GET  / HTTP/1.1", "GET b HTTP/1.1", "GET / HTTP/1.1\r\nNo colon",
        "GET / HTTP/1.1\r\nContent-Length: -1",
        "GET / HTTP/1.1\r\nContent-Length: 12345678901234567890",
        "GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2", "G(T / HTTP/1.1"}) {
    net::HttpRequest r;
    std::string why;
    EXPECT_EQ(net::ParseHead(bad, &r, &why), net::ParseResult::kBad) << bad;
    EXPECT_FALSE(why.empty()) << bad;
  }
}

TEST(CompleteMultipartUpload, PartsInDocumentOrderQuotesRemoved) {
  auto parts = ParseCompleteMultipartUpload(
      "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>\"a\"</ETag></Part>"
      "<Part><ETag>&quot;b&quot;</ETag><PartNumber>00002</PartNumber></Part>"
      "</CompleteMultipartUpload>");
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].number, 1);
  EXPECT_EQ((*parts)[0].etag, "a");
  EXPECT_EQ((*parts)[1].number, 2);
  EXPECT_EQ((*parts)[1].etag, "b");
}

TEST(CompleteMultipartUpload, MalformedBodiesAreRefused) {
  for (const char* bad :
       {"", "<CompleteMultipartUpload/>", "<Part><PartNumber>1</PartNumber></Part>",
        "<Part><PartNumber>-1</PartNumber><ETag>a</ETag></Part>",
        "<Part><PartNumber>100000</PartNumber><ETag>a</ETag></Part>",
        "<Part><PartNumber></PartNumber><ETag>a</ETag></Part>", "<Part/>"}) {
    EXPECT_FALSE(ParseCompleteMultipartUpload(bad).ok()) << bad;
  }
}

TEST(ListObjectsV2, DecodesKeysAndAppendsPages) {
  ListObjectsResult out;
  ASSERT_TRUE(
      ParseListObjectsV2("<ListBucketResult><EncodingType>url</EncodingType>"
                         "<Contents><Key>a%2Fb%20c</Key><Size>42</Size><ETag>&quot;e&quot;</ETag>"
                         "<LastModified>2024-01-01T00:00:00.000Z</LastModified></Contents>"
                         "<CommonPrefixes><Prefix>d%2F</Prefix></CommonPrefixes>"
                         "<IsTruncated>true</IsTruncated><NextContinuationToken>t&amp;1"
                         "</NextContinuationToken></ListBucketResult>",
                         &out)
          .ok());
  ASSERT_EQ(out.objects.size(), 1u);
  EXPECT_EQ(out.objects[0].key, "a/b c");
  EXPECT_EQ(out.objects[0].size, 42u);
  EXPECT_EQ(out.objects[0].etag, "\"e\"");
  EXPECT_EQ(out.objects[0].last_modified, 1704067200);
  EXPECT_EQ(out.common_prefixes, std::vector<std::string>{"d/"});
  EXPECT_TRUE(out.truncated);
  EXPECT_EQ(out.next_continuation_token, "t&1");
  ASSERT_TRUE(ParseListObjectsV2("<ListBucketResult><Contents><Key>z</Key><Size>0</Size>"
                                 "</Contents></ListBucketResult>",
                                 &out)
                  .ok());
  EXPECT_EQ(out.objects.size(), 2u);
  EXPECT_FALSE(out.truncated);
}

// A Size that is not a byte count was read by strtoull: "-1" became 2^64-1.
TEST(ListObjectsV2, ASizeThatIsNotAByteCountIsAnError) {
  for (const char* size : {"-1", "", "12abc", "99999999999999999999", " 5"}) {
    ListObjectsResult out;
    std::string doc = "<ListBucketResult><Contents><Key>k</Key><Size>" + std::string(size) +
                      "</Size></Contents></ListBucketResult>";
    EXPECT_EQ(ParseListObjectsV2(doc, &out).code(), StatusCode::kInternal) << size;
  }
  ListObjectsResult out;
  EXPECT_EQ(ParseListObjectsV2("<Error><Code>AccessDenied</Code></Error>", &out).code(),
            StatusCode::kInternal);
}

}  // namespace
}  // namespace xsilo::s3
