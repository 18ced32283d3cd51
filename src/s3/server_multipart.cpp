// Multipart uploads: create, upload a part (or copy one), list the parts
// and the uploads, complete, abort.
#include <cinttypes>
#include <cstdio>
#include <optional>
#include <string>

#include "net/crypto.h"
#include "s3/checksums.h"
#include "s3/etag.h"
#include "s3/server_internal.h"
#include "s3/sigv4.h"
#include "s3/xml.h"
#include "s3/xml_bodies.h"
#include "xsilo/core/base64.h"
#include "xsilo/s3/errors.h"

namespace xsilo {

using namespace s3server;

namespace {

std::string SegmentsEtag(s3::EtagHash kind, const std::vector<Buffer>& segments) {
  s3::EtagHasher h(kind);
  for (const Buffer& b : segments) h.Update(b.data(), b.size());
  return h.Finish();
}

std::string StripQuotes(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

// <ChecksumCRC32>v</ChecksumCRC32>, or "" without a checksum.
std::string ChecksumXml(const std::string& algorithm, const std::string& value) {
  if (algorithm.empty() || value.empty()) return "";
  return "<Checksum" + algorithm + ">" + s3::XmlEscape(value) + "</Checksum" + algorithm + ">";
}

}  // namespace

Status S3Server::Impl::CreateUpload(Ctx& c) {
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  Upload u;
  u.bucket = c.bucket;
  u.key = c.key;
  if (const std::string* ct = c.req.Header("content-type")) u.content_type = *ct;
  u.user_metadata = UserMetadata(c.req);
  u.headers = StoredHeaders(c.req);
  if (const std::string* a = c.req.Header("x-amz-checksum-algorithm")) {
    u.checksum_algorithm = s3::ParseChecksumAlgorithm(*a);
    if (!u.checksum_algorithm) {
      return S3Error("InvalidRequest", "Checksum algorithm provided is unsupported: " + *a);
    }
  }
  u.initiated = std::time(nullptr);
  u.seq = next_id.fetch_add(1);
  std::mt19937_64 rng(std::random_device{}());
  char id[64];
  std::snprintf(id, sizeof(id), "%016" PRIx64 "%016" PRIx64, rng(), u.seq);
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    uploads.emplace(id, std::move(u));
  }
  if (const std::string* a = c.req.Header("x-amz-checksum-algorithm")) {
    c.resp->headers.emplace_back("x-amz-checksum-algorithm", *a);
  }
  SendXml(c, 200,
          "<InitiateMultipartUploadResult" + std::string(kXmlns) + "><Bucket>" +
              s3::XmlEscape(c.bucket) + "</Bucket><Key>" + s3::XmlEscape(c.key) +
              "</Key><UploadId>" + id + "</UploadId></InitiateMultipartUploadResult>");
  return Status::OK();
}

Status S3Server::Impl::UploadPart(Ctx& c) {
  const std::string* id = c.Query("uploadId");
  const std::string* pn = c.Query("partNumber");
  if (!id || !pn) return S3Error("InvalidRequest", "uploadId and partNumber are both required");
  int part = 0;
  if (!AllDigits(*pn, 5) || (part = std::stoi(*pn)) < 1 || part > 10000) {
    return S3Error("InvalidArgument",
                   "Part number must be an integer between 1 and 10000, inclusive");
  }
  if (c.req.Header("x-amz-copy-source")) return UploadPartCopy(c, part);
  std::optional<s3::ChecksumAlgorithm> declared;
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(*id);
    if (it == uploads.end() || it->second.bucket != c.bucket || it->second.key != c.key) {
      c.resp->close = c.req.content_length > 0 || c.req.chunked;
      return S3Error("NoSuchUpload", "The specified upload does not exist.");
    }
    declared = it->second.checksum_algorithm;
  }
  XSILO_ASSIGN_OR_RETURN(s3::RequestBody received, ReadBody(c, {.limit = opts.max_part_bytes,
                                                                .etag = etag_hash(),
                                                                .checksum_default = declared}));
  if (declared && received.checksum_algorithm != s3::ChecksumName(*declared)) {
    return S3Error("InvalidRequest", "The upload was created with x-amz-checksum-algorithm " +
                                         std::string(s3::ChecksumName(*declared)) +
                                         " and this part sent a " + received.checksum_algorithm +
                                         " checksum.");
  }
  Buffer body = std::move(received.bytes);
  std::string etag = std::move(received.etag);
  Params checksum_header = ChecksumHeaders(received.checksum_algorithm, received.checksum);
  std::lock_guard<std::mutex> lock(uploads_mu);
  auto it = uploads.find(*id);
  if (it == uploads.end()) return S3Error("NoSuchUpload", "The specified upload was aborted.");
  uint64_t size = body.size();
  std::vector<Buffer> segments;
  if (!body.empty()) segments.push_back(std::move(body));
  Part old = std::move(it->second.parts[part]);  // a re-sent part replaces the first
  it->second.parts[part] = Part{std::move(segments),
                                size,
                                etag,
                                std::time(nullptr),
                                std::move(received.checksum_algorithm),
                                std::move(received.checksum)};
  c.resp->headers.emplace_back("ETag", etag);
  for (auto& h : checksum_header) c.resp->headers.push_back(std::move(h));
  return Status::OK();
}

std::string S3Server::Impl::CompleteResultXml(const Ctx& c, const std::string& etag,
                                              const std::string& checksum_xml) {
  return "<CompleteMultipartUploadResult" + std::string(kXmlns) + "><Location>/" +
         s3::XmlEscape(c.bucket) + "/" + s3::XmlEscape(c.key) + "</Location><Bucket>" +
         s3::XmlEscape(c.bucket) + "</Bucket><Key>" + s3::XmlEscape(c.key) + "</Key><ETag>" +
         s3::XmlEscape(etag) + "</ETag>" + checksum_xml + "</CompleteMultipartUploadResult>";
}

namespace {

// Bucket, key and the listed parts of a Complete request, as one digest.
XXH128_hash_t CompletionDigest(const std::string& bucket, const std::string& key,
                               const std::vector<std::pair<int, std::string>>& parts) {
  // Lengths before contents, so that no two requests spell the same bytes.
  std::string bytes;
  auto add_u64 = [&bytes](uint64_t v) { bytes.append(reinterpret_cast<const char*>(&v), 8); };
  add_u64(bucket.size());
  bytes += bucket;
  add_u64(key.size());
  bytes += key;
  for (const auto& [number, etag] : parts) {
    add_u64(static_cast<uint64_t>(number));
    add_u64(etag.size());
    bytes += etag;
  }
  return XXH3_128bits(bytes.data(), bytes.size());
}

}  // namespace

Status S3Server::Impl::CompleteUpload(Ctx& c) {
  const std::string& id = *c.Query("uploadId");
  XSILO_ASSIGN_OR_RETURN(Buffer body, ReadXmlBody(c, /*header_checksums=*/false));
  auto parsed = s3::ParseCompleteMultipartUpload(body.view());
  if (!parsed.ok()) {
    return S3Error("MalformedXML", "The XML you provided was not well-formed or did not validate.");
  }
  // A part number listed twice in a row (its part was re-sent while the
  // list was made) counts once, with its last ETag, as RGW takes it.
  std::vector<std::pair<int, std::string>> listed;
  for (auto& p : *parsed) {
    if (!listed.empty() && listed.back().first == p.number) {
      listed.back().second = std::move(p.etag);
    } else {
      listed.emplace_back(p.number, std::move(p.etag));
    }
  }
  // A write condition that fails already fails before the upload is
  // consumed, so that its parts stay for a retry or an abort (Put tests it
  // again). A retry of a completion that succeeded gets its answer below.
  XSILO_ASSIGN_OR_RETURN(PutCondition condition, WriteCondition(c.req));
  if (condition) {
    bool open;
    {
      std::lock_guard<std::mutex> lock(uploads_mu);
      open = uploads.count(id) > 0;
    }
    if (open) {
      auto current = store->Get(c.bucket, c.key);
      if (current.ok()) {
        ObjectEntry entry{c.key, current->size, current->etag, current->mtime};
        XSILO_RETURN_IF_ERROR(condition(&entry));
      } else if (S3ErrorCode(current.status()) == "NoSuchKey") {
        XSILO_RETURN_IF_ERROR(condition(nullptr));
      } else {
        return current.status();
      }
    }
  }
  StoredObject obj;
  std::optional<Upload> taken;
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(id);
    if (it == uploads.end() || it->second.bucket != c.bucket || it->second.key != c.key) {
      auto done = completed.find(id);
      if (done != completed.end() &&
          XXH128_isEqual(done->second.request, CompletionDigest(c.bucket, c.key, listed))) {
        SendXml(c, 200, CompleteResultXml(c, done->second.etag, done->second.checksum_xml));
        return Status::OK();
      }
      return S3Error("NoSuchUpload", "The specified upload does not exist.");
    }
    Upload& u = it->second;
    std::vector<std::string> part_etags;
    for (size_t i = 0; i < listed.size(); ++i) {
      auto [num, etag] = listed[i];
      if (i > 0 && num <= listed[i - 1].first) {
        return S3Error("InvalidPartOrder", "The list of parts was not in ascending order.");
      }
      auto p = u.parts.find(num);
      if (p == u.parts.end() || StripQuotes(p->second.etag) != etag) {
        return S3Error("InvalidPart", "Part " + std::to_string(num) +
                                          " was not uploaded or its ETag does not match.");
      }
    }
    // Sizes only once every listed part is known to exist, as S3 checks.
    for (size_t i = 0; i < listed.size(); ++i) {
      int num = listed[i].first;
      auto p = u.parts.find(num);
      if (i + 1 < listed.size() && p->second.size < opts.min_part_bytes) {
        return S3Error("EntityTooSmall", "Part " + std::to_string(num) +
                                             " is smaller than the minimum allowed size.");
      }
      obj.size += p->second.size;
      part_etags.push_back(p->second.etag);
    }
    if (obj.size > opts.max_object_bytes) {
      return S3Error("EntityTooLarge", "The completed object exceeds the maximum allowed size.");
    }
    // Views of the parts' Buffers: the upload is kept (out of the table)
    // until the object is stored, and put back if that fails.
    for (const auto& [num, etag] : listed) {
      for (const Buffer& b : u.parts[num].segments) obj.segments.push_back(b);
    }
    XSILO_ASSIGN_OR_RETURN(obj.etag, s3::MultipartEtag(etag_hash(), part_etags));
    if (u.checksum_algorithm) {
      // Composite: the checksum of the parts' raw checksums, then -<parts>.
      s3::ChecksumStream composite(*u.checksum_algorithm);
      for (const auto& [num, etag] : listed) {
        auto raw = Base64Decode(u.parts[num].checksum);
        if (u.parts[num].checksum_algorithm != s3::ChecksumName(*u.checksum_algorithm) || !raw) {
          return S3Error("InvalidPart", "Part " + std::to_string(num) + " has no " +
                                            std::string(s3::ChecksumName(*u.checksum_algorithm)) +
                                            " checksum.");
        }
        composite.Update(raw->data(), raw->size());
      }
      obj.checksum_algorithm = std::string(s3::ChecksumName(*u.checksum_algorithm));
      obj.checksum = net::Base64Of(composite.Finish()) + "-" + std::to_string(listed.size());
    }
    // The object's checksum as the client computed it: must be the composite.
    for (s3::ChecksumAlgorithm a : s3::kAllChecksumAlgorithms) {
      const std::string* claimed = c.req.Header(s3::ChecksumHeader(a));
      if (claimed == nullptr) continue;
      const std::string bare = obj.checksum.substr(0, obj.checksum.rfind('-'));
      if (obj.checksum_algorithm != s3::ChecksumName(a) ||
          (*claimed != obj.checksum && *claimed != bare)) {
        return S3Error("BadDigest", "The " + std::string(s3::ChecksumName(a)) +
                                        " you specified did not match the calculated checksum.");
      }
    }
    obj.content_type = u.content_type.empty() ? obj.content_type : u.content_type;
    obj.user_metadata = u.user_metadata;
    obj.headers = u.headers;
    taken.emplace(std::move(it->second));
    uploads.erase(it);
  }
  obj.mtime = std::time(nullptr);
  std::string etag = obj.etag;
  std::string checksum_xml = ChecksumXml(obj.checksum_algorithm, obj.checksum);
  Status stored = store->Put(c.bucket, c.key, std::move(obj), condition);
  if (!stored.ok()) {
    // A refused condition (another writer came first) or a failed write:
    // the upload stays, for a retry or an abort.
    std::lock_guard<std::mutex> lock(uploads_mu);
    uploads.emplace(id, std::move(*taken));
    return stored;
  }
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    completed[id] = Completed{CompletionDigest(c.bucket, c.key, listed), etag, checksum_xml};
    completed_order.push_back(id);
    if (completed_order.size() > kRememberedCompletions) {
      completed.erase(completed_order.front());
      completed_order.pop_front();
    }
  }
  SendXml(c, 200, CompleteResultXml(c, etag, checksum_xml));
  return Status::OK();
}

Status S3Server::Impl::UploadPartCopy(Ctx& c, int part) {
  const std::string& id = *c.Query("uploadId");
  auto upload_exists = [&] {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(id);
    return it != uploads.end() && it->second.bucket == c.bucket && it->second.key == c.key;
  };
  if (!upload_exists()) return S3Error("NoSuchUpload", "The specified upload does not exist.");
  std::string src_bucket, src_key;
  XSILO_ASSIGN_OR_RETURN(StoredObject src, ReadCopySource(c, &src_bucket, &src_key));
  uint64_t start = 0, len = src.size;
  if (const std::string* range = c.req.Header("x-amz-copy-source-range")) {
    // Only "bytes=first-last", both given, as S3 requires here.
    std::string_view r = *range;
    size_t dash = r.find('-');
    if (r.substr(0, 6) != "bytes=" || dash == std::string_view::npos ||
        !AllDigits(r.substr(6, dash - 6), 19) || !AllDigits(r.substr(dash + 1), 19)) {
      return S3Error("InvalidArgument",
                     "The x-amz-copy-source-range value must be of the form bytes=first-last "
                     "where first and last are the zero-based offsets of the first and last "
                     "bytes to copy");
    }
    uint64_t first = std::stoull(std::string(r.substr(6, dash - 6)));
    uint64_t last = std::stoull(std::string(r.substr(dash + 1)));
    if (last < first) {
      return S3Error("InvalidArgument", "The x-amz-copy-source-range value is not valid: " +
                                            std::string(r) + " (last byte before the first)");
    }
    if (last >= src.size) {
      return S3Error("InvalidRange", "The requested range is not satisfiable: " + std::string(r) +
                                         " of an object of " + std::to_string(src.size) + " bytes");
    }
    start = first;
    len = last - first + 1;
  }
  if (len > opts.max_part_bytes) {
    return S3Error("EntityTooLarge", "The part exceeds the maximum allowed size (" +
                                         std::to_string(opts.max_part_bytes) + " bytes).");
  }
  std::vector<Buffer> segments = SliceSegments(src.segments, start, len);
  std::string etag = SegmentsEtag(etag_hash(), segments);
  std::optional<s3::ChecksumAlgorithm> declared;
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(id);
    if (it != uploads.end()) declared = it->second.checksum_algorithm;
  }
  std::string checksum;
  if (declared) {
    s3::ChecksumStream sum(*declared);
    for (const Buffer& b : segments) sum.Update(b.data(), b.size());
    checksum = net::Base64Of(sum.Finish());
  }
  std::time_t now = std::time(nullptr);
  Part old;  // a re-sent part replaces the first; freed outside the lock
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(id);
    if (it == uploads.end()) return S3Error("NoSuchUpload", "The specified upload was aborted.");
    old = std::move(it->second.parts[part]);
    it->second.parts[part] =
        Part{std::move(segments),
             len,
             etag,
             now,
             declared ? std::string(s3::ChecksumName(*declared)) : std::string(),
             checksum};
  }
  SendXml(c, 200,
          "<CopyPartResult" + std::string(kXmlns) + "><LastModified>" + s3::FormatIsoDate(now) +
              "</LastModified><ETag>" + s3::XmlEscape(etag) + "</ETag></CopyPartResult>");
  return Status::OK();
}

Status S3Server::Impl::ListParts(Ctx& c) {
  const std::string& id = *c.Query("uploadId");
  int64_t max_parts = 1000;
  XSILO_RETURN_IF_ERROR(ParseMaxItems(c.Query("max-parts"), "max-parts", &max_parts));
  int marker = 0;
  if (const std::string* m = c.Query("part-number-marker")) {
    if (!AllDigits(*m, 5)) {
      return S3Error("InvalidArgument", "part-number-marker must be an integer from 0 to 10000");
    }
    marker = std::stoi(*m);
  }
  std::string parts;
  int last = 0;
  bool truncated = false;
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(id);
    if (it == uploads.end() || it->second.bucket != c.bucket || it->second.key != c.key) {
      return S3Error("NoSuchUpload", "The specified upload does not exist.");
    }
    int64_t n = 0;
    for (auto p = it->second.parts.upper_bound(marker); p != it->second.parts.end(); ++p) {
      if (n == max_parts) {
        truncated = true;
        break;
      }
      ++n;
      last = p->first;
      parts += "<Part><PartNumber>" + std::to_string(p->first) + "</PartNumber><LastModified>" +
               s3::FormatIsoDate(p->second.mtime) + "</LastModified><ETag>" +
               s3::XmlEscape(p->second.etag) + "</ETag>" +
               ChecksumXml(p->second.checksum_algorithm, p->second.checksum) + "<Size>" +
               std::to_string(p->second.size) + "</Size></Part>";
    }
  }
  std::string xml =
      "<ListPartsResult" + std::string(kXmlns) + "><Bucket>" + s3::XmlEscape(c.bucket) +
      "</Bucket><Key>" + s3::XmlEscape(c.key) + "</Key><UploadId>" + s3::XmlEscape(id) +
      "</UploadId><Initiator><ID>xsilo</ID><DisplayName>xsilo</DisplayName>"
      "</Initiator>" +
      std::string(kOwnerXml) + "<StorageClass>STANDARD</StorageClass><PartNumberMarker>" +
      std::to_string(marker) + "</PartNumberMarker>";
  if (truncated) xml += "<NextPartNumberMarker>" + std::to_string(last) + "</NextPartNumberMarker>";
  xml += "<MaxParts>" + std::to_string(max_parts) + "</MaxParts><IsTruncated>" +
         (truncated ? "true" : "false") + "</IsTruncated>" + parts + "</ListPartsResult>";
  SendXml(c, 200, std::move(xml));
  return Status::OK();
}

Status S3Server::Impl::ListMultipartUploads(Ctx& c) {
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  auto q = [&](std::string_view n) {
    const std::string* v = c.Query(n);
    return v ? *v : std::string();
  };
  std::string prefix = q("prefix"), delimiter = q("delimiter");
  std::string key_marker = q("key-marker"), id_marker = q("upload-id-marker");
  const std::string* encoding = c.Query("encoding-type");
  if (encoding && *encoding != "url") {
    return S3Error("InvalidArgument", "Invalid Encoding Method specified in Request");
  }
  auto enc = [&](const std::string& s) {
    return s3::XmlEscape(encoding ? s3::UriEncode(s, false) : s);
  };
  int64_t max_uploads = 1000;
  XSILO_RETURN_IF_ERROR(ParseMaxItems(c.Query("max-uploads"), "max-uploads", &max_uploads));
  struct Listed {
    std::string key;
    std::string id;
    std::time_t initiated;
    uint64_t seq;
  };
  std::vector<Listed> all;
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    for (const auto& [id, u] : uploads) {
      if (u.bucket == c.bucket && u.key.compare(0, prefix.size(), prefix) == 0) {
        all.push_back({u.key, id, u.initiated, u.seq});
      }
    }
  }
  // By key, then by initiation (S3's order).
  std::sort(all.begin(), all.end(), [](const Listed& a, const Listed& b) {
    return a.key != b.key ? a.key < b.key : a.seq < b.seq;
  });
  // upload-id-marker counts only with key-marker: uploads of that key after it.
  uint64_t id_marker_seq = 0;
  bool id_marker_found = false;
  if (!key_marker.empty() && !id_marker.empty()) {
    for (const Listed& l : all) {
      if (l.key == key_marker && l.id == id_marker) {
        id_marker_seq = l.seq;
        id_marker_found = true;
      }
    }
  }
  auto past_marker = [&](size_t i) {
    if (key_marker.empty()) return true;
    if (all[i].key > key_marker) return true;
    return id_marker_found && all[i].key == key_marker && all[i].seq > id_marker_seq;
  };
  // A common prefix is skipped when the key marker lies inside it.
  Page page = Paginate(
      all.size(), [&](size_t i) -> const std::string& { return all[i].key; }, past_marker,
      key_marker, prefix, delimiter, max_uploads);
  std::string body, next_key, next_id;
  for (const PageItem& item : page.items) {
    if (!item.prefix.empty()) {
      next_key = item.prefix;
      next_id.clear();
      body += "<CommonPrefixes><Prefix>" + enc(item.prefix) + "</Prefix></CommonPrefixes>";
      continue;
    }
    const Listed& l = all[item.index];
    next_key = l.key;
    next_id = l.id;
    body += "<Upload><Key>" + enc(l.key) + "</Key><UploadId>" + s3::XmlEscape(l.id) +
            "</UploadId><Initiator><ID>xsilo</ID><DisplayName>xsilo</DisplayName></Initiator>" +
            std::string(kOwnerXml) + "<StorageClass>STANDARD</StorageClass><Initiated>" +
            s3::FormatIsoDate(l.initiated) + "</Initiated></Upload>";
  }
  std::string xml = "<ListMultipartUploadsResult" + std::string(kXmlns) + "><Bucket>" +
                    s3::XmlEscape(c.bucket) + "</Bucket><KeyMarker>" + enc(key_marker) +
                    "</KeyMarker><UploadIdMarker>" + s3::XmlEscape(id_marker) + "</UploadIdMarker>";
  if (page.truncated) {
    xml += "<NextKeyMarker>" + enc(next_key) + "</NextKeyMarker><NextUploadIdMarker>" +
           s3::XmlEscape(next_id) + "</NextUploadIdMarker>";
  }
  xml += "<Prefix>" + enc(prefix) + "</Prefix>";
  if (!delimiter.empty()) xml += "<Delimiter>" + enc(delimiter) + "</Delimiter>";
  if (encoding) xml += "<EncodingType>url</EncodingType>";
  xml += "<MaxUploads>" + std::to_string(max_uploads) + "</MaxUploads><IsTruncated>" +
         (page.truncated ? "true" : "false") + "</IsTruncated>" + body +
         "</ListMultipartUploadsResult>";
  SendXml(c, 200, std::move(xml));
  return Status::OK();
}

Status S3Server::Impl::AbortUpload(Ctx& c) {
  const std::string& id = *c.Query("uploadId");
  Upload dead;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(uploads_mu);
    auto it = uploads.find(id);
    if (it == uploads.end() || it->second.bucket != c.bucket || it->second.key != c.key) {
      return S3Error("NoSuchUpload", "The specified upload does not exist.");
    }
    dead = std::move(it->second);
    uploads.erase(it);
  }
  c.resp->status = 204;
  return Status::OK();
}

}  // namespace xsilo
