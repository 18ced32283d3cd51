#include "s3/xml_bodies.h"

#include <algorithm>
#include <charconv>

#include "s3/sigv4.h"
#include "s3/xml.h"

namespace xsilo::s3 {

namespace {
std::string StripQuotes(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}
}  // namespace

Result<std::vector<CompletedPart>> ParseCompleteMultipartUpload(std::string_view body) {
  std::vector<CompletedPart> parts;
  bool malformed = false;
  XmlForEach(body, "Part", [&](std::string_view part) {
    if (malformed) return;
    auto num = XmlText(part, "PartNumber");
    auto etag = XmlText(part, "ETag");
    if (!num || !etag || num->empty() || num->size() > 5 ||
        !std::all_of(num->begin(), num->end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      malformed = true;
      return;
    }
    parts.push_back({std::stoi(*num), StripQuotes(*etag)});
  });
  if (malformed || parts.empty()) {
    return InvalidArgument("CompleteMultipartUpload body lists no parts or a malformed part");
  }
  return parts;
}

std::time_t ParseIsoDate(std::string_view s) {
  std::tm tm{};
  if (!strptime(std::string(s).c_str(), "%Y-%m-%dT%H:%M:%S", &tm)) return 0;
  return timegm(&tm);
}

Status ParseListObjectsV2(std::string_view doc, ListObjectsResult* out) {
  if (doc.find("<ListBucketResult") == std::string_view::npos) {
    return Internal("ListObjectsV2: unexpected response body");
  }
  bool url_encoded = XmlText(doc, "EncodingType").value_or("") == "url";
  auto decode = [&](const std::string& s) {
    std::string d;
    return url_encoded && UriDecode(s, &d) ? d : s;
  };
  bool bad_size = false;
  XmlForEach(doc, "Contents", [&](std::string_view item) {
    S3ObjectInfo info;
    info.key = decode(XmlText(item, "Key").value_or(""));
    // Digits only: strtoull alone would read "-1" as 2^64-1.
    std::string size = XmlText(item, "Size").value_or("0");
    auto [end, ec] = std::from_chars(size.data(), size.data() + size.size(), info.size);
    if (size.empty() || ec != std::errc() || end != size.data() + size.size()) bad_size = true;
    info.etag = XmlText(item, "ETag").value_or("");
    info.last_modified = ParseIsoDate(XmlText(item, "LastModified").value_or(""));
    out->objects.push_back(std::move(info));
  });
  XmlForEach(doc, "CommonPrefixes", [&](std::string_view item) {
    out->common_prefixes.push_back(decode(XmlText(item, "Prefix").value_or("")));
  });
  if (bad_size) return Internal("ListObjectsV2: an object's Size is not a byte count");
  out->truncated = XmlText(doc, "IsTruncated").value_or("false") == "true";
  out->next_continuation_token = XmlText(doc, "NextContinuationToken").value_or("");
  return Status::OK();
}

}  // namespace xsilo::s3
