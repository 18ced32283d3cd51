// Helpers for the Store / proxy / multi tests.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "xsilo/store/connector.h"
#include "xsilo/store/connector_wrapper.h"

namespace xsilo::testing {

// A fresh directory under the temp dir, removed when the process exits.
std::string StoreTempDir();

// Config of a fresh connector of `kind` ("memory", "file", "redis" or "s3";
// redis starts the test redis-server, s3 an embedded S3 server, on first use).
ConnectorConfig FreshConnectorConfig(const std::string& kind);

// Forwards to another connector and counts calls (after LevelDB's EnvWrapper).
class CountingConnector final : public Connector {
 public:
  explicit CountingConnector(std::unique_ptr<Connector> inner) : inner_(std::move(inner)) {}
  std::string_view type() const override { return inner_->type(); }
  ConnectorConfig config() const override { return inner_->config(); }
  Result<Key> Put(const GatherList& bytes) override {
    ++puts;
    return inner_->Put(bytes);
  }
  Result<std::optional<Buffer>> Get(const Key& key) override {
    ++gets;
    // Widens the window in which concurrent resolves overlap.
    if (get_delay.count() > 0) std::this_thread::sleep_for(get_delay);
    return inner_->Get(key);
  }
  Result<bool> Exists(const Key& key) override { return inner_->Exists(key); }
  Status Evict(const Key& key) override {
    ++evicts;
    return inner_->Evict(key);
  }
  Result<Key> NewKey() override { return inner_->NewKey(); }
  Status Set(const Key& key, const GatherList& bytes) override { return inner_->Set(key, bytes); }
  void Close() override { inner_->Close(); }

  std::atomic<int> puts{0}, gets{0}, evicts{0};
  std::chrono::milliseconds get_delay{0};

 private:
  std::unique_ptr<Connector> inner_;
};

// Child-process side of the cross-process tests: when this binary was
// started by SpawnChild, does the requested work and returns true.
bool RunStoreChildIfRequested(int* exit_code);

// The mode and argument SpawnStoreChild gave this process, if it did (for
// child modes that live in a test file, e.g. executor_test.cpp).
struct StoreChildRequest {
  std::string mode;
  std::string arg;
};
std::optional<StoreChildRequest> RequestedStoreChild();
// The exit code a child reports for `s`: 0 when OK, else 10 + its code.
int ChildExitCode(const Status& s);

// Runs this binary as a child doing `mode` with `arg` (see
// store_test_util.cpp); returns its pid. extra_env: "NAME=value" entries.
int SpawnStoreChild(const std::string& mode, const std::string& arg,
                    const std::vector<std::string>& extra_env = {});
// Waits for a child; its exit code, or -1.
int WaitChild(int pid);

// Forwards to a connector and notes every Exists that found its key unset.
// A waiter (Store::WaitForKey) asks Exists before each wait, so a miss
// proves that the waiter has looked and is waiting: a Set after it is one
// the waiter must be woken for.
class MissCounter final : public ConnectorWrapper {
 public:
  using ConnectorWrapper::ConnectorWrapper;
  Result<bool> Exists(const Key& key) override {
    Result<bool> r = ConnectorWrapper::Exists(key);
    if (r.ok() && !*r) {
      std::lock_guard<std::mutex> lock(mu_);
      ++misses_;
      missed_by_.insert(std::this_thread::get_id());
      cv_.notify_all();
    }
    return r;
  }
  int misses() {
    std::lock_guard<std::mutex> lock(mu_);
    return misses_;
  }
  // Until more than `n` misses in all (30 s).
  bool WaitForMoreMissesThan(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return misses_ > n; });
  }
  // Until `n` threads have each missed (30 s).
  bool WaitForThreadsMissing(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return missed_by_.size() >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int misses_ = 0;
  std::set<std::thread::id> missed_by_;
};

}  // namespace xsilo::testing
