// Lifetimes and ownership: who evicts a proxied object, and when.
//
// - OwnedProxy<T> owns its object: move-only, and it evicts the object from
//   its store when it is destroyed (or Reset). Release() gives up ownership
//   and returns a plain Proxy (e.g. to hand the object to another party).
// - BorrowedProxy<T> is a cheap, copyable, non-owning view of an owner: it
//   shares the owner's resolution and never evicts. A borrow must not be
//   resolved after its owner is gone (the object may be evicted: NotFound).
// - A Lifetime ties many keys together and evicts all of them when it ends:
//   ContextLifetime ends when it goes out of scope (or Close()),
//   LeaseLifetime ends when its lease lapses unless Extend()ed first.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "xsilo/store/proxy.h"

namespace xsilo {

class Lifetime {
 public:
  virtual ~Lifetime() = default;

  // Evicts `key` from `store` when this lifetime ends. FailedPrecondition
  // once it has ended.
  Status Add(std::shared_ptr<Store> store, Key key);
  // Ends the lifetime now: evicts every key (the first error is returned,
  // every key is tried). Idempotent.
  virtual Status Close();
  bool done() const;
  size_t size() const;  // keys attached and not yet evicted

 protected:
  Status EvictAll();

  mutable std::mutex mu_;
  bool done_ = false;
  std::vector<std::pair<std::shared_ptr<Store>, Key>> keys_;
};

// Ends when destroyed.
class ContextLifetime final : public Lifetime {
 public:
  ContextLifetime() = default;
  ~ContextLifetime() override { (void)Close(); }
  ContextLifetime(const ContextLifetime&) = delete;
  ContextLifetime& operator=(const ContextLifetime&) = delete;
};

// Ends `duration` after creation unless extended; a background thread
// evicts the keys when the lease lapses. Destroying it ends it too.
class LeaseLifetime final : public Lifetime {
 public:
  explicit LeaseLifetime(std::chrono::milliseconds duration);
  ~LeaseLifetime() override;
  LeaseLifetime(const LeaseLifetime&) = delete;
  LeaseLifetime& operator=(const LeaseLifetime&) = delete;

  // Moves the expiry to now + `more` when that is later than the current one.
  // FailedPrecondition when the lease has already lapsed.
  Status Extend(std::chrono::milliseconds more);
  std::chrono::steady_clock::time_point expiry() const;
  Status Close() override;

 private:
  void Run();

  std::condition_variable cv_;
  std::chrono::steady_clock::time_point expiry_;
  bool stopping_ = false;
  std::thread timer_;
};

template <typename T>
class BorrowedProxy;

template <typename T>
class OwnedProxy {
 public:
  OwnedProxy(Proxy<T> proxy, std::shared_ptr<Store> store)
      : proxy_(std::move(proxy)), store_(std::move(store)) {}
  ~OwnedProxy() { (void)Reset(); }
  OwnedProxy(const OwnedProxy&) = delete;
  OwnedProxy& operator=(const OwnedProxy&) = delete;
  OwnedProxy(OwnedProxy&& other) noexcept
      : proxy_(std::move(other.proxy_)), store_(std::move(other.store_)) {}
  OwnedProxy& operator=(OwnedProxy&& other) noexcept {
    if (this != &other) {
      (void)Reset();
      proxy_ = std::move(other.proxy_);
      store_ = std::move(other.store_);
    }
    return *this;
  }

  // Evicts the object now; the proxy then owns nothing.
  Status Reset() {
    if (!store_) return Status::OK();
    std::shared_ptr<Store> store = std::move(store_);
    store_.reset();
    if (store->closed()) return Status::OK();
    return store->Evict(proxy_->reference()->key);
  }
  // Gives up ownership without evicting.
  Proxy<T> Release() && {
    store_.reset();
    return std::move(*proxy_);
  }
  bool owns() const { return store_ != nullptr; }

  BorrowedProxy<T> Borrow() const { return BorrowedProxy<T>(*proxy_); }

  Status Resolve() { return proxy_->Resolve(); }
  Result<const T*> Get() { return proxy_->Get(); }
  Result<T> Extract() { return proxy_->Extract(); }
  bool is_resolved() const { return proxy_->is_resolved(); }
  const Key& key() const { return proxy_->reference()->key; }

 private:
  std::optional<Proxy<T>> proxy_;
  std::shared_ptr<Store> store_;  // null once released, reset or moved from
};

template <typename T>
class BorrowedProxy {
 public:
  Status Resolve() { return proxy_.Resolve(); }
  Result<const T*> Get() { return proxy_.Get(); }
  bool is_resolved() const { return proxy_.is_resolved(); }
  const Key& key() const { return proxy_.reference()->key; }

 private:
  friend class OwnedProxy<T>;
  explicit BorrowedProxy(Proxy<T> proxy) : proxy_(std::move(proxy)) {}
  Proxy<T> proxy_;  // shares the owner's core
};

// ---- Store's proxy constructors ---------------------------------------------

template <Encodable T>
Result<Proxy<T>> Store::MakeProxy(const T& object, ProxyOptions options, Lifetime* lifetime,
                                  const PlacementHints& hints) {
  XSILO_ASSIGN_OR_RETURN(Key key, Put(object, hints));
  if (lifetime) {
    Status s = lifetime->Add(shared_from_this(), key);
    if (!s.ok()) {
      (void)Evict(key);
      return s;
    }
  }
  Proxy<T> proxy = ProxyFor<T>(key, options);
  if (options.populate_target) proxy.Populate(object);
  return proxy;
}

template <Encodable T>
Result<OwnedProxy<T>> Store::MakeOwnedProxy(const T& object, ProxyOptions options) {
  XSILO_ASSIGN_OR_RETURN(Proxy<T> proxy, MakeProxy(object, options));
  return OwnedProxy<T>(std::move(proxy), shared_from_this());
}

}  // namespace xsilo
