// Private: wake-ups for deferred keys, where the connector's backend allows
// it. Redis: Notify pushes onto a per-key signal list "<prefix>:<id>:signal"
// and Wait blocks in BLPOP on it, re-pushing what it popped so every other
// waiter wakes as well. The list expires a day after the last Notify and is
// deleted by Forget (on evict). File: Wait watches the directory with
// inotify for the key's name (the connector's rename); Notify is a no-op.
#pragma once

#include <chrono>
#include <memory>

#include "xsilo/store/connector.h"

namespace xsilo {

class KeyNotifier {
 public:
  virtual ~KeyNotifier() = default;
  // Wakes every current and future waiter on `key`.
  virtual Status Notify(const Key& key) = 0;
  // Blocks until a Notify on `key` or `timeout`; true when notified.
  virtual Result<bool> Wait(const Key& key, std::chrono::milliseconds timeout) = 0;
  virtual Status Forget(const Key& key) = 0;
};

// Null when keys of this connector can only be polled.
std::unique_ptr<KeyNotifier> MakeKeyNotifier(const ConnectorConfig& config);

}  // namespace xsilo
