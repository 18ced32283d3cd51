// Proxy<T>: a lazy reference to an object, after ProxyStore's Proxy.
//
// A proxy is built from a factory (any callable returning Result<T>) and
// calls it once, the first time the target is needed: Resolve(), Get(),
// Extract() or ResolveAsync(). Many threads may touch one proxy at once; one
// of them runs the factory and the others wait for its outcome. A failed
// resolve is returned to every caller that waited on it, and the next call
// tries again. Copies of a Proxy share one target and one resolution.
//
// A proxy made by a Store (store->MakeProxy(object) or ProxyFor(key)) is
// backed by a ProxyReference: store config + key + options, serialized as
// a small JSON text. Proxy<T>::Deserialize in another process finds the
// store by name in a StoreRegistry or creates and registers it from the
// reference, then resolves from the same connector.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "xsilo/store/store.h"

namespace xsilo {

namespace detail {

// Runs `task` on a small process-wide pool of background threads (bounded,
// unlike one std::async per call). Pending tasks run before the pool exits.
void RunInBackground(std::function<void()> task);

template <typename T>
struct ProxyCore {
  std::function<Result<T>()> factory;
  std::optional<ProxyReference> reference;

  std::mutex mu;
  std::condition_variable done_cv;
  bool resolving = false;
  uint64_t attempts = 0;  // finished resolve attempts
  Status last_error;
  std::atomic<bool> resolved{false};
  std::optional<T> target;  // set once, never reset: readers need no lock

  Status Resolve() {
    if (resolved.load(std::memory_order_acquire)) return Status::OK();
    std::unique_lock<std::mutex> lock(mu);
    if (resolved.load(std::memory_order_relaxed)) return Status::OK();
    if (resolving) {
      // Another thread runs the factory: share its outcome.
      uint64_t seen = attempts;
      done_cv.wait(lock, [&] { return attempts != seen; });
      return resolved.load(std::memory_order_relaxed) ? Status::OK() : last_error;
    }
    resolving = true;
    lock.unlock();
    Result<T> result = factory();
    lock.lock();
    resolving = false;
    ++attempts;
    if (result.ok()) {
      target.emplace(std::move(result).value());
      last_error = Status::OK();
      resolved.store(true, std::memory_order_release);
    } else {
      last_error = result.status();
    }
    done_cv.notify_all();
    return last_error;
  }
};

}  // namespace detail

template <typename T>
class Proxy {
 public:
  using Factory = std::function<Result<T>()>;

  // A proxy over any factory; it has no reference, so it cannot be serialized.
  explicit Proxy(Factory factory) : core_(std::make_shared<detail::ProxyCore<T>>()) {
    core_->factory = std::move(factory);
  }

  // A proxy that resolves `reference` through `store` (when given) or the
  // store of reference.store.name in `registry`, created from the reference
  // on first use if the registry lacks it. `registry` must outlive the proxy.
  static Proxy FromReference(ProxyReference reference, std::shared_ptr<Store> store = nullptr,
                             StoreRegistry* registry = &StoreRegistry::Global()) {
    Proxy p([store, reference, registry]() -> Result<T> {
      std::shared_ptr<Store> s = store;
      if (!s) {
        XSILO_ASSIGN_OR_RETURN(s, registry->GetOrCreate(reference.store));
      }
      return s->template Resolve<T>(reference.key, reference.options);
    });
    p.core_->reference = std::move(reference);
    return p;
  }

  // The inverse of Serialize().
  static Result<Proxy> Deserialize(std::string_view json,
                                   StoreRegistry* registry = &StoreRegistry::Global()) {
    XSILO_ASSIGN_OR_RETURN(ProxyReference reference, ProxyReference::FromJson(json));
    return FromReference(std::move(reference), nullptr, registry);
  }

  // The reference as compact JSON (a few hundred bytes, never the object).
  // FailedPrecondition for a proxy built from a bare factory.
  Result<std::string> Serialize() const {
    if (!core_->reference) {
      return FailedPrecondition("this proxy was built from a factory and has no store reference");
    }
    return core_->reference->ToJson();
  }

  // Store config, key and options; nullopt for a bare-factory proxy.
  const std::optional<ProxyReference>& reference() const { return core_->reference; }

  // Runs the factory unless a previous call succeeded.
  Status Resolve() { return core_->Resolve(); }

  // The target, resolving first. The pointer stays valid while any copy of
  // this proxy lives.
  Result<const T*> Get() {
    XSILO_RETURN_IF_ERROR(Resolve());
    return &*core_->target;
  }

  // A copy of the target, resolving first (cheap for TensorMap and Message:
  // tensors share their Buffers).
  Result<T> Extract() {
    XSILO_RETURN_IF_ERROR(Resolve());
    return *core_->target;
  }

  // Starts resolving on a background thread; the future yields Resolve()'s
  // status. The proxy stays usable (and shares the outcome) meanwhile.
  std::future<Status> ResolveAsync() {
    auto promise = std::make_shared<std::promise<Status>>();
    std::future<Status> f = promise->get_future();
    if (is_resolved()) {
      promise->set_value(Status::OK());
      return f;
    }
    detail::RunInBackground([core = core_, promise] { promise->set_value(core->Resolve()); });
    return f;
  }

  bool is_resolved() const { return core_->resolved.load(std::memory_order_acquire); }

  // Makes this proxy resolved with `target` without running the factory
  // (used by MakeProxy's populate_target). No effect once resolved.
  void Populate(T target) {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (core_->resolved.load(std::memory_order_relaxed) || core_->resolving) return;
    core_->target.emplace(std::move(target));
    core_->resolved.store(true, std::memory_order_release);
  }

 private:
  std::shared_ptr<detail::ProxyCore<T>> core_;
};

// ---- Store's proxy constructors ---------------------------------------------

template <Encodable T>
Proxy<T> Store::ProxyFor(const Key& key, ProxyOptions options) {
  return Proxy<T>::FromReference(ProxyReference{config(), key, options}, shared_from_this());
}

}  // namespace xsilo

// Lifetimes, owned and borrowed proxies, and Store::MakeProxy.
#include "xsilo/store/lifetime.h"  // IWYU pragma: export
