// Store: a named connector plus a codec, a byte-bounded LRU cache and
// metrics, after ProxyStore's Store. StoreRegistry: the process's stores by
// name, so a proxy arriving from another process finds (or creates, once)
// the store it names.
//
// Thread safety: every Store and StoreRegistry method may be called from
// many threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "xsilo/store/connector.h"
#include "xsilo/store/object_codec.h"

namespace xsilo {

template <typename T>
class Proxy;
template <typename T>
class OwnedProxy;
class Lifetime;

struct StoreOptions {
  // Bytes of fetched objects kept in memory, least recently used evicted
  // first; an object larger than this is never cached. 0 disables the
  // cache. Default 256 MiB.
  uint64_t cache_bytes = 256ull << 20;
  // Record timings and sizes (metrics()). Default true.
  bool metrics = true;
};

// Everything another process needs to rebuild an equivalent Store.
struct StoreConfig {
  std::string name;
  ConnectorConfig connector;
  StoreOptions options;

  std::string ToJson() const;
  static Result<StoreConfig> FromJson(std::string_view json);
};

// Where a put may go, for connectors that route by policy (the "multi"
// connector): the put's subset_tags must be a subset of a policy's
// subset_tags, and its superset_tags a superset of the policy's. Ignored
// when empty.
struct PlacementHints {
  std::set<std::string> subset_tags;
  std::set<std::string> superset_tags;
  bool empty() const { return subset_tags.empty() && superset_tags.empty(); }
};

// Capability of connectors that route puts by PlacementHints.
class PlacementAwareConnector {
 public:
  virtual ~PlacementAwareConnector() = default;
  virtual Result<Key> PutPlaced(const GatherList& bytes, const PlacementHints& hints) = 0;
};

struct ProxyOptions {
  // Evict the object from the store after the first successful resolve
  // (one consumer, and the bytes are freed at once). Default false.
  bool evict_on_resolve = false;
  // How long a resolve waits for a deferred key that is not set yet
  // (notification where the connector allows it, polling otherwise);
  // 0 means a missing object is NotFound at once. Default 0.
  std::chrono::milliseconds resolve_timeout{0};
  // MakeProxy only: the creating proxy starts out resolved with a copy of
  // the object (never serialized). Default false.
  bool populate_target = false;
};

// What a serialized proxy carries: small, no object bytes.
struct ProxyReference {
  StoreConfig store;
  Key key;
  ProxyOptions options;

  std::string ToJson() const;
  static Result<ProxyReference> FromJson(std::string_view json);
};

// Times are in nanoseconds, sizes in bytes, everywhere.
struct OpMetrics {
  uint64_t count = 0;
  uint64_t total_ns = 0;
  uint64_t max_ns = 0;
  uint64_t total_bytes = 0;  // object bytes moved by these operations
  uint64_t max_bytes = 0;    // largest single object
  double mean_ns() const { return count ? static_cast<double>(total_ns) / count : 0.0; }
};

struct StoreMetrics {
  OpMetrics put;  // connector put of encoded bytes
  OpMetrics get;  // connector get (cache misses only)
  OpMetrics exists;
  OpMetrics evict;
  OpMetrics encode;   // Codec<T>::Encode
  OpMetrics decode;   // Codec<T>::Decode
  OpMetrics resolve;  // a proxy's whole resolve: wait + get + decode (+ evict)
  uint64_t cache_hits = 0;
  uint64_t cache_misses = 0;
  uint64_t cache_bytes = 0;    // bytes cached now
  uint64_t cache_entries = 0;  // objects cached now
};

class LruCache;     // private, src/store/store/lru_cache.h
class KeyNotifier;  // private, src/store/future/notifier.h

class Store : public std::enable_shared_from_this<Store> {
 public:
  // InvalidArgument for an empty name or a null connector.
  static Result<std::shared_ptr<Store>> Create(std::string name,
                                               std::unique_ptr<Connector> connector,
                                               StoreOptions options = {});
  // Builds the connector with MakeConnector(config.connector).
  static Result<std::shared_ptr<Store>> FromConfig(const StoreConfig& config);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& name() const { return name_; }
  StoreConfig config() const;
  Connector& connector() { return *connector_; }

  // Objects, through Codec<T>.
  template <Encodable T>
  Result<Key> Put(const T& object, const PlacementHints& hints = {});
  // nullopt when the key does not exist (or was evicted).
  template <Encodable T>
  Result<std::optional<T>> Get(const Key& key);
  // All or nothing: on failure the keys already written are evicted.
  template <Encodable T>
  Result<std::vector<Key>> PutBatch(const std::vector<T>& objects);
  template <Encodable T>
  Result<std::vector<std::optional<T>>> GetBatch(const std::vector<Key>& keys);
  template <Encodable T>
  Status Set(const Key& key, const T& object);

  Result<bool> Exists(const Key& key);
  // Removes the object from the cache and the connector. Idempotent.
  Status Evict(const Key& key);
  Status EvictBatch(const std::vector<Key>& keys);
  // A deferred key, filled later with Set (see future.h).
  Result<Key> NewKey();

  // Encoded bytes (the cache holds these).
  Result<Key> PutBytes(const GatherList& bytes, const PlacementHints& hints = {});
  Result<std::optional<Buffer>> GetBytes(const Key& key);
  Result<std::vector<std::optional<Buffer>>> GetBytesBatch(const std::vector<Key>& keys);
  Status SetBytes(const Key& key, const GatherList& bytes);

  // Waits until `key` exists: notification where the connector allows it
  // (redis), polling with exponential backoff otherwise. Timeout when the
  // deadline passes first.
  Status WaitForKey(const Key& key, std::chrono::milliseconds timeout);

  // Proxies (defined in proxy.h and lifetime.h).
  template <Encodable T>
  Result<Proxy<T>> MakeProxy(const T& object, ProxyOptions options = {},
                             Lifetime* lifetime = nullptr, const PlacementHints& hints = {});
  template <Encodable T>
  Proxy<T> ProxyFor(const Key& key, ProxyOptions options = {});
  template <Encodable T>
  Result<OwnedProxy<T>> MakeOwnedProxy(const T& object, ProxyOptions options = {});
  // What a proxy's resolve does: optional wait, get, decode, optional evict.
  template <Encodable T>
  Result<T> Resolve(const Key& key, const ProxyOptions& options);

  StoreMetrics metrics() const;
  void ResetMetrics();

  // Closes the connector and drops the cache; every later call is
  // FailedPrecondition. Idempotent.
  void Close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  Store(std::string name, std::unique_ptr<Connector> connector, StoreOptions options);
  Status CheckOpen() const;
  std::string CacheKey(const Key& key) const;
  void Record(OpMetrics StoreMetrics::*op, std::chrono::steady_clock::time_point start,
              uint64_t bytes);
  Result<std::vector<Key>> PutBytesBatch(const std::vector<GatherList>& objects);

  const std::string name_;
  const std::unique_ptr<Connector> connector_;
  const StoreOptions options_;
  const ConnectorConfig connector_config_;
  std::unique_ptr<LruCache> cache_;
  std::unique_ptr<KeyNotifier> notifier_;  // null: the connector cannot notify
  std::atomic<bool> closed_{false};
  mutable std::mutex metrics_mu_;
  StoreMetrics metrics_;
};

// The stores of a process by name. Global() is the one proxies use unless
// told otherwise; tests may make their own.
class StoreRegistry {
 public:
  static StoreRegistry& Global();

  // AlreadyExists when another open store holds the name.
  Status Register(std::shared_ptr<Store> store);
  // The open store of that name, or null.
  std::shared_ptr<Store> Find(std::string_view name) const;
  // The registered store of config.name, or a new one built from the
  // config and registered: a store is created once per process by name.
  Result<std::shared_ptr<Store>> GetOrCreate(const StoreConfig& config);
  // Forgets the name (does not close the store).
  void Unregister(std::string_view name);
  std::vector<std::string> Names() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Store>, std::less<>> stores_;
};

// ---- template definitions -------------------------------------------------

template <Encodable T>
Result<Key> Store::Put(const T& object, const PlacementHints& hints) {
  XSILO_RETURN_IF_ERROR(CheckOpen());
  auto start = std::chrono::steady_clock::now();
  XSILO_ASSIGN_OR_RETURN(GatherList bytes, Codec<T>::Encode(object));
  Record(&StoreMetrics::encode, start, bytes.size);
  return PutBytes(bytes, hints);
}

template <Encodable T>
Result<std::optional<T>> Store::Get(const Key& key) {
  XSILO_ASSIGN_OR_RETURN(std::optional<Buffer> bytes, GetBytes(key));
  if (!bytes) return std::optional<T>();
  auto start = std::chrono::steady_clock::now();
  XSILO_ASSIGN_OR_RETURN(T object, Codec<T>::Decode(*bytes));
  Record(&StoreMetrics::decode, start, bytes->size());
  return std::optional<T>(std::move(object));
}

template <Encodable T>
Result<std::vector<Key>> Store::PutBatch(const std::vector<T>& objects) {
  XSILO_RETURN_IF_ERROR(CheckOpen());
  std::vector<GatherList> encoded;
  encoded.reserve(objects.size());
  for (const T& object : objects) {
    auto start = std::chrono::steady_clock::now();
    XSILO_ASSIGN_OR_RETURN(GatherList bytes, Codec<T>::Encode(object));
    Record(&StoreMetrics::encode, start, bytes.size);
    encoded.push_back(std::move(bytes));
  }
  return PutBytesBatch(encoded);
}

template <Encodable T>
Result<std::vector<std::optional<T>>> Store::GetBatch(const std::vector<Key>& keys) {
  XSILO_ASSIGN_OR_RETURN(auto all, GetBytesBatch(keys));
  std::vector<std::optional<T>> out;
  out.reserve(all.size());
  for (auto& bytes : all) {
    if (!bytes) {
      out.emplace_back();
      continue;
    }
    auto start = std::chrono::steady_clock::now();
    XSILO_ASSIGN_OR_RETURN(T object, Codec<T>::Decode(*bytes));
    Record(&StoreMetrics::decode, start, bytes->size());
    out.emplace_back(std::move(object));
  }
  return out;
}

template <Encodable T>
Status Store::Set(const Key& key, const T& object) {
  XSILO_RETURN_IF_ERROR(CheckOpen());
  auto start = std::chrono::steady_clock::now();
  XSILO_ASSIGN_OR_RETURN(GatherList bytes, Codec<T>::Encode(object));
  Record(&StoreMetrics::encode, start, bytes.size);
  return SetBytes(key, bytes);
}

template <Encodable T>
Result<T> Store::Resolve(const Key& key, const ProxyOptions& options) {
  auto start = std::chrono::steady_clock::now();
  if (options.resolve_timeout.count() > 0) {
    XSILO_RETURN_IF_ERROR(WaitForKey(key, options.resolve_timeout));
  }
  XSILO_ASSIGN_OR_RETURN(std::optional<Buffer> bytes, GetBytes(key));
  if (!bytes) {
    return NotFound("object " + key.ToJson() + " is not in store '" + name_ +
                    "' (evicted, or a deferred key not set yet)");
  }
  auto decode_start = std::chrono::steady_clock::now();
  XSILO_ASSIGN_OR_RETURN(T object, Codec<T>::Decode(*bytes));
  Record(&StoreMetrics::decode, decode_start, bytes->size());
  if (options.evict_on_resolve) XSILO_RETURN_IF_ERROR(Evict(key));
  Record(&StoreMetrics::resolve, start, bytes->size());
  return object;
}

}  // namespace xsilo
