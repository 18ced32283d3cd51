// The S3 server: a request routed to its operation, errors answered as S3
// does, start and stop. The operations are in server_*.cpp.
#include "xsilo/s3/server.h"

#include <cinttypes>
#include <cstdio>

#include "net/tls.h"
#include "s3/errors.h"
#include "s3/server_internal.h"
#include "s3/sigv4.h"
#include "s3/xml.h"
#include "xsilo/s3/errors.h"

namespace xsilo {

using namespace s3server;

namespace {

// S3 subresources (query parameters naming an API other than the plain
// object or bucket one) this server does not implement. A request naming
// one is refused rather than served as the plain operation: PUT ?retention
// must not overwrite the object, DELETE ?cors must not delete the bucket.
constexpr std::string_view kUnimplementedSubresources[] = {
    "accelerate",
    "acl",
    "analytics",
    "attributes",
    "cors",
    "encryption",
    "intelligent-tiering",
    "inventory",
    "legal-hold",
    "lifecycle",
    "logging",
    "metrics",
    "notification",
    "object-lock",
    "ownershipControls",
    "policy",
    "policyStatus",
    "publicAccessBlock",
    "replication",
    "requestPayment",
    "restore",
    "retention",
    "select",
    "tagging",
    "torrent",
    "versioning",
    "website",
    "session",
    "renameObject",
};

}  // namespace

void S3Server::Impl::SendXml(Ctx& c, int status, std::string xml) {
  c.resp->status = status;
  c.resp->headers.emplace_back("Content-Type", "application/xml");
  c.resp->SetBody(std::string(kXmlHeader) + xml);
}

void S3Server::Impl::SendError(Ctx& c, const Status& st) {
  std::string code = S3ErrorCode(st);
  if (code.empty()) code = "InternalError";
  s3::S3ErrorKind kind = s3::LookupS3Error(code);
  std::string message = st.message();
  if (message.compare(0, code.size() + 2, code + ": ") == 0)
    message = message.substr(code.size() + 2);
  HttpResponse* r = c.resp;
  r->status = kind.http_status;
  // Headers of the failed operation go, except Content-Range (416 keeps "bytes */size").
  Params kept;
  for (auto& kv : r->headers) {
    if (kv.first == "Content-Range") kept.push_back(std::move(kv));
  }
  r->headers = std::move(kept);
  r->headers.emplace_back("x-amz-request-id", c.request_id);
  r->headers.emplace_back("Content-Type", "application/xml");
  std::string xml = std::string(kXmlHeader) + "<Error><Code>" + s3::XmlEscape(code) +
                    "</Code><Message>" + s3::XmlEscape(message) + "</Message>";
  if (!c.bucket.empty()) xml += "<BucketName>" + s3::XmlEscape(c.bucket) + "</BucketName>";
  if (!c.key.empty()) xml += "<Key>" + s3::XmlEscape(c.key) + "</Key>";
  xml += "<Resource>" + s3::XmlEscape(c.req.raw_path) + "</Resource><RequestId>" + c.request_id +
         "</RequestId></Error>";
  if (c.head) {
    r->body.clear();
    r->omit_body = true;
    r->content_length = 0;
  } else {
    r->SetBody(std::move(xml));
  }
}

void S3Server::Impl::Handle(const HttpRequest& req, BodyReader& body, HttpResponse* resp) {
  if (opts.on_request) {
    S3FaultRequest f{req.method, req.raw_path, {}, req.raw_query};
    if (const std::string* r = req.Header("range")) f.range = *r;
    opts.on_request(f);
  }
  char id[32];
  std::snprintf(id, sizeof(id), "%016" PRIX64, next_id.fetch_add(1) ^ id_salt);
  Ctx c{req, body, resp, {}, {}, {}, {}, id, req.method == "HEAD", false};
  resp->headers.emplace_back("x-amz-request-id", c.request_id);
  resp->headers.emplace_back("Server", "xsilo-s3d");
  Status st = Route(c);
  if (!st.ok()) SendError(c, st);
}

Status S3Server::Impl::Route(Ctx& c) {
  const HttpRequest& req = c.req;
  if (!s3::ParseQuery(req.raw_query, &c.query)) {
    return S3Error("InvalidURI", "Couldn't parse the specified URI (query).");
  }
  std::string path;
  if (!s3::UriDecode(req.raw_path, &path) || path.empty() || path[0] != '/') {
    return S3Error("InvalidURI", "Couldn't parse the specified URI.");
  }
  // Virtual-hosted style: the bucket is the first label of the Host header.
  bool virtual_host = false;
  if (!opts.virtual_host_domain.empty()) {
    if (const std::string* host = req.Header("host")) {
      std::string h =
          host->substr(0, host->rfind(':') == std::string::npos ? host->size() : host->rfind(':'));
      std::string suffix = "." + opts.virtual_host_domain;
      if (h.size() > suffix.size() &&
          h.compare(h.size() - suffix.size(), suffix.size(), suffix) == 0) {
        c.bucket = h.substr(0, h.size() - suffix.size());
        c.key = path.substr(1);
        virtual_host = true;
      }
    }
  }
  if (!virtual_host) {
    size_t slash = path.find('/', 1);
    c.bucket = path.substr(1, slash == std::string::npos ? std::string::npos : slash - 1);
    c.key = slash == std::string::npos ? std::string() : path.substr(slash + 1);
  }
  if (c.key.size() > 1024) return S3Error("KeyTooLongError", "Your key is too long.");

  // A CORS preflight is answered before authentication, as S3 does: this
  // server has no CORS configuration, so a complete one is refused (403)
  // and one without Origin is malformed (400).
  if (req.method == "OPTIONS") {
    if (!req.Header("origin") || !req.Header("access-control-request-method")) {
      return S3Error("BadRequest", "Insufficient information. Origin request header needed.");
    }
    return S3Error("CORSResponse", "CORS is not enabled for this bucket.");
  }
  Status auth = Authenticate(c);
  if (!auth.ok()) {
    // An unsigned request to a bucket that does not exist learns that it
    // does not (bucket names are public in S3 too), not AccessDenied.
    if (S3ErrorCode(auth) == "AccessDenied" && !req.Header("authorization") &&
        !c.HasQuery("X-Amz-Signature") && !c.bucket.empty()) {
      Status bucket = store->HeadBucket(c.bucket);
      if (S3ErrorCode(bucket) == "NoSuchBucket") return bucket;
    }
    return auth;
  }

  const std::string& m = req.method;
  for (std::string_view sub : kUnimplementedSubresources) {
    if (c.HasQuery(sub)) {
      return S3Error("NotImplemented",
                     "The " + std::string(sub) + " subresource is not implemented by xsilo s3d.");
    }
  }
  // Buckets here are unversioned: "null" names the one version of an object.
  if (const std::string* v = c.Query("versionId"); v && *v != "null") {
    return S3Error("InvalidArgument", "Invalid version id specified");
  }
  if (c.bucket.empty()) {
    if (m == "GET") return ListBuckets(c);
    return S3Error("MethodNotAllowed",
                   "The specified method is not allowed against this resource.");
  }
  if (c.key.empty()) {
    if (m == "PUT") return CreateBucket(c);
    if (m == "HEAD") return store->HeadBucket(c.bucket);
    if (m == "DELETE") return DeleteBucket(c);
    if (m == "GET" && c.HasQuery("location")) return GetBucketLocation(c);
    if (m == "GET" && c.HasQuery("uploads")) return ListMultipartUploads(c);
    if (m == "GET" && c.HasQuery("versions")) return ListObjectVersions(c);
    if (m == "GET") return ListObjects(c);
    if (m == "POST" && c.HasQuery("delete")) return DeleteObjects(c);
    return S3Error("MethodNotAllowed",
                   "The specified method is not allowed against this resource.");
  }
  if (m == "PUT") {
    if (c.HasQuery("uploadId") || c.HasQuery("partNumber")) return UploadPart(c);
    if (c.req.Header("x-amz-copy-source")) return CopyObject(c);
    return PutObject(c);
  }
  if (m == "GET" && c.HasQuery("uploadId")) return ListParts(c);
  if (m == "GET" || m == "HEAD") {
    if (c.HasQuery("uploadId") || c.HasQuery("partNumber")) {
      return S3Error("NotImplemented", "GetObject by partNumber is not implemented.");
    }
    return GetObject(c);
  }
  if (m == "POST") {
    if (c.HasQuery("uploads")) return CreateUpload(c);
    if (c.HasQuery("uploadId")) return CompleteUpload(c);
    return S3Error("NotImplemented", "This POST request is not implemented.");
  }
  if (m == "DELETE") {
    if (c.HasQuery("uploadId")) return AbortUpload(c);
    return DeleteObject(c);
  }
  return S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.");
}

Result<std::unique_ptr<S3Server>> S3Server::Start(S3ServerOptions options) {
  if (!options.allow_anonymous && (options.access_key.empty() || options.secret_key.empty())) {
    return InvalidArgument("S3Server: access_key and secret_key are required (or allow_anonymous)");
  }
  if (options.region.empty()) return InvalidArgument("S3Server: region must not be empty");
  if (options.max_connections < 1) return InvalidArgument("S3Server: max_connections must be >= 1");
  auto impl = std::make_unique<Impl>();
  impl->opts = std::move(options);
  if (impl->opts.directory.empty()) {
    impl->store = s3::NewMemoryObjectStore();
  } else {
    s3::DirectoryStoreOptions dso;
    dso.recycle_bytes = impl->opts.recycle_bytes;
    XSILO_ASSIGN_OR_RETURN(impl->store, s3::NewDirectoryObjectStore(impl->opts.directory, dso));
    if (dso.recycle_bytes > 0) {
      // Free files past their age go even when no request comes.
      Impl* i = impl.get();
      impl->trimmer = std::thread([i] {
        std::unique_lock<std::mutex> lock(i->trim_mu);
        while (!i->trim_cv.wait_for(lock, std::chrono::seconds(1), [i] { return i->trim_stop; })) {
          lock.unlock();
          i->store->Trim();
          lock.lock();
        }
      });
    }
  }
  for (const std::string& b : impl->opts.buckets) {
    if (!ValidBucketName(b)) return InvalidArgument("S3Server: invalid bucket name " + b);
    Status st = impl->store->CreateBucket(b);
    if (!st.ok() && S3ErrorCode(st) != "BucketAlreadyOwnedByYou") return st;
  }
  net::HttpServerOptions ho;
  if (impl->opts.tls_cert_file.empty() != impl->opts.tls_key_file.empty()) {
    return InvalidArgument("S3Server: give both tls_cert_file and tls_key_file, or neither");
  }
  if (!impl->opts.tls_cert_file.empty()) {
    XSILO_ASSIGN_OR_RETURN(
        ho.tls, net::TlsServerContext::Load(impl->opts.tls_cert_file, impl->opts.tls_key_file));
  }
  ho.host = impl->opts.host;
  ho.port = impl->opts.port;
  ho.max_header_bytes = impl->opts.max_header_bytes;
  ho.max_connections = impl->opts.max_connections;
  ho.idle_timeout = impl->opts.idle_timeout;
  ho.io_timeout = impl->opts.io_timeout;
  if (impl->opts.fault_drop_after_body_bytes) {
    auto hook = impl->opts.fault_drop_after_body_bytes;
    ho.drop_after_body_bytes = [hook](const HttpRequest& req) {
      S3FaultRequest f{req.method, req.raw_path, {}};
      if (const std::string* r = req.Header("range")) f.range = *r;
      return hook(f);
    };
  }
  ho.format_error = [](int status, std::string_view message) {
    std::string code = status == 431   ? "RequestHeaderSectionTooLarge"
                       : status == 501 ? "NotImplemented"
                                       : "BadRequest";
    return std::pair<std::string, std::string>(
        "application/xml", std::string(kXmlHeader) + "<Error><Code>" + code + "</Code><Message>" +
                               s3::XmlEscape(message) + "</Message></Error>");
  };
  Impl* raw = impl.get();
  impl->http = std::make_unique<net::HttpServer>(
      std::move(ho), [raw](const HttpRequest& req, BodyReader& body, HttpResponse* resp) {
        raw->Handle(req, body, resp);
      });
  XSILO_RETURN_IF_ERROR(impl->http->Start());
  return std::unique_ptr<S3Server>(new S3Server(std::move(impl)));
}

S3Server::S3Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
S3Server::~S3Server() { Stop(); }
int S3Server::port() const { return impl_->http->port(); }
std::string S3Server::endpoint() const {
  std::string host = impl_->opts.host == "0.0.0.0" ? "127.0.0.1" : impl_->opts.host;
  const char* scheme = impl_->opts.tls_cert_file.empty() ? "http://" : "https://";
  return scheme + host + ":" + std::to_string(port());
}
void S3Server::Stop() {
  impl_->http->Stop();
  impl_->StopTrimmer();
}

Status GenerateSelfSignedCertificate(const std::string& cert_file, const std::string& key_file,
                                     const std::vector<std::string>& hosts, int days) {
  return net::GenerateSelfSignedCertificate(cert_file, key_file, hosts, days);
}

Status PutObjectInDirectory(const std::string& directory, const std::string& bucket,
                            const std::string& key, const GatherList& body, bool md5_etag) {
  if (directory.empty()) return InvalidArgument("PutObjectInDirectory: empty directory");
  if (key.empty() || key.size() > 1024) return InvalidArgument("invalid object key");
  XSILO_ASSIGN_OR_RETURN(auto store, s3::NewDirectoryObjectStore(directory));
  StoredObject obj;  // the ETag is computed while the bytes are written
  obj.etag_hash = md5_etag ? s3::EtagHash::kMd5 : s3::EtagHash::kXxh3;
  obj.size = body.size;
  for (const Buffer& b : body.segments) {
    if (!b.empty()) obj.segments.push_back(b);
  }
  obj.mtime = std::time(nullptr);
  return store->Put(bucket, key, std::move(obj));
}

Result<Buffer> GetObjectFromDirectory(const std::string& directory, const std::string& bucket,
                                      const std::string& key) {
  if (directory.empty()) return InvalidArgument("GetObjectFromDirectory: empty directory");
  if (key.empty() || key.size() > 1024) return InvalidArgument("invalid object key");
  XSILO_ASSIGN_OR_RETURN(auto store, s3::NewDirectoryObjectStore(directory));
  XSILO_ASSIGN_OR_RETURN(StoredObject obj, store->Get(bucket, key));
  if (obj.segments.empty()) return Buffer();
  return obj.segments.front();  // the directory store maps the whole file
}

}  // namespace xsilo
