#include "xsilo/store/lifetime.h"

namespace xsilo {

Status Lifetime::Add(std::shared_ptr<Store> store, Key key) {
  if (!store) return InvalidArgument("lifetime: null store");
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) return FailedPrecondition("lifetime has ended; key " + key.ToJson() + " not attached");
  keys_.emplace_back(std::move(store), std::move(key));
  return Status::OK();
}

Status Lifetime::Close() { return EvictAll(); }

Status Lifetime::EvictAll() {
  std::vector<std::pair<std::shared_ptr<Store>, Key>> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    keys.swap(keys_);
  }
  Status first;
  for (auto& [store, key] : keys) {
    if (store->closed()) continue;
    Status s = store->Evict(key);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

bool Lifetime::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

size_t Lifetime::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return keys_.size();
}

LeaseLifetime::LeaseLifetime(std::chrono::milliseconds duration)
    : expiry_(std::chrono::steady_clock::now() + duration), timer_([this] { Run(); }) {}

LeaseLifetime::~LeaseLifetime() { (void)Close(); }

void LeaseLifetime::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (cv_.wait_until(lock, expiry_) == std::cv_status::timeout &&
        std::chrono::steady_clock::now() >= expiry_) {
      break;
    }
  }
  if (stopping_) return;
  lock.unlock();
  (void)EvictAll();  // the lease lapsed
}

Status LeaseLifetime::Extend(std::chrono::milliseconds more) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) return FailedPrecondition("lease has already ended");
  auto proposed = std::chrono::steady_clock::now() + more;
  if (proposed > expiry_) expiry_ = proposed;
  cv_.notify_all();
  return Status::OK();
}

std::chrono::steady_clock::time_point LeaseLifetime::expiry() const {
  std::lock_guard<std::mutex> lock(mu_);
  return expiry_;
}

Status LeaseLifetime::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (timer_.joinable() && timer_.get_id() != std::this_thread::get_id()) timer_.join();
  return EvictAll();
}

}  // namespace xsilo
