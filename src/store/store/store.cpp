#include "xsilo/store/store.h"

#include <nlohmann/json.hpp>

#include "store/future/notifier.h"
#include "store/store/lru_cache.h"

namespace xsilo {

using nlohmann::json;

namespace {

json StoreConfigJson(const StoreConfig& c) {
  return json{{"name", c.name},
              {"connector", json::parse(c.connector.ToJson())},
              {"cache_bytes", c.options.cache_bytes},
              {"metrics", c.options.metrics}};
}

Result<StoreConfig> StoreConfigFrom(const json& j) {
  if (!j.is_object()) return InvalidArgument("store config is not a JSON object");
  auto name = j.find("name");
  auto connector = j.find("connector");
  if (name == j.end() || !name->is_string() || connector == j.end() || !connector->is_object()) {
    return InvalidArgument("store config needs a string 'name' and an object 'connector'");
  }
  StoreConfig c;
  c.name = name->get<std::string>();
  XSILO_ASSIGN_OR_RETURN(c.connector, ConnectorConfig::FromJson(connector->dump()));
  if (auto it = j.find("cache_bytes"); it != j.end()) {
    if (!it->is_number_unsigned()) return InvalidArgument("store cache_bytes is not unsigned");
    c.options.cache_bytes = it->get<uint64_t>();
  }
  if (auto it = j.find("metrics"); it != j.end()) {
    if (!it->is_boolean()) return InvalidArgument("store metrics is not a boolean");
    c.options.metrics = it->get<bool>();
  }
  return c;
}

}  // namespace

std::string StoreConfig::ToJson() const { return StoreConfigJson(*this).dump(); }

Result<StoreConfig> StoreConfig::FromJson(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return InvalidArgument("store config is not JSON");
  return StoreConfigFrom(j);
}

std::string ProxyReference::ToJson() const {
  json j = {{"store", StoreConfigJson(store)}, {"key", json::parse(key.ToJson())}};
  if (options.evict_on_resolve) j["evict_on_resolve"] = true;
  if (options.resolve_timeout.count() > 0)
    j["resolve_timeout_ms"] = options.resolve_timeout.count();
  return j.dump();
}

Result<ProxyReference> ProxyReference::FromJson(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("proxy reference is not a JSON object");
  auto store = j.find("store");
  auto key = j.find("key");
  if (store == j.end() || key == j.end()) {
    return InvalidArgument("proxy reference needs 'store' and 'key'");
  }
  ProxyReference r;
  XSILO_ASSIGN_OR_RETURN(r.store, StoreConfigFrom(*store));
  XSILO_ASSIGN_OR_RETURN(r.key, Key::FromJson(key->dump()));
  if (auto it = j.find("evict_on_resolve"); it != j.end()) {
    if (!it->is_boolean()) return InvalidArgument("proxy evict_on_resolve is not a boolean");
    r.options.evict_on_resolve = it->get<bool>();
  }
  if (auto it = j.find("resolve_timeout_ms"); it != j.end()) {
    if (!it->is_number_unsigned())
      return InvalidArgument("proxy resolve_timeout_ms is not unsigned");
    r.options.resolve_timeout = std::chrono::milliseconds(it->get<uint64_t>());
  }
  return r;
}

Store::Store(std::string name, std::unique_ptr<Connector> connector, StoreOptions options)
    : name_(std::move(name)),
      connector_(std::move(connector)),
      options_(options),
      connector_config_(connector_->config()),
      cache_(std::make_unique<LruCache>(options.cache_bytes)),
      notifier_(MakeKeyNotifier(connector_config_)) {}

Store::~Store() { Close(); }

Result<std::shared_ptr<Store>> Store::Create(std::string name, std::unique_ptr<Connector> connector,
                                             StoreOptions options) {
  if (name.empty()) return InvalidArgument("a store needs a name");
  if (!connector) return InvalidArgument("store '" + name + "' needs a connector");
  return std::shared_ptr<Store>(new Store(std::move(name), std::move(connector), options));
}

Result<std::shared_ptr<Store>> Store::FromConfig(const StoreConfig& config) {
  auto connector = MakeConnector(config.connector);
  if (!connector.ok()) {
    return connector.status().WithContext("store '" + config.name + "'");
  }
  return Create(config.name, std::move(connector).value(), config.options);
}

StoreConfig Store::config() const { return {name_, connector_config_, options_}; }

Status Store::CheckOpen() const {
  if (closed()) return FailedPrecondition("store '" + name_ + "' is closed");
  return Status::OK();
}

std::string Store::CacheKey(const Key& key) const { return key.ToJson(); }

void Store::Record(OpMetrics StoreMetrics::*op, std::chrono::steady_clock::time_point start,
                   uint64_t bytes) {
  if (!options_.metrics) return;
  uint64_t ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
  std::lock_guard<std::mutex> lock(metrics_mu_);
  OpMetrics& m = metrics_.*op;
  ++m.count;
  m.total_ns += ns;
  m.max_ns = std::max(m.max_ns, ns);
  m.total_bytes += bytes;
  m.max_bytes = std::max(m.max_bytes, bytes);
}

Result<Key> Store::PutBytes(const GatherList& bytes, const PlacementHints& hints) {
  XSILO_RETURN_IF_ERROR(CheckOpen());
  auto start = std::chrono::steady_clock::now();
  Result<Key> key = InvalidArgument("unreachable");
  if (hints.empty()) {
    key = connector_->Put(bytes);
  } else {
    auto* placed = dynamic_cast<PlacementAwareConnector*>(connector_.get());
    if (!placed) {
      return InvalidArgument("store '" + name_ + "': connector '" +
                             std::string(connector_->type()) + "' does not route puts by tags");
    }
    key = placed->PutPlaced(bytes, hints);
  }
  if (key.ok()) Record(&StoreMetrics::put, start, bytes.size);
  return key;
}

Result<std::vector<Key>> Store::PutBytesBatch(const std::vector<GatherList>& objects) {
  auto start = std::chrono::steady_clock::now();
  bool contiguous = true;
  std::vector<Buffer> buffers;
  uint64_t total = 0;
  for (const GatherList& g : objects) {
    total += g.size;
    if (g.segments.size() > 1) contiguous = false;
    buffers.push_back(g.segments.empty() ? Buffer() : g.segments[0]);
  }
  if (contiguous) {
    XSILO_ASSIGN_OR_RETURN(std::vector<Key> keys, connector_->PutBatch(buffers));
    Record(&StoreMetrics::put, start, total);
    return keys;
  }
  std::vector<Key> keys;
  for (const GatherList& g : objects) {
    auto key = PutBytes(g);
    if (!key.ok()) {
      (void)EvictBatch(keys);  // all or nothing
      return key.status();
    }
    keys.push_back(std::move(key).value());
  }
  return keys;
}

Result<std::optional<Buffer>> Store::GetBytes(const Key& key) {
  XSILO_RETURN_IF_ERROR(CheckOpen());
  std::string ck = CacheKey(key);
  if (auto hit = cache_->Get(ck)) {
    if (options_.metrics) {
      std::lock_guard<std::mutex> lock(metrics_mu_);
      ++metrics_.cache_hits;
    }
    return std::optional<Buffer>(std::move(*hit));
  }
  if (options_.metrics) {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    ++metrics_.cache_misses;
  }
  auto start = std::chrono::steady_clock::now();
  XSILO_ASSIGN_OR_RETURN(std::optional<Buffer> bytes, connector_->Get(key));
  Record(&StoreMetrics::get, start, bytes ? bytes->size() : 0);
  if (bytes) cache_->Put(ck, *bytes);
  return bytes;
}

Result<std::vector<std::optional<Buffer>>> Store::GetBytesBatch(const std::vector<Key>& keys) {
  XSILO_RETURN_IF_ERROR(CheckOpen());
  std::vector<std::optional<Buffer>> out(keys.size());
  std::vector<Key> missing;
  std::vector<size_t> where;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (auto hit = cache_->Get(CacheKey(keys[i]))) {
      out[i] = std::move(*hit);
    } else {
      missing.push_back(keys[i]);
      where.push_back(i);
    }
  }
  if (options_.metrics) {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    metrics_.cache_hits += keys.size() - missing.size();
    metrics_.cache_misses += missing.size();
  }
  if (missing.empty()) return out;
  auto start = std::chrono::steady_clock::now();
  XSILO_ASSIGN_OR_RETURN(auto fetched, connector_->GetBatch(missing));
  uint64_t total = 0;
  for (size_t j = 0; j < fetched.size() && j < where.size(); ++j) {
    if (fetched[j]) {
      total += fetched[j]->size();
      cache_->Put(CacheKey(missing[j]), *fetched[j]);
    }
    out[where[j]] = std::move(fetched[j]);
  }
  Record(&StoreMetrics::get, start, total);
  return out;
}

Status Store::SetBytes(const Key& key, const GatherList& bytes) {
  XSILO_RETURN_IF_ERROR(CheckOpen());
  auto start = std::chrono::steady_clock::now();
  cache_->Erase(CacheKey(key));
  XSILO_RETURN_IF_ERROR(connector_->Set(key, bytes));
  Record(&StoreMetrics::put, start, bytes.size);
  // Waiters re-check periodically, so a lost notification only delays them.
  if (notifier_) (void)notifier_->Notify(key);
  return Status::OK();
}

Result<bool> Store::Exists(const Key& key) {
  XSILO_RETURN_IF_ERROR(CheckOpen());
  auto start = std::chrono::steady_clock::now();
  // Asks the connector, not the cache: another party may have evicted it.
  XSILO_ASSIGN_OR_RETURN(bool exists, connector_->Exists(key));
  Record(&StoreMetrics::exists, start, 0);
  return exists;
}

Status Store::Evict(const Key& key) {
  XSILO_RETURN_IF_ERROR(CheckOpen());
  auto start = std::chrono::steady_clock::now();
  cache_->Erase(CacheKey(key));
  XSILO_RETURN_IF_ERROR(connector_->Evict(key));
  if (notifier_) (void)notifier_->Forget(key);
  Record(&StoreMetrics::evict, start, key.size);
  return Status::OK();
}

Status Store::EvictBatch(const std::vector<Key>& keys) {
  XSILO_RETURN_IF_ERROR(CheckOpen());
  auto start = std::chrono::steady_clock::now();
  uint64_t total = 0;
  for (const Key& k : keys) {
    cache_->Erase(CacheKey(k));
    total += k.size;
  }
  XSILO_RETURN_IF_ERROR(connector_->EvictBatch(keys));
  Record(&StoreMetrics::evict, start, total);
  return Status::OK();
}

Result<Key> Store::NewKey() {
  XSILO_RETURN_IF_ERROR(CheckOpen());
  return connector_->NewKey();
}

StoreMetrics Store::metrics() const {
  StoreMetrics m;
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    m = metrics_;
  }
  m.cache_bytes = cache_->bytes();
  m.cache_entries = cache_->entries();
  return m;
}

void Store::ResetMetrics() {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  metrics_ = StoreMetrics();
}

void Store::Close() {
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  cache_->Clear();
  connector_->Close();
}

// ---- registry ---------------------------------------------------------------

StoreRegistry& StoreRegistry::Global() {
  static StoreRegistry* registry = new StoreRegistry();  // never destroyed: used at exit
  return *registry;
}

Status StoreRegistry::Register(std::shared_ptr<Store> store) {
  if (!store) return InvalidArgument("cannot register a null store");
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = stores_[store->name()];
  if (slot && slot != store && !slot->closed()) {
    return AlreadyExists("a store named '" + store->name() + "' is already registered");
  }
  slot = std::move(store);
  return Status::OK();
}

std::shared_ptr<Store> StoreRegistry::Find(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stores_.find(name);
  if (it == stores_.end() || it->second->closed()) return nullptr;
  return it->second;
}

Result<std::shared_ptr<Store>> StoreRegistry::GetOrCreate(const StoreConfig& config) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stores_.find(config.name);
  if (it != stores_.end() && !it->second->closed()) return it->second;
  XSILO_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, Store::FromConfig(config));
  stores_[config.name] = store;
  return store;
}

void StoreRegistry::Unregister(std::string_view name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = stores_.find(name); it != stores_.end()) stores_.erase(it);
}

std::vector<std::string> StoreRegistry::Names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, store] : stores_) {
    if (!store->closed()) names.push_back(name);
  }
  return names;
}

}  // namespace xsilo
