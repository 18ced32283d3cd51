// Private: a byte-bounded LRU map from cache key to Buffer. Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "xsilo/core/buffer.h"

namespace xsilo {

class LruCache {
 public:
  explicit LruCache(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  std::optional<Buffer> Get(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    order_.splice(order_.begin(), order_, it->second);  // most recent first
    return it->second->second;
  }

  // An object larger than the capacity is not cached.
  void Put(const std::string& key, const Buffer& value) {
    std::lock_guard<std::mutex> lock(mu_);
    EraseLocked(key);
    if (value.size() > capacity_ || capacity_ == 0) return;
    order_.emplace_front(key, value);
    index_[key] = order_.begin();
    bytes_ += value.size();
    while (bytes_ > capacity_) {
      auto& last = order_.back();
      bytes_ -= last.second.size();
      index_.erase(last.first);
      order_.pop_back();
    }
  }

  void Erase(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    EraseLocked(key);
  }

  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    order_.clear();
    index_.clear();
    bytes_ = 0;
  }

  uint64_t bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }
  uint64_t entries() const {
    std::lock_guard<std::mutex> lock(mu_);
    return index_.size();
  }

 private:
  void EraseLocked(const std::string& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return;
    bytes_ -= it->second->second.size();
    order_.erase(it->second);
    index_.erase(it);
  }

  const uint64_t capacity_;
  mutable std::mutex mu_;
  std::list<std::pair<std::string, Buffer>> order_;
  std::unordered_map<std::string, std::list<std::pair<std::string, Buffer>>::iterator> index_;
  uint64_t bytes_ = 0;
};

}  // namespace xsilo
