// HybridTransport's receiving side: what the inner transport delivers goes
// to the user at once or through the fetch queue, where stubs are fetched,
// verified block by block, rebuilt and acknowledged, in arrival order.
#include <algorithm>

#include "hybrid/hybrid_internal.h"
#include "xsilo/s3/client.h"

namespace xsilo::hybrid_detail {

namespace {

// What a receiver reports in its ack of a store transfer it fetched over
// the network: bytes, microseconds, parallel connections.
constexpr const char* kAckFetchBytes = "fetch_bytes";
constexpr const char* kAckFetchUs = "fetch_us";
constexpr const char* kAckFetchStreams = "fetch_streams";

constexpr size_t kGrantsPerPeer = 2;
// Fetches of one object before its message is refused when every fetch
// fails the checksum. (Transient failures are retried inside the fetch:
// connectors' and HttpGetUrlRanges' own retries.)
constexpr int kFetchAttempts = 3;

}  // namespace

void HybridTransport::OnAck(const Message& m) {
  auto id = m.GetString("id");
  if (!id.ok()) return;
  auto bytes = m.GetInt(kAckFetchBytes);
  auto us = m.GetInt(kAckFetchUs);
  auto streams = m.GetInt(kAckFetchStreams);
  if (router_ && bytes.ok() && us.ok() && streams.ok() && *bytes > 0 && *us > 0) {
    router_->OnTransfer(m.sender, static_cast<uint64_t>(*bytes), static_cast<double>(*us) * 1e-6,
                        static_cast<int>(std::clamp<int64_t>(*streams, 1, 1024)));
    XSILO_LOG(kLog, kDebug,
              name_ << " rank " << rank() << ": rank " << m.sender << " fetched " << *bytes
                    << " bytes from the store in " << *us / 1000.0 << " ms over " << *streams
                    << " connections");
  }
  std::shared_ptr<Object> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_by_id_.find(*id);
    if (it != objects_by_id_.end() && --it->second->pending_acks <= 0) {
      done = it->second;
      Forget(done);
    }
  }
  if (done && connector_) (void)connector_->Evict(done->key);
  // A store probe ends once its object is gone.
  std::lock_guard<std::mutex> lock(mu_);
  if (probes_out_.erase(*id) > 0) probe_cv_.notify_all();
}

Status HybridTransport::OnInner(Message m, const std::function<bool()>& abandon) {
  if (m.type == kPingType || m.type == kPongType) {
    OnEcho(m);
    return Status::OK();
  }
  const bool plain = m.type != kHybridAckType && m.type != kGrantType && m.type != kProbeType &&
                     !m.params.count(kHybridKeyParam);
  auto given_up = [&] { return stopping() || (abandon && abandon()); };
  {
    std::lock_guard<std::mutex> lock(order_mu_);
    if (plain && fetch_pending_ == 0) return Deliver(std::move(m), given_up);
    ++fetch_pending_;
  }
  Status s = fetch_queue_.Push(std::move(m), given_up);
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(order_mu_);
    --fetch_pending_;
  }
  return s;
}

void HybridTransport::FetchLoop() {
  while (!stopping()) {
    auto next = fetch_queue_.Pop(std::chrono::milliseconds(100));
    if (!next.ok()) {
      if (next.status().code() == StatusCode::kTimeout) continue;
      return;  // closed: the transport stops
    }
    Message m = std::move(next).value();
    // Done with it (delivered, or not) at the end of this pass: a message
    // received after it may go to the user directly from then on.
    struct Finished {
      HybridTransport* t;
      ~Finished() {
        std::lock_guard<std::mutex> lock(t->order_mu_);
        --t->fetch_pending_;
      }
    } finished{this};
    if (m.type == kHybridAckType) {
      OnAck(m);
      continue;
    }
    if (m.type == kGrantType) {
      if (!connector_) OnGrant(m);
      continue;
    }
    std::string key_id;
    FetchReport fetched;
    Status s = Restore(&m, &key_id, &fetched);
    if (!key_id.empty() && connector_) {
      // An upload through one of our grants: the object was for us alone.
      Issued granted;
      bool ours;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ours = TakeIssued(key_id, &granted);
      }
      if (ours) {
        DropIssued(granted);
        key_id.clear();
      }
    }
    if (!s.ok()) {
      // The message cannot be rebuilt: say so rather than deliver half of it.
      XSILO_LOG(kLog, kWarn,
                name_ << ": dropping message from rank " << m.sender << ": " << s.ToString());
      continue;
    }
    int32_t sender = m.sender;
    if (router_ && fetched.bytes >= (1u << 20) && fetched.micros > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      fetched_Bps_[sender] = static_cast<double>(fetched.bytes) * 1e6 / double(fetched.micros);
    }
    // A probe is measured, never delivered.
    if (m.type != kProbeType && !Deliver(std::move(m), [this] { return stopping(); }).ok()) {
      return;
    }
    if (!key_id.empty()) {
      Message ack;
      ack.type = kHybridAckType;
      ack.params["id"] = key_id;
      if (fetched.bytes > 0) {
        ack.params[kAckFetchBytes] = static_cast<int64_t>(fetched.bytes);
        ack.params[kAckFetchUs] = fetched.micros;
        ack.params[kAckFetchStreams] = static_cast<int64_t>(fetched.streams);
      }
      inner().SendAsync(sender, std::move(ack), [](const Status&) {});
    }
  }
}

Status HybridTransport::Restore(Message* m, std::string* key_id, FetchReport* report) {
  auto key_param = m->params.find(kHybridKeyParam);
  if (key_param == m->params.end()) return Status::OK();
  auto key_json = m->GetString(kHybridKeyParam);
  auto sum = m->GetInt(kHybridChecksumParam);
  if (!key_json.ok() || !sum.ok()) return Corrupt("hybrid stub without key or checksum");
  XSILO_ASSIGN_OR_RETURN(Key key, Key::FromJson(*key_json));
  *key_id = key.id;  // also on failure: a granted upload is evicted regardless
  // The claim comes from the peer: refuse it before anything is allocated
  // for it (a download by URL allocates the announced size up front).
  if (key.size > options_.max_message_bytes) {
    return ResourceExhausted("stub announces an object of " + std::to_string(key.size) +
                             " bytes, above max_message_bytes " +
                             std::to_string(options_.max_message_bytes));
  }
  // Block checksums: a download by URL checks each range as it arrives;
  // a connector fetch is hashed afterwards, in parallel.
  auto blocks_text = m->GetString(kHybridBlocksParam);
  if (!blocks_text.ok()) return Corrupt("hybrid stub without block checksums");
  Blocks blocks;
  XSILO_RETURN_IF_ERROR(ParseBlocksParam(*blocks_text, key.size, static_cast<uint64_t>(*sum),
                                         &blocks.block_bytes, &blocks.sums));
  // A fetch that fails its checksum (bytes damaged on the way) is fetched
  // again; an object damaged at rest fails every time and the message is
  // refused, never delivered.
  Result<Buffer> object = Internal("not fetched yet");
  for (int attempt = 1;; ++attempt) {
    const auto start = Clock::now();
    object = Fetch(*m, key, blocks);
    if (object.ok() && report && !connector_) {
      report->bytes = object->size();
      report->micros =
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
      report->streams = hybrid_.url_connections;
    }
    if (object.ok() && connector_ &&
        BlockChecksums(object->span(), blocks.block_bytes) != blocks.sums) {
      object = Corrupt("object " + key.id + " failed its checksum");
    }
    if (object.ok() || attempt == kFetchAttempts ||
        object.status().code() != StatusCode::kCorrupt) {
      break;
    }
    XSILO_LOG(kLog, kWarn,
              name_ << ": fetching again (attempt " << attempt + 1 << " of " << kFetchAttempts
                    << "): " << object.status().ToString());
  }
  if (!object.ok()) return object.status();
  DecodeLimits limits;
  limits.max_payload_bytes = options_.max_message_bytes;
  XSILO_ASSIGN_OR_RETURN(TensorMap tensors, DecodeSafetensors(*object, limits));
  for (auto& [name, t] : tensors) m->tensors.insert_or_assign(name, std::move(t));
  m->params.erase(kHybridKeyParam);
  m->params.erase(kHybridChecksumParam);
  m->params.erase(kHybridBlocksParam);
  m->params.erase(kHybridUrlParam);
  return Status::OK();
}

Result<Buffer> HybridTransport::Fetch(const Message& m, const Key& key, const Blocks& blocks) {
  std::optional<Buffer> object;
  if (connector_) {
    XSILO_ASSIGN_OR_RETURN(object, connector_->Get(key));
  } else {
    auto url = m.GetString(kHybridUrlParam);
    if (!url.ok()) {
      return FailedPrecondition("stub carries no URL and this party has no storage access");
    }
    UrlDownloadArgs args;
    args.url = *url;
    args.size = key.size;
    args.connections = hybrid_.url_connections;
    args.pool = pool_.get();
    args.block_bytes = blocks.block_bytes;
    args.block_sums = blocks.sums;
    args.tls.ca_file = hybrid_.url_ca_file;
    auto fetched = HttpGetUrlRanges(args);
    if (!fetched.ok() && fetched.status().code() != StatusCode::kNotFound) return fetched.status();
    if (fetched.ok()) object = std::move(fetched->data);
  }
  if (!object) return NotFound("object " + key.id + " is gone (evicted or expired)");
  return std::move(*object);
}

}  // namespace xsilo::hybrid_detail
