// The objects a ucx connector serves, bounded in bytes (0 = unbounded).
// Thread-safe: the connector's callers and the progress thread share it.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "xsilo/core/codec.h"

namespace xsilo::ucx {

class ObjectTable {
 public:
  explicit ObjectTable(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // Claims `size` bytes of the bound; false when they do not fit.
  bool Reserve(uint64_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    if (max_bytes_ != 0 && (size > max_bytes_ || bytes_ > max_bytes_ - size)) return false;
    bytes_ += size;
    return true;
  }
  void Unreserve(uint64_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_ -= size;
  }
  // Stores reserved bytes under `id`, replacing (and releasing) an old value.
  void Insert(const std::string& id, GatherList bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, fresh] = objects_.try_emplace(id);
    if (!fresh) bytes_ -= it->second.size;
    it->second = std::move(bytes);
  }
  std::optional<GatherList> Find(const std::string& id) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(id);
    if (it == objects_.end()) return std::nullopt;
    return it->second;
  }
  bool Contains(const std::string& id) const {
    std::lock_guard<std::mutex> lock(mu_);
    return objects_.count(id) > 0;
  }
  void Erase(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(id);
    if (it == objects_.end()) return;
    bytes_ -= it->second.size;
    objects_.erase(it);
  }
  uint64_t bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }

 private:
  const uint64_t max_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, GatherList> objects_;
  uint64_t bytes_ = 0;
};

}  // namespace xsilo::ucx
