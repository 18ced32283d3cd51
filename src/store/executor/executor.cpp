// StoreExecutor's non-template parts (include/xsilo/store/executor.h).
#include "xsilo/store/executor.h"

namespace xsilo {

ProxyPolicy ProxyAlways() {
  return [](const ProxyCandidate&) { return true; };
}

ProxyPolicy ProxyNever() {
  return [](const ProxyCandidate&) { return false; };
}

ProxyPolicy ProxySize(uint64_t min_bytes) {
  return [min_bytes](const ProxyCandidate& c) { return c.bytes >= min_bytes; };
}

StoreExecutor::StoreExecutor(std::shared_ptr<TaskPool> pool, std::shared_ptr<Store> store,
                             ProxyPolicy should_proxy)
    : pool_(std::move(pool)),
      store_(std::move(store)),
      policy_(std::make_shared<const ProxyPolicy>(should_proxy ? std::move(should_proxy)
                                                               : ProxyNever())),
      counters_(std::make_shared<detail::ExecutorCounters>()) {}

ExecutorMetrics StoreExecutor::metrics() const {
  const detail::ExecutorCounters& c = *counters_;
  return {.tasks = c.tasks.load(),
          .failed = c.failed.load(),
          .proxied_arguments = c.proxied_arguments.load(),
          .inline_arguments = c.inline_arguments.load(),
          .proxied_results = c.proxied_results.load(),
          .inline_results = c.inline_results.load(),
          .evict_errors = c.evict_errors.load()};
}

namespace detail {

void TaskInputs::EvictAll() {
  std::vector<Key> keys = std::move(keys_);
  keys_.clear();
  if (keys.empty() || !store_ || store_->closed()) return;
  for (const Key& key : keys) {
    if (!store_->Evict(key).ok() && !store_->closed()) ++counters_->evict_errors;
  }
}

}  // namespace detail

}  // namespace xsilo
