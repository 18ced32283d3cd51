// HybridTransport's offload: big tensors uploaded once per content (found
// by the Buffers they came from, then by digest), and the bookkeeping of
// stored objects until every receiver acknowledged them.

#include "hybrid/hybrid_internal.h"

namespace xsilo::hybrid_detail {

TensorMap TakeTensors(Message* m, uint64_t threshold) {
  TensorMap big;
  for (auto it = m->tensors.begin(); it != m->tensors.end();) {
    if (it->second.nbytes() > 0 && it->second.nbytes() >= threshold) {
      big.insert(m->tensors.extract(it++));
    } else {
      ++it;
    }
  }
  return big;
}

Result<Message> HybridTransport::Offload(Message m, const std::vector<int32_t>& peers,
                                         std::optional<Route> route, int* stripe) {
  const size_t receivers = peers.size();
  if (!connector_ && receivers != 1) return m;  // no storage access: inline
  if (router_ && !route) route = ChooseRoute(m, peers, /*wait=*/true);
  if (route) *stripe = route->stripe;
  if (route && !route->store) return m;
  // Adaptive: all of the payload goes to the store.
  const uint64_t threshold = route ? 1 : hybrid_.store_threshold();
  TensorMap big = TakeTensors(&m, threshold);
  if (big.empty()) return m;
  if (!connector_) return OffloadThroughGrant(std::move(m), std::move(big), peers[0]);
  Prepared prepared;
  prepared.payload = EncodeSafetensors(big, {}, /*checksum=*/false);
  const std::string identity = IdentityOf(prepared.payload.bytes);
  bool known;
  {
    std::lock_guard<std::mutex> lock(mu_);
    known = objects_by_identity_.count(identity) > 0;
  }
  if (!known) return OffloadNew(std::move(m), std::move(prepared), identity, receivers);
  XSILO_LOG(kLog, kDebug,
            name_ << " rank " << rank()
                  << ": hashing first: the payload's Buffers are those of an object still stored");
  // Bytes from where an object still stored came from: hash first, and
  // upload only if the content changed.
  HashPrepared(&prepared);
  const EncodedPayload& payload = prepared.payload;
  const std::string content = ContentOf(payload);

  std::shared_ptr<Object> obj;
  std::promise<Status> upload;
  bool uploader = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_by_content_.find(content);
    if (it != objects_by_content_.end()) {
      obj = it->second;
    } else {
      obj = std::make_shared<Object>();
      obj->uploaded = upload.get_future().share();
      objects_by_content_[content] = obj;
      uploader = true;
    }
    obj->pending_acks += static_cast<int64_t>(receivers);
    obj->last_use = Clock::now();
  }
  if (uploader) {
    auto stored = PutObject(payload.bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (stored.ok()) {
      KeepLocked(obj, std::move(stored).value(), std::move(prepared.blocks), identity);
      upload.set_value(Status::OK());
    } else {
      objects_by_content_.erase(content);
      upload.set_value(stored.status());
    }
  }
  Status up = obj->uploaded.get();
  if (!up.ok()) return up;
  MakeStub(&m, obj->key, payload.checksum, obj->blocks, obj->url);
  return m;
}

Result<Message> HybridTransport::OffloadNew(Message m, Prepared prepared,
                                            const std::string& identity, size_t receivers) {
  std::future<void> hashed;
  try {
    hashed = std::async(std::launch::async, [&prepared] { HashPrepared(&prepared, 1); });
  } catch (const std::system_error&) {  // no thread to be had: hash first
    HashPrepared(&prepared);
  }
  auto stored = PutObject(prepared.payload.bytes);
  if (hashed.valid()) hashed.get();
  if (!stored.ok()) return stored.status();
  const EncodedPayload& payload = prepared.payload;
  const std::string content = ContentOf(payload);
  // Another send stored (or is storing) the same content: reuse its
  // object once its upload succeeded, and drop ours.
  std::shared_ptr<Object> other;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_by_content_.find(content);
    if (it != objects_by_content_.end()) {
      other = it->second;
      other->pending_acks += static_cast<int64_t>(receivers);
      other->last_use = Clock::now();
    }
  }
  if (other) {
    if (other->uploaded.get().ok()) {
      (void)connector_->Evict(stored->key);
      MakeStub(&m, other->key, payload.checksum, other->blocks, other->url);
      return m;
    }
    std::lock_guard<std::mutex> lock(mu_);  // its upload failed: ours stands
    other->pending_acks -= static_cast<int64_t>(receivers);
  }
  auto obj = std::make_shared<Object>();
  std::promise<Status> done;
  done.set_value(Status::OK());
  obj->uploaded = done.get_future().share();
  obj->pending_acks = static_cast<int64_t>(receivers);
  obj->last_use = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    objects_by_content_.insert({content, obj});  // unless another came meanwhile
    KeepLocked(obj, std::move(stored).value(), std::move(prepared.blocks), identity);
  }
  MakeStub(&m, obj->key, payload.checksum, obj->blocks, obj->url);
  return m;
}

void HybridTransport::KeepLocked(const std::shared_ptr<Object>& obj, Stored stored,
                                 std::string blocks, const std::string& identity) {
  obj->key = std::move(stored.key);
  obj->url = std::move(stored.url);
  obj->blocks = std::move(blocks);
  obj->identity = identity;
  objects_by_id_[obj->key.id] = obj;
  objects_by_identity_[identity] = obj;
}

Result<HybridTransport::Stored> HybridTransport::PutObject(const GatherList& bytes) {
  Stored out;
  const auto start = Clock::now();
  auto key = connector_->Put(bytes);
  if (!key.ok()) return key.status().WithContext("upload to " + std::string(connector_->type()));
  out.key = std::move(key).value();
  if (hybrid_.presign_expiry.count() > 0 && connector_->presigned()) {
    auto url = connector_->presigned()->PresignGet(out.key, hybrid_.presign_expiry);
    if (!url.ok()) {
      (void)connector_->Evict(out.key);
      return url.status().WithContext("presign");
    }
    out.url = std::move(url).value();
  }
  if (router_) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    router_->OnStoreWrite(bytes.size, seconds);
    XSILO_LOG(kLog, kDebug,
              name_ << " rank " << rank() << ": stored " << bytes.size << " bytes in "
                    << seconds * 1e3 << " ms");
  }
  return out;
}

void HybridTransport::Forget(const std::shared_ptr<Object>& obj) {
  objects_by_id_.erase(obj->key.id);
  if (auto it = objects_by_identity_.find(obj->identity);
      it != objects_by_identity_.end() && it->second == obj) {
    objects_by_identity_.erase(it);
  }
  for (auto it = objects_by_content_.begin(); it != objects_by_content_.end(); ++it) {
    if (it->second == obj) {
      objects_by_content_.erase(it);
      break;
    }
  }
}

}  // namespace xsilo::hybrid_detail
