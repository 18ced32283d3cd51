// Multipart uploads: create, list, abort, and the completion body.
#include "s3/client_internal.h"

namespace xsilo {

using s3::Params;
using namespace s3client;

namespace s3client {
Result<std::string> StartMultipart(S3Client::Impl& impl, const std::string& bucket,
                                   const std::string& key, const std::string& content_type,
                                   const std::vector<std::pair<std::string, std::string>>& metadata,
                                   const Params& headers) {
  Call create;
  create.method = "POST";
  create.bucket = bucket;
  create.key = key;
  create.query = {{"uploads", ""}};
  if (!content_type.empty()) create.headers.emplace_back("content-type", content_type);
  for (const auto& [k, v] : metadata) {
    std::string name = k;
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    create.headers.emplace_back("x-amz-meta-" + name, v);
  }
  AddStoredHeaders(headers, &create.headers);
  Reply cr;
  XSILO_RETURN_IF_ERROR(impl.Execute(create, &cr));
  std::string upload_id = s3::XmlText(cr.text, "UploadId").value_or("");
  if (upload_id.empty()) return Internal("CreateMultipartUpload: no UploadId in the response");
  return upload_id;
}

}  // namespace s3client

std::string CompleteMultipartXml(const std::vector<std::string>& etags) {
  std::string xml = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  for (size_t i = 0; i < etags.size(); ++i) {
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" +
           s3::XmlEscape(etags[i]) + "</ETag></Part>";
  }
  xml += "</CompleteMultipartUpload>";
  return xml;
}

Result<std::string> S3Client::CreateMultipartUpload(const ObjectArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  return StartMultipart(*impl_, args.bucket, args.key, "", {}, {});
}

Result<std::vector<MultipartUploadInfo>> S3Client::ListMultipartUploads(
    const ListUploadsArgs& args) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  std::vector<MultipartUploadInfo> out;
  std::string key_marker, id_marker;
  while (true) {
    Call c;
    c.method = "GET";
    c.bucket = args.bucket;
    c.query = {{"uploads", ""}, {"max-uploads", std::to_string(args.max_uploads)}};
    if (!args.prefix.empty()) c.query.emplace_back("prefix", args.prefix);
    if (!key_marker.empty()) c.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) c.query.emplace_back("upload-id-marker", id_marker);
    Reply r;
    XSILO_RETURN_IF_ERROR(impl_->Execute(c, &r));
    if (r.text.find("<ListMultipartUploadsResult") == std::string::npos) {
      return Internal("ListMultipartUploads: unexpected response body");
    }
    s3::XmlForEach(r.text, "Upload", [&](std::string_view item) {
      MultipartUploadInfo u;
      u.key = s3::XmlText(item, "Key").value_or("");
      u.upload_id = s3::XmlText(item, "UploadId").value_or("");
      u.initiated = s3::ParseIsoDate(s3::XmlText(item, "Initiated").value_or(""));
      out.push_back(std::move(u));
    });
    if (s3::XmlText(r.text, "IsTruncated").value_or("false") != "true") break;
    std::string next_key = s3::XmlText(r.text, "NextKeyMarker").value_or("");
    std::string next_id = s3::XmlText(r.text, "NextUploadIdMarker").value_or("");
    if (next_key.empty() || (next_key == key_marker && next_id == id_marker)) {
      return Internal("ListMultipartUploads: truncated listing without a new marker");
    }
    key_marker = std::move(next_key);
    id_marker = std::move(next_id);
  }
  return out;
}

Result<std::vector<PartInfo>> S3Client::ListParts(const ObjectArgs& args,
                                                  const std::string& upload_id) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  if (upload_id.empty()) return InvalidArgument("ListParts: empty upload id");
  std::vector<PartInfo> out;
  std::string marker;
  while (true) {
    Call c;
    c.method = "GET";
    c.bucket = args.bucket;
    c.key = args.key;
    c.query = {{"uploadId", upload_id}};
    if (!marker.empty()) c.query.emplace_back("part-number-marker", marker);
    Reply r;
    XSILO_RETURN_IF_ERROR(impl_->Execute(c, &r));
    if (r.text.find("<ListPartsResult") == std::string::npos) {
      return Internal("ListParts: unexpected response body");
    }
    s3::XmlForEach(r.text, "Part", [&](std::string_view item) {
      PartInfo p;
      p.part_number = std::atoi(s3::XmlText(item, "PartNumber").value_or("0").c_str());
      p.size = std::strtoull(s3::XmlText(item, "Size").value_or("0").c_str(), nullptr, 10);
      p.etag = s3::XmlText(item, "ETag").value_or("");
      p.last_modified = s3::ParseIsoDate(s3::XmlText(item, "LastModified").value_or(""));
      out.push_back(std::move(p));
    });
    if (s3::XmlText(r.text, "IsTruncated").value_or("false") != "true") break;
    std::string next = s3::XmlText(r.text, "NextPartNumberMarker").value_or("");
    if (next.empty() || next == marker) {
      return Internal("ListParts: truncated listing without a new marker");
    }
    marker = std::move(next);
  }
  return out;
}

Status S3Client::AbortMultipartUpload(const ObjectArgs& args, const std::string& upload_id) {
  XSILO_RETURN_IF_ERROR(args.Validate());
  if (upload_id.empty()) return InvalidArgument("AbortMultipartUpload: empty upload id");
  Call a;
  a.method = "DELETE";
  a.bucket = args.bucket;
  a.key = args.key;
  a.query = {{"uploadId", upload_id}};
  Reply ar;
  return impl_->Execute(a, &ar);
}

}  // namespace xsilo
