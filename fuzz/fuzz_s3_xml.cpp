// libFuzzer target: the S3 XML documents xsilo reads (s3/xml_bodies.h):
// the CompleteMultipartUpload body the embedded server parses, and the
// ListObjectsV2 page the client parses, plus XML text escaping. The first
// byte picks the document. Whatever parses is written back (as the client
// and the server write these documents) and must parse to the same value.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "s3/sigv4.h"
#include "s3/xml.h"
#include "s3/xml_bodies.h"

namespace s3 = xsilo::s3;

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void CompleteMultipart(std::string_view doc) {
  auto parts = s3::ParseCompleteMultipartUpload(doc);
  if (!parts.ok()) return;
  Check(!parts->empty());
  std::string xml = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  for (const auto& p : *parts) {
    Check(p.number >= 0 && p.number <= 99999);
    xml += "<Part><PartNumber>" + std::to_string(p.number) + "</PartNumber><ETag>\"" +
           s3::XmlEscape(p.etag) + "\"</ETag></Part>";
  }
  xml += "</CompleteMultipartUpload>";
  auto again = s3::ParseCompleteMultipartUpload(xml);
  Check(again.ok() && again->size() == parts->size());
  for (size_t i = 0; i < parts->size(); ++i) {
    Check((*again)[i].number == (*parts)[i].number && (*again)[i].etag == (*parts)[i].etag);
  }
}

std::string IsoDate(std::time_t t) {
  std::tm tm{};
  if (!gmtime_r(&t, &tm)) return "";
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S.000Z", &tm);
  return buf;
}

void ListObjects(std::string_view doc) {
  xsilo::ListObjectsResult page;
  if (!s3::ParseListObjectsV2(doc, &page).ok()) return;
  // Written back as the embedded server writes a page (url encoding on).
  std::string xml =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult "
      "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name>";
  for (const auto& o : page.objects) {
    xml += "<Contents><Key>" + s3::XmlEscape(s3::UriEncode(o.key, false)) + "</Key><LastModified>" +
           IsoDate(o.last_modified) + "</LastModified><ETag>" + s3::XmlEscape(o.etag) +
           "</ETag><Size>" + std::to_string(o.size) +
           "</Size><StorageClass>STANDARD</StorageClass></Contents>";
  }
  for (const auto& p : page.common_prefixes) {
    xml += "<CommonPrefixes><Prefix>" + s3::XmlEscape(s3::UriEncode(p, false)) +
           "</Prefix></CommonPrefixes>";
  }
  xml += "<EncodingType>url</EncodingType><IsTruncated>" +
         std::string(page.truncated ? "true" : "false") + "</IsTruncated>";
  if (!page.next_continuation_token.empty()) {
    xml += "<NextContinuationToken>" + s3::XmlEscape(page.next_continuation_token) +
           "</NextContinuationToken>";
  }
  xml += "</ListBucketResult>";
  xsilo::ListObjectsResult again;
  Check(s3::ParseListObjectsV2(xml, &again).ok());
  Check(again.objects.size() == page.objects.size());
  for (size_t i = 0; i < page.objects.size(); ++i) {
    const auto &a = page.objects[i], &b = again.objects[i];
    Check(a.key == b.key && a.etag == b.etag && a.size == b.size);
    Check(a.last_modified == b.last_modified);
  }
  Check(again.common_prefixes == page.common_prefixes);
  Check(again.truncated == page.truncated);
  Check(again.next_continuation_token == page.next_continuation_token);
}

void Text(std::string_view s) {
  Check(s3::XmlUnescape(s3::XmlEscape(s)) == s);
  const std::string escaped = s3::XmlEscape(s);
  Check(escaped.find_first_of("<>\"'") == std::string::npos);
  // Inside an element, escaped text comes back as it was.
  Check(s3::XmlText("<a><T>" + escaped + "</T></a>", "T").value_or("?") == s);
  (void)s3::XmlUnescape(s);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view doc(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      CompleteMultipart(doc);
      break;
    case 1:
      ListObjects(doc);
      break;
    default:
      Text(doc);
  }
  return 0;
}
