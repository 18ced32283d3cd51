// Connector: the data plane's storage interface, after ProxyStore.
//
// put(bytes) -> Key, get(Key) -> bytes | none, exists, evict, batch forms,
// and deferred keys (new_key, then set). A Key is a small structured record
// that embeds in Messages; together with the connector's config() it lets a
// process that never saw this connector fetch the object.
//
// Thread safety: every Connector method may be called from many threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "xsilo/core/buffer.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/status.h"

namespace xsilo {

class OptionTable;  // xsilo/core/option_table.h

struct Key {
  std::string connector;  // connector type that made it: "memory", "file", "redis", "s3", ...
  std::string id;         // object name inside that connector
  uint64_t size = 0;      // object size in bytes when known
  // Connector-specific attributes (e.g. redis part count, s3 bucket).
  std::map<std::string, std::string> attrs;

  // Compact JSON, for embedding in Message params.
  std::string ToJson() const;
  static Result<Key> FromJson(std::string_view json);
  friend bool operator==(const Key& a, const Key& b) {
    return a.connector == b.connector && a.id == b.id && a.size == b.size && a.attrs == b.attrs;
  }
};

// What another process needs to rebuild an equivalent connector.
struct ConnectorConfig {
  std::string type;                            // "memory", "file", "redis", "s3", ...
  std::map<std::string, std::string> options;  // type-specific, documented per connector

  std::string ToJson() const;
  static Result<ConnectorConfig> FromJson(std::string_view json);
};

// Capability of connectors whose objects can be reached by URL, so that a
// party with no storage credentials can read or write one object until the
// URL expires (S3 presigned URLs). Connector::presigned() hands it out.
class PresignedAccess {
 public:
  virtual ~PresignedAccess() = default;
  virtual Result<std::string> PresignGet(const Key& key, std::chrono::seconds expiry) = 0;
  virtual Result<std::string> PresignPut(const Key& key, std::chrono::seconds expiry) = 0;
};

// Capability of connectors with presigned multipart uploads
// (Connector::presigned_multipart()): a multipart upload of `key` that a
// party without credentials fills in parallel, a presigned PUT URL per part
// (1..parts) and a presigned POST that completes it. Abort one that was
// never completed, or its parts stay stored.
class PresignedMultipartAccess {
 public:
  struct MultipartGrant {
    std::string upload_id;
    std::vector<std::string> part_urls;
    std::string complete_url;
  };
  virtual ~PresignedMultipartAccess() = default;
  virtual Result<MultipartGrant> PresignMultipartPut(const Key& key, int parts,
                                                     std::chrono::seconds expiry) = 0;
  virtual Status AbortMultipartPut(const Key& key, const std::string& upload_id) = 0;
};

class Connector {
 public:
  virtual ~Connector() = default;

  virtual std::string_view type() const = 0;
  virtual ConnectorConfig config() const = 0;

  // Stores the bytes (a gather list is written without flattening) under a
  // fresh key.
  virtual Result<Key> Put(const GatherList& bytes) = 0;
  Result<Key> Put(const Buffer& bytes);
  // nullopt when the key does not exist (or was evicted).
  virtual Result<std::optional<Buffer>> Get(const Key& key) = 0;
  virtual Result<bool> Exists(const Key& key) = 0;
  // Idempotent: evicting a missing key is OK.
  virtual Status Evict(const Key& key) = 0;

  // Deferred keys: reserve a key now, fill it later (possibly from another
  // process holding the same config); Get returns nullopt until then.
  virtual Result<Key> NewKey() = 0;
  virtual Status Set(const Key& key, const GatherList& bytes) = 0;

  // Batch forms; the defaults loop, connectors override where the backend
  // has a faster path.
  virtual Result<std::vector<Key>> PutBatch(const std::vector<Buffer>& objects);
  virtual Result<std::vector<std::optional<Buffer>>> GetBatch(const std::vector<Key>& keys);
  virtual Status EvictBatch(const std::vector<Key>& keys);

  // Capabilities: the interface, or nullptr when the connector has none.
  // A decorator forwards them (ConnectorWrapper does), or it hides them.
  virtual PresignedAccess* presigned() { return nullptr; }
  virtual PresignedMultipartAccess* presigned_multipart() { return nullptr; }

  virtual void Close() {}
};

// Builds a connector from a config (the inverse of config()). NotFound for
// an unknown type; the connector's own error when it cannot be used here.
Result<std::unique_ptr<Connector>> MakeConnector(const ConnectorConfig& config);
// Registered connector types.
std::vector<std::string> ConnectorTypes();
// Every built-in connector type's option keys, one table per type (the ucx
// one even when this build has no UCX): `xsilo backends --keys` prints them.
std::vector<const OptionTable*> ConnectorOptionTables();

// A random 128-bit id as 32 hex characters, from the kernel's CSPRNG
// (getrandom): unpredictable from other ids, so also usable as a secret.
std::string RandomObjectId();

}  // namespace xsilo
