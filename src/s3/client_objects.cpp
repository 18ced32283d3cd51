// Buckets and single-request object operations.
#include "s3/client_internal.h"

namespace xsilo {

using s3::Params;
using namespace s3client;

namespace s3client {
S3ObjectInfo InfoFromHeaders(const std::string& key, const Reply& r) {
  S3ObjectInfo info;
  info.key = key;
  if (const std::string* v = r.Header("content-range")) {
    size_t slash = v->rfind('/');
    if (slash != std::string::npos && (*v)[slash + 1] != '*')
      info.size = std::strtoull(v->c_str() + slash + 1, nullptr, 10);
  } else if (const std::string* cl = r.Header("content-length")) {
    info.size = std::strtoull(cl->c_str(), nullptr, 10);
  }
  if (const std::string* v = r.Header("etag")) info.etag = *v;
  if (const std::string* v = r.Header("content-type")) info.content_type = *v;
  if (const std::string* v = r.Header("last-modified")) info.last_modified = ParseHttpDate(*v);
  // A multipart object's composite checksum ("<base64>-<parts>") is not the
  // SHA-256 of its bytes: nothing to verify a download against.
  if (const std::string* v = r.Header("x-amz-checksum-sha256");
      v != nullptr && v->find('-') == std::string::npos) {
    info.checksum_sha256 = *v;
  }
  for (const auto& [k, v] : r.headers) {
    if (k.rfind("x-amz-meta-", 0) == 0) info.metadata.emplace_back(k.substr(11), v);
    for (std::string_view name : kStoredHeaderNames) {
      if (SameNameIgnoringCase(k, name)) info.headers.emplace_back(std::string(name), v);
    }
  }
  return info;
}

Status VerifySha256(const uint8_t* data, uint64_t size, const std::string& want_b64,
                    const std::string& what) {
  net::Sha256Digest d = net::Sha256({data, static_cast<size_t>(size)});
  std::string got = net::Base64Of(d);
  if (got != want_b64) {
    return Corrupt("BadDigest: SHA-256 of the received bytes (" + got + ") differs from the " +
                   what + " (" + want_b64 + ")");
  }
  return Status::OK();
}
}  // namespace s3client

Result<PutObjectResult> S3Client::Impl::Put(
    const std::string& bucket, const std::string& key, const GatherList& body,
    const std::string& content_type,
    const std::vector<std::pair<std::string, std::string>>& metadata, const Params& headers,
    bool checksum, bool md5, Params query) {
  Call c;
  c.method = "PUT";
  c.bucket = bucket;
  c.key = key;
  c.body = &body;
  c.query = std::move(query);
  if (!content_type.empty()) c.headers.emplace_back("content-type", content_type);
  for (const auto& [k, v] : metadata) {
    std::string name = k;
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    c.headers.emplace_back("x-amz-meta-" + name, v);
  }
  AddStoredHeaders(headers, &c.headers);
  PutObjectResult result;
  if (checksum) {
    result.checksum_sha256 = net::Base64Of(Sha256Of(body));
    c.headers.emplace_back("x-amz-checksum-sha256", result.checksum_sha256);
  }
  if (md5) c.headers.emplace_back("content-md5", net::Base64Of(Md5Of(body)));
  Reply r;
  XSILO_RETURN_IF_ERROR(Execute(c, &r));
  if (const std::string* e = r.Header("etag")) result.etag = *e;
  return result;
}

Status S3Client::CreateBucket(const CreateBucketArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "PUT";
  c.bucket = args.bucket;
  if (impl_->opts.region != "us-east-1") {
    c.has_text_body = true;
    c.text_body =
        "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
        "<LocationConstraint>" +
        s3::XmlEscape(impl_->opts.region) + "</LocationConstraint></CreateBucketConfiguration>";
  }
  Reply r;
  return impl_->Execute(c, &r);
}

Status S3Client::HeadBucket(const BucketArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "HEAD";
  c.bucket = args.bucket;
  Reply r;
  return impl_->Execute(c, &r);
}

Status S3Client::DeleteBucket(const BucketArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "DELETE";
  c.bucket = args.bucket;
  Reply r;
  return impl_->Execute(c, &r);
}

Result<PutObjectResult> S3Client::PutObject(const PutObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  return impl_->Put(args.bucket, args.key, args.body, args.content_type, args.metadata,
                    args.headers, args.checksum_sha256, args.content_md5, {});
}

Result<GetObjectResult> S3Client::GetObject(const GetObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "GET";
  c.bucket = args.bucket;
  c.key = args.key;
  c.allocate_body = true;
  bool ranged = args.offset > 0 || args.length.has_value();
  if (ranged) {
    std::string range = "bytes=" + std::to_string(args.offset) + "-";
    if (args.length) range += std::to_string(args.offset + *args.length - 1);
    c.headers.emplace_back("range", range);
  }
  if (args.verify_checksum) c.headers.emplace_back("x-amz-checksum-mode", "ENABLED");
  if (!args.if_match.empty()) c.headers.emplace_back("if-match", args.if_match);
  if (!args.if_none_match.empty()) c.headers.emplace_back("if-none-match", args.if_none_match);
  if (args.if_modified_since != 0) {
    c.headers.emplace_back("if-modified-since", s3::FormatHttpDate(args.if_modified_since));
  }
  if (args.if_unmodified_since != 0) {
    c.headers.emplace_back("if-unmodified-since", s3::FormatHttpDate(args.if_unmodified_since));
  }
  Reply r;
  XSILO_RETURN_IF_ERROR(impl_->Execute(c, &r));
  GetObjectResult out;
  out.info = InfoFromHeaders(args.key, r);
  out.data = std::move(r.body);
  if (ranged && r.status == 200 &&
      (args.offset > 0 || (args.length && *args.length < out.data.size()))) {
    // The server ignored the Range header: keep only what was asked for.
    uint64_t end =
        args.length ? std::min(out.data.size(), args.offset + *args.length) : out.data.size();
    if (args.offset >= out.data.size()) return OutOfRange("InvalidRange: offset past the end");
    out.data = out.data.SliceUnchecked(args.offset, end - args.offset);
  }
  if (!ranged) {
    if (args.verify_checksum && !out.info.checksum_sha256.empty()) {
      XSILO_RETURN_IF_ERROR(VerifySha256(out.data.data(), out.data.size(), out.info.checksum_sha256,
                                         "stored x-amz-checksum-sha256"));
    }
    if (!args.expected_sha256.empty()) {
      XSILO_RETURN_IF_ERROR(VerifySha256(out.data.data(), out.data.size(), args.expected_sha256,
                                         "expected checksum"));
    }
  } else if (!args.expected_sha256.empty()) {
    XSILO_RETURN_IF_ERROR(
        VerifySha256(out.data.data(), out.data.size(), args.expected_sha256, "expected checksum"));
  }
  return out;
}

Result<S3ObjectInfo> S3Client::HeadObject(const ObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "HEAD";
  c.bucket = args.bucket;
  c.key = args.key;
  c.headers.emplace_back("x-amz-checksum-mode", "ENABLED");
  Reply r;
  XSILO_RETURN_IF_ERROR(impl_->Execute(c, &r));
  return InfoFromHeaders(args.key, r);
}

Status S3Client::DeleteObject(const ObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "DELETE";
  c.bucket = args.bucket;
  c.key = args.key;
  Reply r;
  return impl_->Execute(c, &r);
}

Result<CopyObjectResult> S3Client::CopyObject(const CopyObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  Call c;
  c.method = "PUT";
  c.bucket = args.bucket;
  c.key = args.key;
  c.headers.emplace_back("x-amz-copy-source",
                         s3::UriEncode("/" + args.source_bucket + "/" + args.source_key, false));
  if (args.replace_metadata) {
    c.headers.emplace_back("x-amz-metadata-directive", "REPLACE");
    if (!args.content_type.empty()) c.headers.emplace_back("content-type", args.content_type);
    for (const auto& [k, v] : args.metadata) {
      std::string name = k;
      std::transform(name.begin(), name.end(), name.begin(), ::tolower);
      c.headers.emplace_back("x-amz-meta-" + name, v);
    }
    AddStoredHeaders(args.headers, &c.headers);
  }
  if (!args.source_if_match.empty()) {
    c.headers.emplace_back("x-amz-copy-source-if-match", args.source_if_match);
  }
  Reply r;
  XSILO_RETURN_IF_ERROR(impl_->Execute(c, &r));
  // S3 may answer 200 and report a failure in the body.
  if (r.text.find("<Error>") != std::string::npos) return impl_->HttpError(c, r);
  CopyObjectResult out;
  out.etag = s3::XmlText(r.text, "ETag").value_or("");
  out.last_modified = s3::ParseIsoDate(s3::XmlText(r.text, "LastModified").value_or(""));
  if (out.etag.empty()) return Internal("CopyObject: no ETag in the response");
  return out;
}

Result<ListObjectsResult> S3Client::ListObjects(const ListObjectsArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  ListObjectsResult out;
  std::string token = args.continuation_token;
  while (true) {
    Call c;
    c.method = "GET";
    c.bucket = args.bucket;
    c.query = {
        {"list-type", "2"}, {"encoding-type", "url"}, {"max-keys", std::to_string(args.max_keys)}};
    if (!args.prefix.empty()) c.query.emplace_back("prefix", args.prefix);
    if (!args.delimiter.empty()) c.query.emplace_back("delimiter", args.delimiter);
    if (!args.start_after.empty()) c.query.emplace_back("start-after", args.start_after);
    if (!token.empty()) c.query.emplace_back("continuation-token", token);
    Reply r;
    XSILO_RETURN_IF_ERROR(impl_->Execute(c, &r));
    XSILO_RETURN_IF_ERROR(s3::ParseListObjectsV2(r.text, &out));
    if (!args.fetch_all || !out.truncated || out.next_continuation_token.empty()) break;
    token = out.next_continuation_token;
  }
  if (args.fetch_all) {
    out.truncated = false;
    out.next_continuation_token.clear();
  }
  return out;
}

}  // namespace xsilo
