// s3: objects in an S3-compatible service (AWS S3, MinIO, Ceph RGW, the
// embedded `xsilo s3d`), through xsilo's S3 client: multipart uploads with
// parts in parallel, downloads by parallel ranged GETs into one Buffer.
//
// Options:
//   bucket       required
//   endpoint     default "" (AWS: https://s3.<region>.amazonaws.com)
//   region       default us-east-1
//   access_key, secret_key   default: the AWS_* environment / shared file chain.
//   secret_key_file  a file holding the secret (read when the connector is
//                made; its path, not its content, is part of config()).
//                config() carries access_key but never the secret, so a
//                serialized reference holds no secret. A connector made
//                from a config with access_key and no secret finds it in
//                secret_key_file, else among the connectors this process
//                made for the same endpoint, bucket, prefix and key, else in the chain
//                (when the chain's key id is access_key); else it fails.
//   prefix       default "xsilo/" (object names are <prefix><id>)
//   connections  default 8: parallel ranges per download
//   part_bytes   default 67108864 (64 MiB): multipart part size
//   concurrency  default 8: parts uploaded at once
//   addressing   auto | path | virtual (default auto)
//   create_bucket 0|1 (default 1): create the bucket if it is missing
//   local_dir    default "": the storage directory of an S3 server on this
//                machine (`xsilo s3d --dir`, the embedded server): Put writes
//                there and Get maps from there directly, skipping HTTP.
//                Machine-local, so it is not part of config().
//   ca_file      default "": PEM roots that verify an https endpoint (the
//                system's when empty); part of config()
//   local_etags  md5 | xxh3 (default md5): the ETags of local_dir writes, as
//                the server's S3ServerOptions::md5_etags.
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "store/builtin.h"
#include "xsilo/core/secret.h"
#include "xsilo/s3/client.h"
#include "xsilo/s3/server.h"

namespace xsilo {

namespace {

struct S3ConnectorOptions {
  std::string bucket, endpoint, region = "us-east-1", access_key, secret_key, secret_key_file;
  std::string prefix = "xsilo/", addressing = "auto";
  // The storage directory of an S3 server on this machine (its
  // S3ServerOptions::directory): Put writes objects there directly instead
  // of uploading them. Everything else still goes through the endpoint.
  std::string local_dir;
  std::string local_etags = "md5";  // or "xxh3", as that server's md5_etags
  std::string ca_file;
  int connections = 8, concurrency = 8;
  uint64_t part_bytes = 64ull << 20;
  bool create_bucket = true;
};

class S3Connector final : public Connector,
                          public PresignedAccess,
                          public PresignedMultipartAccess {
 public:
  S3Connector(S3ConnectorOptions o, std::unique_ptr<S3Client> client)
      : o_(std::move(o)), client_(std::move(client)) {}

  std::string_view type() const override { return "s3"; }

  ConnectorConfig config() const override {
    ConnectorOptions m = {{"bucket", o_.bucket},
                          {"region", o_.region},
                          {"prefix", o_.prefix},
                          {"addressing", o_.addressing},
                          {"connections", std::to_string(o_.connections)},
                          {"concurrency", std::to_string(o_.concurrency)},
                          {"part_bytes", std::to_string(o_.part_bytes)},
                          {"create_bucket", o_.create_bucket ? "1" : "0"}};
    if (!o_.endpoint.empty()) m["endpoint"] = o_.endpoint;
    if (!o_.ca_file.empty()) m["ca_file"] = o_.ca_file;
    if (!o_.access_key.empty()) m["access_key"] = o_.access_key;  // an id: the secret stays here
    if (!o_.secret_key_file.empty()) m["secret_key_file"] = o_.secret_key_file;
    return {"s3", m};
  }

  Result<Key> Put(const GatherList& bytes) override {
    Key key{"s3", RandomObjectId(), bytes.size, {}};
    XSILO_RETURN_IF_ERROR(Upload(key.id, bytes));
    return key;
  }

  // A key from Put records its object's size: an object of another size
  // under it is not the one put. Asked again a few times (a server may
  // acknowledge a PUT before its bytes are readable: s3rver 3.7.1 answers
  // once the body passed its hash, before its file is written, and a GET
  // right after read 0 of 1,075 bytes under load), then refused as Corrupt
  // rather than returned.
  Result<std::optional<Buffer>> Get(const Key& key) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    for (int attempt = 0;; ++attempt) {
      XSILO_ASSIGN_OR_RETURN(std::optional<Buffer> got, GetOnce(key));
      if (!got || key.size == 0 || got->size() == key.size) return got;
      if (attempt == kSizeRetries) {
        return Corrupt("s3 object " + o_.bucket + "/" + o_.prefix + key.id + " holds " +
                       std::to_string(got->size()) + " bytes, its key says " +
                       std::to_string(key.size) + " (asked " + std::to_string(attempt + 1) +
                       " times)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20) * (1 << attempt));
    }
  }

  Result<bool> Exists(const Key& key) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    auto r = client_->HeadObject({o_.bucket, o_.prefix + key.id});
    if (r.ok()) return true;
    if (r.status().code() == StatusCode::kNotFound) return false;
    return r.status();
  }

  Status Evict(const Key& key) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    return client_->DeleteObject({o_.bucket, o_.prefix + key.id});
  }

  Result<Key> NewKey() override { return Key{"s3", RandomObjectId(), 0, {}}; }

  Status Set(const Key& key, const GatherList& bytes) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    return Upload(key.id, bytes);
  }

  PresignedAccess* presigned() override { return this; }
  PresignedMultipartAccess* presigned_multipart() override { return this; }

  Result<std::string> PresignGet(const Key& key, std::chrono::seconds expiry) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    return client_->PresignUrl(
        {.method = "GET", .bucket = o_.bucket, .key = o_.prefix + key.id, .expires = expiry});
  }

  Result<std::string> PresignPut(const Key& key, std::chrono::seconds expiry) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    return client_->PresignUrl(
        {.method = "PUT", .bucket = o_.bucket, .key = o_.prefix + key.id, .expires = expiry});
  }

  Result<MultipartGrant> PresignMultipartPut(const Key& key, int parts,
                                             std::chrono::seconds expiry) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    if (parts < 1 || parts > 10000) return InvalidArgument("parts must be in [1, 10000]");
    const std::string object = o_.prefix + key.id;
    MultipartGrant g;
    XSILO_ASSIGN_OR_RETURN(g.upload_id, client_->CreateMultipartUpload({o_.bucket, object}));
    for (int i = 1; i <= parts; ++i) {
      auto url = client_->PresignUrl(
          {.method = "PUT",
           .bucket = o_.bucket,
           .key = object,
           .query = {{"partNumber", std::to_string(i)}, {"uploadId", g.upload_id}},
           .expires = expiry});
      if (!url.ok()) {
        (void)AbortMultipartPut(key, g.upload_id);
        return url.status();
      }
      g.part_urls.push_back(std::move(url).value());
    }
    auto done = client_->PresignUrl({.method = "POST",
                                     .bucket = o_.bucket,
                                     .key = object,
                                     .query = {{"uploadId", g.upload_id}},
                                     .expires = expiry});
    if (!done.ok()) {
      (void)AbortMultipartPut(key, g.upload_id);
      return done.status();
    }
    g.complete_url = std::move(done).value();
    return g;
  }

  Status AbortMultipartPut(const Key& key, const std::string& upload_id) override {
    XSILO_RETURN_IF_ERROR(CheckKey(key));
    return client_->AbortMultipartUpload({o_.bucket, o_.prefix + key.id}, upload_id);
  }

 private:
  Status CheckKey(const Key& key) const {
    if (key.connector != "s3") {
      return InvalidArgument("key of connector '" + key.connector + "' given to an s3 connector");
    }
    if (key.id.empty() || key.id.find('/') != std::string::npos) {
      return InvalidArgument("invalid object id '" + key.id + "'");
    }
    return Status::OK();
  }

  static constexpr int kSizeRetries = 4;  // 20, 40, 80, 160 ms

  Result<std::optional<Buffer>> GetOnce(const Key& key) {
    if (!o_.local_dir.empty()) {
      auto r = GetObjectFromDirectory(o_.local_dir, o_.bucket, o_.prefix + key.id);
      if (!r.ok()) {
        if (r.status().code() == StatusCode::kNotFound) return std::optional<Buffer>();
        return r.status();
      }
      return std::optional<Buffer>(std::move(r).value());
    }
    DownloadObjectArgs args;
    args.bucket = o_.bucket;
    args.key = o_.prefix + key.id;
    args.connections = o_.connections;
    auto r = client_->DownloadObject(args);
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kNotFound) return std::optional<Buffer>();
      return r.status();
    }
    return std::optional<Buffer>(std::move(r->data));
  }

  Status Upload(const std::string& id, const GatherList& bytes) {
    if (!o_.local_dir.empty()) {
      return PutObjectInDirectory(o_.local_dir, o_.bucket, o_.prefix + id, bytes,
                                  o_.local_etags != "xxh3");
    }
    UploadObjectArgs args;
    args.bucket = o_.bucket;
    args.key = o_.prefix + id;
    args.body = bytes;
    args.part_size = o_.part_bytes;
    args.concurrency = o_.concurrency;
    return client_->UploadObject(args).status();
  }

  const S3ConnectorOptions o_;
  const std::unique_ptr<S3Client> client_;
};

// The secrets of the connectors this process made, by endpoint, bucket,
// prefix and access key: a config from this process's own config() (which
// has no secret) makes a working connector again here, and a reference
// naming another bucket or prefix with the same key gets no secret from it.
std::mutex secrets_mu;
using SecretScope = std::tuple<std::string, std::string, std::string, std::string>;
std::map<SecretScope, std::string>& KnownSecrets() {
  static auto* known = new std::map<SecretScope, std::string>;
  return *known;
}
SecretScope ScopeOf(const S3ConnectorOptions& o) {
  return {o.endpoint, o.bucket, o.prefix, o.access_key};
}

// The string options as given (defaults where absent); the numeric ones
// are parsed by MakeS3Connector.
S3ConnectorOptions StringOptions(const ConnectorOptions& options) {
  S3ConnectorOptions o;
  auto get = [&](const char* k, std::string* out) {
    if (auto it = options.find(k); it != options.end()) *out = it->second;
  };
  get("bucket", &o.bucket);
  get("endpoint", &o.endpoint);
  get("region", &o.region);
  get("access_key", &o.access_key);
  get("secret_key", &o.secret_key);
  get("secret_key_file", &o.secret_key_file);
  get("prefix", &o.prefix);
  get("addressing", &o.addressing);
  get("local_dir", &o.local_dir);
  get("local_etags", &o.local_etags);
  get("ca_file", &o.ca_file);
  return o;
}

// The secret of `o.access_key` when the options carry none (see the top).
Result<std::string> ResolveSecret(const S3ConnectorOptions& o) {
  if (!o.secret_key_file.empty()) {
    auto secret = ReadSecretFile(o.secret_key_file);
    if (!secret.ok()) return secret.status().WithContext("s3 connector secret_key_file");
    return secret;
  }
  {
    std::lock_guard<std::mutex> lock(secrets_mu);
    auto it = KnownSecrets().find(ScopeOf(o));
    if (it != KnownSecrets().end()) return it->second;
  }
  auto chain = DefaultCredentialsChain()->Get();
  if (chain.ok() && chain->access_key_id == o.access_key) return chain->secret_access_key;
  return InvalidArgument("s3 connector: no secret for access key " + o.access_key +
                         " here: give secret_key or secret_key_file, or set "
                         "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or ~/.aws/credentials) to "
                         "that key (references carry no secret)");
}

}  // namespace

Result<std::string> S3ConnectorSecret(const ConnectorOptions& options) {
  S3ConnectorOptions o = StringOptions(options);
  if (!o.secret_key.empty()) return o.secret_key;
  if (o.access_key.empty()) return InvalidArgument("s3 connector: no access_key, so no secret");
  return ResolveSecret(o);
}

Result<std::unique_ptr<Connector>> MakeS3Connector(const ConnectorOptions& options) {
  const OptionTable& t = S3ConnectorOptionTable();
  XSILO_RETURN_IF_ERROR(t.CheckKeys(options));
  S3ConnectorOptions o = StringOptions(options);
  if (o.local_etags != "md5" && o.local_etags != "xxh3") {
    return InvalidArgument("s3 connector: local_etags must be md5 or xxh3, not " + o.local_etags);
  }
  if (o.bucket.empty()) return InvalidArgument("s3 connector needs option 'bucket'");
  if (!o.secret_key.empty() && !o.secret_key_file.empty()) {
    return InvalidArgument("s3 connector: give secret_key or secret_key_file, not both");
  }
  if (o.access_key.empty() && (!o.secret_key.empty() || !o.secret_key_file.empty())) {
    return InvalidArgument("s3 connector: a secret needs its access_key");
  }
  if (!o.access_key.empty() && o.secret_key.empty()) {
    XSILO_ASSIGN_OR_RETURN(o.secret_key, ResolveSecret(o));
  }
  XSILO_ASSIGN_OR_RETURN(int64_t connections, t.Int(options, "connections"));
  XSILO_ASSIGN_OR_RETURN(int64_t concurrency, t.Int(options, "concurrency"));
  XSILO_ASSIGN_OR_RETURN(int64_t part, t.Int(options, "part_bytes"));
  XSILO_ASSIGN_OR_RETURN(o.create_bucket, t.Flag(options, "create_bucket"));
  o.connections = static_cast<int>(connections);
  o.concurrency = static_cast<int>(concurrency);
  o.part_bytes = static_cast<uint64_t>(part);

  S3ClientOptions co;
  co.endpoint = o.endpoint;
  co.region = o.region;
  co.ca_file = o.ca_file;
  co.max_connections = std::max(o.connections, o.concurrency);
  if (o.addressing == "path")
    co.addressing = S3Addressing::kPath;
  else if (o.addressing == "virtual")
    co.addressing = S3Addressing::kVirtualHost;
  else if (o.addressing != "auto")
    return InvalidArgument("s3 option addressing must be auto, path or virtual");
  if (!o.access_key.empty()) co.credentials = StaticCredentials({o.access_key, o.secret_key});
  XSILO_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client, S3Client::Create(co));
  if (o.create_bucket) {
    Status head = client->HeadBucket({o.bucket});
    if (head.code() == StatusCode::kNotFound) {
      Status made = client->CreateBucket({o.bucket});
      if (!made.ok() && made.code() != StatusCode::kAlreadyExists) return made;
    } else if (!head.ok()) {
      return head.WithContext("s3 bucket " + o.bucket);
    }
  }
  if (!o.access_key.empty()) {
    std::lock_guard<std::mutex> lock(secrets_mu);
    KnownSecrets()[ScopeOf(o)] = o.secret_key;
  }
  return std::unique_ptr<Connector>(std::make_unique<S3Connector>(std::move(o), std::move(client)));
}

}  // namespace xsilo
