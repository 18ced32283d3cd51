// ConnectorWrapper: a Connector that forwards every call to another, after
// LevelDB's EnvWrapper. A decorator (faults, counting, metrics) derives from
// it and overrides only what it changes, so it cannot drop a capability or a
// batch fast path by forgetting to forward it: presigned() and
// presigned_multipart() hand out the target's own interfaces.
//
// A decorator that must see every object (a fault per put, a count per get)
// overrides the batch forms too, e.g. with Connector's per-object loops
// (`return Connector::PutBatch(objects);`), which call its own overrides.
#pragma once

#include <memory>
#include <utility>

#include "xsilo/store/connector.h"

namespace xsilo {

class ConnectorWrapper : public Connector {
 public:
  explicit ConnectorWrapper(std::shared_ptr<Connector> target) : target_(std::move(target)) {}

  Connector* target() const { return target_.get(); }

  std::string_view type() const override { return target_->type(); }
  ConnectorConfig config() const override { return target_->config(); }
  Result<Key> Put(const GatherList& bytes) override { return target_->Put(bytes); }
  using Connector::Put;
  Result<std::optional<Buffer>> Get(const Key& key) override { return target_->Get(key); }
  Result<bool> Exists(const Key& key) override { return target_->Exists(key); }
  Status Evict(const Key& key) override { return target_->Evict(key); }
  Result<Key> NewKey() override { return target_->NewKey(); }
  Status Set(const Key& key, const GatherList& bytes) override { return target_->Set(key, bytes); }
  Result<std::vector<Key>> PutBatch(const std::vector<Buffer>& objects) override {
    return target_->PutBatch(objects);
  }
  Result<std::vector<std::optional<Buffer>>> GetBatch(const std::vector<Key>& keys) override {
    return target_->GetBatch(keys);
  }
  Status EvictBatch(const std::vector<Key>& keys) override { return target_->EvictBatch(keys); }
  PresignedAccess* presigned() override { return target_->presigned(); }
  PresignedMultipartAccess* presigned_multipart() override {
    return target_->presigned_multipart();
  }
  void Close() override { target_->Close(); }

 private:
  const std::shared_ptr<Connector> target_;
};

}  // namespace xsilo
