// Future<T>: an object that one party will set and others await, after
// ProxyStore's Future. It is a deferred key (Store::NewKey) plus a store
// reference, so it serializes like a proxy and can be set or awaited in any
// process. Waiting is by notification where the connector allows it (redis:
// BLPOP on a per-key signal list) and by polling with exponential backoff
// (1 ms doubling to 500 ms) otherwise; every wait has a timeout.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "xsilo/store/proxy.h"

namespace xsilo {

template <Encodable T>
class Future {
 public:
  // A fresh deferred key in `store`.
  static Result<Future> Create(std::shared_ptr<Store> store) {
    if (!store) return InvalidArgument("future: null store");
    XSILO_ASSIGN_OR_RETURN(Key key, store->NewKey());
    Future f(ProxyReference{store->config(), std::move(key), {}}, &StoreRegistry::Global());
    f.store_ = std::move(store);
    return f;
  }

  // The inverse of Serialize(); the store is found in (or created and
  // registered in) `registry` on first use.
  static Result<Future> Deserialize(std::string_view json,
                                    StoreRegistry* registry = &StoreRegistry::Global()) {
    XSILO_ASSIGN_OR_RETURN(ProxyReference ref, ProxyReference::FromJson(json));
    return Future(std::move(ref), registry);
  }
  std::string Serialize() const { return ref_.ToJson(); }
  const Key& key() const { return ref_.key; }

  // Sets the value (once; a second Set overwrites) and wakes the waiters.
  Status Set(const T& value) {
    XSILO_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, GetStore());
    return store->Set(ref_.key, value);
  }

  // Waits up to `timeout` for the value: Timeout if it is not set by then.
  Result<T> Get(std::chrono::milliseconds timeout) {
    XSILO_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, GetStore());
    XSILO_RETURN_IF_ERROR(store->WaitForKey(ref_.key, timeout));
    return store->template Resolve<T>(ref_.key, {});
  }

  // Has the value been set?
  Result<bool> done() {
    XSILO_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, GetStore());
    return store->Exists(ref_.key);
  }

  // A proxy of the value whose resolve waits up to `timeout` for it.
  Proxy<T> MakeProxy(std::chrono::milliseconds timeout, bool evict_on_resolve = false) const {
    ProxyReference ref = ref_;
    ref.options.resolve_timeout = timeout;
    ref.options.evict_on_resolve = evict_on_resolve;
    return Proxy<T>::FromReference(std::move(ref), store_, registry_);
  }

 private:
  Future(ProxyReference ref, StoreRegistry* registry) : ref_(std::move(ref)), registry_(registry) {}

  Result<std::shared_ptr<Store>> GetStore() {
    if (!store_) {
      XSILO_ASSIGN_OR_RETURN(store_, registry_->GetOrCreate(ref_.store));
    }
    return store_;
  }

  ProxyReference ref_;
  StoreRegistry* registry_;
  std::shared_ptr<Store> store_;
};

}  // namespace xsilo
