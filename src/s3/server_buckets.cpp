// Bucket operations (create, delete, location, list) and the listings of
// a bucket's objects.
#include <cctype>
#include <string>
#include <vector>

#include "s3/server_internal.h"
#include "s3/sigv4.h"
#include "s3/xml.h"
#include "xsilo/core/base64.h"
#include "xsilo/s3/errors.h"

namespace xsilo {

using namespace s3server;

namespace s3server {

bool ValidBucketName(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) return false;
  }
  return std::isalnum(static_cast<unsigned char>(b.front())) &&
         std::isalnum(static_cast<unsigned char>(b.back()));
}

Page Paginate(size_t n, const std::function<const std::string&(size_t)>& key_of,
              const std::function<bool(size_t)>& past_marker, const std::string& marker,
              const std::string& prefix, const std::string& delimiter, int64_t max_items) {
  Page page;
  std::string last_prefix;
  for (size_t i = 0; i < n; ++i) {
    if (!past_marker(i)) continue;
    const std::string& key = key_of(i);
    std::string cp;
    if (!delimiter.empty()) {
      size_t pos = key.find(delimiter, prefix.size());
      if (pos != std::string::npos) cp = key.substr(0, pos + delimiter.size());
    }
    if (!cp.empty() && (cp == last_prefix || (!marker.empty() && cp <= marker))) continue;
    if (static_cast<int64_t>(page.items.size()) >= max_items) {
      page.truncated = max_items > 0;
      break;
    }
    if (!cp.empty()) last_prefix = cp;
    page.items.push_back({i, std::move(cp)});
  }
  return page;
}

Status ParseMaxItems(const std::string* v, std::string_view name, int64_t* out) {
  if (!v) return Status::OK();
  if (!AllDigits(*v, 9)) {
    return S3Error("InvalidArgument", std::string(name) + " must be a non-negative integer");
  }
  *out = std::min<int64_t>(std::stoll(*v), 1000);
  return Status::OK();
}

}  // namespace s3server

Status S3Server::Impl::ListBuckets(Ctx& c) {
  XSILO_ASSIGN_OR_RETURN(auto buckets, store->ListBuckets());
  std::string xml = "<ListAllMyBucketsResult" + std::string(kXmlns) +
                    "><Owner><ID>xsilo</ID><DisplayName>xsilo</DisplayName></Owner><Buckets>";
  for (const auto& b : buckets) {
    xml += "<Bucket><Name>" + s3::XmlEscape(b.name) + "</Name><CreationDate>" +
           s3::FormatIsoDate(b.created) + "</CreationDate></Bucket>";
  }
  xml += "</Buckets></ListAllMyBucketsResult>";
  SendXml(c, 200, std::move(xml));
  return Status::OK();
}

Status S3Server::Impl::CreateBucket(Ctx& c) {
  if (!ValidBucketName(c.bucket)) {
    return S3Error("InvalidBucketName", "The specified bucket is not valid.");
  }
  if (c.req.content_length > 0) {
    // An optional CreateBucketConfiguration; its location must be ours.
    XSILO_ASSIGN_OR_RETURN(Buffer body, ReadXmlBody(c));
    auto loc = s3::XmlText(body.view(), "LocationConstraint");
    if (loc && !loc->empty() && *loc != opts.region) {
      return S3Error("InvalidLocationConstraint",
                     "The specified location-constraint is not valid for this server.");
    }
  }
  XSILO_RETURN_IF_ERROR(store->CreateBucket(c.bucket));
  c.resp->headers.emplace_back("Location", "/" + c.bucket);
  return Status::OK();
}

Status S3Server::Impl::DeleteBucket(Ctx& c) {
  XSILO_RETURN_IF_ERROR(store->DeleteBucket(c.bucket));
  // Uploads in progress go with the bucket; their parts are freed outside the lock.
  std::vector<Upload> dead;
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    for (auto it = uploads.begin(); it != uploads.end();) {
      if (it->second.bucket != c.bucket) {
        ++it;
        continue;
      }
      dead.push_back(std::move(it->second));
      it = uploads.erase(it);
    }
  }
  c.resp->status = 204;
  return Status::OK();
}

Status S3Server::Impl::GetBucketLocation(Ctx& c) {
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  std::string region = opts.region == "us-east-1" ? "" : s3::XmlEscape(opts.region);
  SendXml(c, 200,
          "<LocationConstraint" + std::string(kXmlns) + ">" + region + "</LocationConstraint>");
  return Status::OK();
}

Status S3Server::Impl::ListObjects(Ctx& c) {
  bool v2 = c.Query("list-type") && *c.Query("list-type") == "2";
  auto q = [&](std::string_view n) {
    const std::string* v = c.Query(n);
    return v ? *v : std::string();
  };
  std::string prefix = q("prefix"), delimiter = q("delimiter");
  const std::string* encoding = c.Query("encoding-type");
  if (encoding && *encoding != "url") {
    return S3Error("InvalidArgument", "Invalid Encoding Method specified in Request");
  }
  bool url_encode = encoding != nullptr;
  int64_t max_keys = 1000;
  XSILO_RETURN_IF_ERROR(ParseMaxItems(c.Query("max-keys"), "max-keys", &max_keys));
  std::string after;
  std::string token = q("continuation-token");
  if (v2 && !token.empty()) {  // an empty token starts from the beginning, as in S3
    auto dec = Base64Decode(token);
    if (!dec) {
      return S3Error("InvalidArgument", "The continuation token provided is incorrect");
    }
    after.assign(dec->begin(), dec->end());
  } else if (v2) {
    after = q("start-after");
  } else {
    after = q("marker");
  }
  XSILO_ASSIGN_OR_RETURN(auto entries, store->List(c.bucket, prefix));
  auto enc = [&](const std::string& s) {
    return s3::XmlEscape(url_encode ? s3::UriEncode(s, false) : s);
  };
  Page page = Paginate(
      entries.size(), [&](size_t i) -> const std::string& { return entries[i].key; },
      [&](size_t i) { return after.empty() || entries[i].key > after; }, after, prefix, delimiter,
      max_keys);
  std::string contents, prefixes, last;
  bool fetch_owner = v2 ? q("fetch-owner") == "true" : true;
  for (const PageItem& item : page.items) {
    if (!item.prefix.empty()) {
      last = item.prefix;
      prefixes += "<CommonPrefixes><Prefix>" + enc(item.prefix) + "</Prefix></CommonPrefixes>";
      continue;
    }
    const s3::ObjectEntry& e = entries[item.index];
    last = e.key;
    contents += "<Contents><Key>" + enc(e.key) + "</Key><LastModified>" +
                s3::FormatIsoDate(e.mtime) + "</LastModified><ETag>" + s3::XmlEscape(e.etag) +
                "</ETag><Size>" + std::to_string(e.size) + "</Size>" +
                (fetch_owner ? std::string(kOwnerXml) : std::string()) +
                "<StorageClass>STANDARD</StorageClass></Contents>";
  }
  // V1 returns its Prefix as sent even with encoding-type=url (S3 does; boto3
  // decodes V1's Delimiter, Marker, NextMarker and keys, not Prefix).
  std::string xml = "<ListBucketResult" + std::string(kXmlns) + "><Name>" +
                    s3::XmlEscape(c.bucket) + "</Name><Prefix>" +
                    (v2 ? enc(prefix) : s3::XmlEscape(prefix)) + "</Prefix>";
  if (v2) {
    xml += "<KeyCount>" + std::to_string(page.items.size()) + "</KeyCount>";
    if (c.HasQuery("continuation-token"))
      xml += "<ContinuationToken>" + s3::XmlEscape(token) + "</ContinuationToken>";
    if (c.HasQuery("start-after")) xml += "<StartAfter>" + enc(q("start-after")) + "</StartAfter>";
  } else {
    xml += "<Marker>" + enc(q("marker")) + "</Marker>";
  }
  xml += "<MaxKeys>" + std::to_string(max_keys) + "</MaxKeys>";
  if (!delimiter.empty()) xml += "<Delimiter>" + enc(delimiter) + "</Delimiter>";
  if (url_encode) xml += "<EncodingType>url</EncodingType>";
  xml += std::string("<IsTruncated>") + (page.truncated ? "true" : "false") + "</IsTruncated>";
  if (page.truncated) {
    if (v2) {
      xml += "<NextContinuationToken>" +
             Base64Encode({reinterpret_cast<const uint8_t*>(last.data()), last.size()}) +
             "</NextContinuationToken>";
    } else if (!delimiter.empty()) {
      // As S3: V1 names the next marker only with a delimiter; without one
      // the client continues from the last key it received.
      xml += "<NextMarker>" + enc(last) + "</NextMarker>";
    }
  }
  xml += contents + prefixes + "</ListBucketResult>";
  SendXml(c, 200, std::move(xml));
  return Status::OK();
}

// Buckets are never versioned here: every object is its one version, "null".
Status S3Server::Impl::ListObjectVersions(Ctx& c) {
  auto q = [&](std::string_view n) {
    const std::string* v = c.Query(n);
    return v ? *v : std::string();
  };
  std::string prefix = q("prefix"), delimiter = q("delimiter"), marker = q("key-marker");
  const std::string* encoding = c.Query("encoding-type");
  if (encoding && *encoding != "url") {
    return S3Error("InvalidArgument", "Invalid Encoding Method specified in Request");
  }
  auto enc = [&](const std::string& s) {
    return s3::XmlEscape(encoding ? s3::UriEncode(s, false) : s);
  };
  int64_t max_keys = 1000;
  XSILO_RETURN_IF_ERROR(ParseMaxItems(c.Query("max-keys"), "max-keys", &max_keys));
  XSILO_ASSIGN_OR_RETURN(auto entries, store->List(c.bucket, prefix));
  Page page = Paginate(
      entries.size(), [&](size_t i) -> const std::string& { return entries[i].key; },
      [&](size_t i) { return marker.empty() || entries[i].key > marker; }, marker, prefix,
      delimiter, max_keys);
  std::string xml = "<ListVersionsResult" + std::string(kXmlns) + "><Name>" +
                    s3::XmlEscape(c.bucket) + "</Name><Prefix>" + enc(prefix) +
                    "</Prefix><KeyMarker>" + enc(marker) + "</KeyMarker><VersionIdMarker>" +
                    s3::XmlEscape(q("version-id-marker")) + "</VersionIdMarker><MaxKeys>" +
                    std::to_string(max_keys) + "</MaxKeys>";
  if (!delimiter.empty()) xml += "<Delimiter>" + enc(delimiter) + "</Delimiter>";
  if (encoding) xml += "<EncodingType>url</EncodingType>";
  xml += std::string("<IsTruncated>") + (page.truncated ? "true" : "false") + "</IsTruncated>";
  std::string last;
  std::string body;
  for (const PageItem& item : page.items) {
    if (!item.prefix.empty()) {
      last = item.prefix;
      body += "<CommonPrefixes><Prefix>" + enc(item.prefix) + "</Prefix></CommonPrefixes>";
      continue;
    }
    const s3::ObjectEntry& e = entries[item.index];
    last = e.key;
    body += "<Version><Key>" + enc(e.key) +
            "</Key><VersionId>null</VersionId><IsLatest>true</IsLatest><LastModified>" +
            s3::FormatIsoDate(e.mtime) + "</LastModified><ETag>" + s3::XmlEscape(e.etag) +
            "</ETag><Size>" + std::to_string(e.size) + "</Size>" + std::string(kOwnerXml) +
            "<StorageClass>STANDARD</StorageClass></Version>";
  }
  if (page.truncated) {
    xml += "<NextKeyMarker>" + enc(last) + "</NextKeyMarker><NextVersionIdMarker>null" +
           "</NextVersionIdMarker>";
  }
  xml += body + "</ListVersionsResult>";
  SendXml(c, 200, std::move(xml));
  return Status::OK();
}

Status S3Server::Impl::DeleteObjects(Ctx& c) {
  XSILO_ASSIGN_OR_RETURN(Buffer body, ReadXmlBody(c));
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  std::string_view doc = body.view();
  bool quiet = s3::XmlText(doc, "Quiet").value_or("") == "true";
  std::string xml = "<DeleteResult" + std::string(kXmlns) + ">";
  bool any = false;
  size_t objects = 0;
  s3::XmlForEach(doc, "Object", [&](std::string_view) { ++objects; });
  if (objects > 1000) {
    return S3Error("MalformedXML", "DeleteObjects takes at most 1000 keys per request.");
  }
  s3::XmlForEach(doc, "Object", [&](std::string_view obj) {
    auto key = s3::XmlText(obj, "Key");
    if (!key) return;
    any = true;
    Status st = store->Delete(c.bucket, *key);
    if (st.ok()) {
      if (!quiet) xml += "<Deleted><Key>" + s3::XmlEscape(*key) + "</Key></Deleted>";
    } else {
      xml += "<Error><Key>" + s3::XmlEscape(*key) + "</Key><Code>" + S3ErrorCode(st) +
             "</Code><Message>" + s3::XmlEscape(st.message()) + "</Message></Error>";
    }
  });
  if (!any) return S3Error("MalformedXML", "The XML you provided was not well-formed.");
  xml += "</DeleteResult>";
  SendXml(c, 200, std::move(xml));
  return Status::OK();
}

}  // namespace xsilo
