// Object operations: PUT, GET and HEAD, DELETE, and the server-side copy.
#include <algorithm>
#include <optional>
#include <string>

#include "net/crypto.h"
#include "s3/checksums.h"
#include "s3/server_internal.h"
#include "s3/sigv4.h"
#include "s3/xml.h"

namespace xsilo {

using namespace s3server;

namespace {

// The standard headers S3 keeps with an object (as S3 spells them) and the
// GET query parameter that overrides each in the response.
struct StoredHeaderName {
  std::string_view name;
  std::string_view lower;
  std::string_view response_param;
};
constexpr StoredHeaderName kStoredHeaders[] = {
    {"Cache-Control", "cache-control", "response-cache-control"},
    {"Content-Disposition", "content-disposition", "response-content-disposition"},
    {"Content-Encoding", "content-encoding", "response-content-encoding"},
    {"Content-Language", "content-language", "response-content-language"},
    {"Expires", "expires", "response-expires"},
};

// Content-Encoding without "aws-chunked", which describes the upload's
// framing and not the object (S3 does not store it either).
std::string StorableContentEncoding(std::string_view value) {
  std::string out;
  while (!value.empty()) {
    size_t comma = value.find(',');
    std::string_view token = net::TrimOws(value.substr(0, comma));
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
    if (token.empty() || token == "aws-chunked") continue;
    if (!out.empty()) out += ", ";
    out += token;
  }
  return out;
}

}  // namespace

namespace s3server {

std::vector<Buffer> SliceSegments(const std::vector<Buffer>& segs, uint64_t offset, uint64_t len) {
  std::vector<Buffer> out;
  for (const Buffer& s : segs) {
    if (len == 0) break;
    if (offset >= s.size()) {
      offset -= s.size();
      continue;
    }
    uint64_t n = std::min(len, s.size() - offset);
    out.push_back(s.SliceUnchecked(offset, n));
    len -= n;
    offset = 0;
  }
  return out;
}

// The response headers of a stored checksum: x-amz-checksum-<algorithm>.
Params ChecksumHeaders(const std::string& algorithm, const std::string& value) {
  Params out;
  auto a = s3::ParseChecksumAlgorithm(algorithm);
  if (a && !value.empty()) out.emplace_back(s3::ChecksumHeader(*a), value);
  return out;
}

Params StoredHeaders(const HttpRequest& req) {
  Params out;
  for (const auto& h : kStoredHeaders) {
    const std::string* v = req.Header(h.lower);
    if (!v) continue;
    std::string value = h.lower == "content-encoding" ? StorableContentEncoding(*v) : *v;
    if (!value.empty() || h.lower != "content-encoding") {
      out.emplace_back(std::string(h.name), std::move(value));
    }
  }
  return out;
}

Params UserMetadata(const HttpRequest& req) {
  Params out;
  for (const auto& [k, v] : req.headers) {
    if (k.rfind("x-amz-meta-", 0) == 0) out.emplace_back(k, v);
  }
  return out;
}

}  // namespace s3server

Status S3Server::Impl::PutObject(Ctx& c) {
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  XSILO_ASSIGN_OR_RETURN(PutCondition condition, WriteCondition(c.req));
  StoredObject obj;
  XSILO_ASSIGN_OR_RETURN(s3::RequestBody received,
                         ReadBody(c, {.limit = opts.max_object_bytes, .etag = etag_hash()}));
  Buffer body = std::move(received.bytes);
  obj.size = body.size();
  obj.etag = std::move(received.etag);
  obj.checksum_algorithm = std::move(received.checksum_algorithm);
  obj.checksum = std::move(received.checksum);
  obj.mtime = std::time(nullptr);
  if (const std::string* ct = c.req.Header("content-type")) obj.content_type = *ct;
  obj.user_metadata = UserMetadata(c.req);
  obj.headers = StoredHeaders(c.req);
  if (!body.empty()) obj.segments.push_back(std::move(body));
  std::string etag = obj.etag;
  Params checksum_header = ChecksumHeaders(obj.checksum_algorithm, obj.checksum);
  XSILO_RETURN_IF_ERROR(store->Put(c.bucket, c.key, std::move(obj), condition));
  c.resp->headers.emplace_back("ETag", etag);
  for (auto& h : checksum_header) c.resp->headers.push_back(std::move(h));
  return Status::OK();
}

Status S3Server::Impl::GetObject(Ctx& c) {
  // response-* parameters replace stored headers in this one response.
  Params overrides;
  for (const auto& [k, v] : c.query) {
    if (k.rfind("response-", 0) != 0) continue;
    std::string_view name;
    if (k == "response-content-type") name = "Content-Type";
    for (const auto& h : kStoredHeaders) {
      if (k == h.response_param) name = h.name;
    }
    if (name.empty()) {
      return S3Error("InvalidArgument", "Unknown response header override: " + k);
    }
    overrides.emplace_back(std::string(name), v);
  }
  if (!overrides.empty() && c.anonymous) {
    return S3Error("InvalidRequest",
                   "Request specific response headers cannot be used for anonymous GET requests.");
  }
  XSILO_ASSIGN_OR_RETURN(StoredObject obj, store->Get(c.bucket, c.key));
  HttpResponse* r = c.resp;
  r->headers.emplace_back("ETag", obj.etag);
  r->headers.emplace_back("Last-Modified", s3::FormatHttpDate(obj.mtime));
  switch (EvaluatePreconditions(c.req, obj, "")) {
    case Precondition::kFailed:
      return PreconditionFailed();
    case Precondition::kNotModified:
      r->status = 304;
      r->omit_body = true;
      r->content_length = 0;
      return Status::OK();
    case Precondition::kProceed:
      break;
  }
  auto overridden = [&](std::string_view name) {
    for (const auto& kv : overrides) {
      if (kv.first == name) return true;
    }
    return false;
  };
  if (!overridden("Content-Type")) r->headers.emplace_back("Content-Type", obj.content_type);
  for (const auto& kv : obj.headers) {
    if (!overridden(kv.first)) r->headers.push_back(kv);
  }
  for (auto& kv : overrides) r->headers.push_back(std::move(kv));
  r->headers.emplace_back("Accept-Ranges", "bytes");
  for (const auto& kv : obj.user_metadata) r->headers.push_back(kv);
  const std::string* range = c.req.Header("range");
  uint64_t start = 0, len = obj.size;
  int rr = range ? ParseRange(*range, obj.size, &start, &len) : 0;
  if (rr < 0) {
    c.resp->headers.emplace_back("Content-Range", "bytes */" + std::to_string(obj.size));
    return S3Error("InvalidRange", "The requested range is not satisfiable");
  }
  if (rr > 0) {
    r->status = 206;
    r->headers.emplace_back("Content-Range", "bytes " + std::to_string(start) + "-" +
                                                 std::to_string(start + len - 1) + "/" +
                                                 std::to_string(obj.size));
  } else if (const std::string* mode = c.req.Header("x-amz-checksum-mode");
             mode != nullptr && (*mode == "ENABLED" || *mode == "enabled")) {
    // Asked for, as S3 wants it; a whole-object checksum describes only
    // the whole object.
    for (auto& h : ChecksumHeaders(obj.checksum_algorithm, obj.checksum)) {
      r->headers.push_back(std::move(h));
    }
  }
  if (c.head) {
    r->omit_body = true;
    r->content_length = len;
  } else if (obj.file && obj.segments.size() == 1) {
    // A stored file goes by sendfile: no copy through this process.
    r->body.clear();
    r->file_fd = obj.file->fd;
    r->file_offset = start;
    r->file_length = len;
    r->file_owner = std::move(obj.file);
  } else {
    r->SetBody(rr > 0 ? SliceSegments(obj.segments, start, len) : std::move(obj.segments));
  }
  return Status::OK();
}

Status S3Server::Impl::DeleteObject(Ctx& c) {
  XSILO_RETURN_IF_ERROR(store->Delete(c.bucket, c.key));
  c.resp->status = 204;
  return Status::OK();
}

// x-amz-copy-source ("[/]bucket/key[?versionId=v]", percent-encoded) read,
// and its x-amz-copy-source-if-* conditions checked.
Result<StoredObject> S3Server::Impl::ReadCopySource(Ctx& c, std::string* bucket, std::string* key) {
  std::string_view raw = *c.req.Header("x-amz-copy-source");
  std::string version;
  if (size_t q = raw.find('?'); q != std::string_view::npos) {
    Params params;
    if (!s3::ParseQuery(raw.substr(q + 1), &params)) {
      return S3Error("InvalidArgument", "Invalid copy source encoding.");
    }
    for (const auto& [k, v] : params) {
      if (k == "versionId") version = v;
    }
    raw = raw.substr(0, q);
  }
  std::string source;
  if (!s3::UriDecode(raw, &source)) {
    return S3Error("InvalidArgument", "Invalid copy source encoding.");
  }
  if (!source.empty() && source[0] == '/') source.erase(0, 1);
  size_t slash = source.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == source.size()) {
    return S3Error("InvalidArgument",
                   "Copy Source must mention the source bucket and key: sourcebucket/sourcekey");
  }
  *bucket = source.substr(0, slash);
  *key = source.substr(slash + 1);
  if (key->size() > 1024) return S3Error("KeyTooLongError", "Your key is too long.");
  if (!version.empty() && version != "null") {
    return S3Error("NoSuchVersion",
                   "The specified version does not exist (buckets here are not versioned).");
  }
  XSILO_ASSIGN_OR_RETURN(StoredObject obj, store->Get(*bucket, *key));
  if (EvaluatePreconditions(c.req, obj, "x-amz-copy-source-") != Precondition::kProceed) {
    return PreconditionFailed();
  }
  return obj;
}

Status S3Server::Impl::CopyObject(Ctx& c) {
  XSILO_RETURN_IF_ERROR(store->HeadBucket(c.bucket));
  std::string directive = "COPY";
  if (const std::string* d = c.req.Header("x-amz-metadata-directive")) directive = *d;
  if (directive != "COPY" && directive != "REPLACE") {
    return S3Error("InvalidArgument", "Unknown metadata directive.");
  }
  std::string src_bucket, src_key;
  XSILO_ASSIGN_OR_RETURN(StoredObject src, ReadCopySource(c, &src_bucket, &src_key));
  if (src_bucket == c.bucket && src_key == c.key && directive == "COPY") {
    return S3Error("InvalidRequest",
                   "This copy request is illegal because it is trying to copy an object to itself "
                   "without changing the object's metadata, storage class, website redirect "
                   "location or encryption attributes.");
  }
  StoredObject obj;
  obj.segments = std::move(src.segments);  // shared, not copied, by the memory store
  obj.size = src.size;
  // A single-PUT ETag is the hash of the bytes, still right; a multipart
  // one is not: the copy is one object, hashed as a PUT would be. So is a
  // composite checksum.
  // Both in one pass over the bytes.
  obj.etag = src.etag;
  obj.checksum_algorithm = src.checksum_algorithm;
  obj.checksum = src.checksum;
  if (src.etag.find('-') != std::string::npos) {
    s3::EtagHasher etag(etag_hash());
    std::optional<s3::ChecksumStream> whole;
    if (auto a = s3::ParseChecksumAlgorithm(src.checksum_algorithm);
        a && src.checksum.find('-') != std::string::npos) {
      whole.emplace(*a);
    }
    for (const Buffer& b : obj.segments) {
      etag.Update(b.data(), b.size());
      if (whole) whole->Update(b.data(), b.size());
    }
    obj.etag = etag.Finish();
    if (whole) obj.checksum = net::Base64Of(whole->Finish());
  }
  if (directive == "COPY") {
    obj.content_type = std::move(src.content_type);
    obj.user_metadata = std::move(src.user_metadata);
    obj.headers = std::move(src.headers);
  } else {
    if (const std::string* ct = c.req.Header("content-type")) obj.content_type = *ct;
    obj.user_metadata = UserMetadata(c.req);
    obj.headers = StoredHeaders(c.req);
  }
  obj.mtime = std::time(nullptr);
  std::time_t mtime = obj.mtime;
  std::string etag = obj.etag;
  XSILO_ASSIGN_OR_RETURN(PutCondition condition, WriteCondition(c.req));
  XSILO_RETURN_IF_ERROR(store->Put(c.bucket, c.key, std::move(obj), condition));
  SendXml(c, 200,
          "<CopyObjectResult" + std::string(kXmlns) + "><LastModified>" + s3::FormatIsoDate(mtime) +
              "</LastModified><ETag>" + s3::XmlEscape(etag) + "</ETag></CopyObjectResult>");
  return Status::OK();
}

}  // namespace xsilo
