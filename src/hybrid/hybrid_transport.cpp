// Threads of a HybridTransport:
//  - `workers` send workers: offload big tensors (encode, hash, upload once)
//    and hand the stub to the inner transport, in submission order;
//  - one fetch thread: reads stubs and acks from the inner transport's queue,
//    pulls each object, verifies it, delivers the whole Message, acknowledges;
//  - one reaper: evicts objects past their TTL and upload grants past their
//    expiry.
//
// Upload grants (HybridOptions::grant_uploads): a party that can presign
// sends each receiver, ahead of a message, a private grant (fresh key +
// presigned PUT URL) unless the receiver already holds enough. A receiver
// without storage access spends one on its next big send back to that
// party; the granting party evicts the object as soon as it has fetched it.
#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>

#include "hybrid/auto_router.h"
#include "xsilo/core/codec.h"
#include "xsilo/hybrid/hybrid.h"
#include "xsilo/s3/client.h"

namespace xsilo {

namespace {

using Clock = std::chrono::steady_clock;

// Where a send's payload goes, once decided: inline (over `stripe`
// streams) or to the store.
struct Route {
  bool store = false;
  int stripe = 1;
};

struct SendJob {
  uint64_t seq;
  std::vector<int32_t> peers;
  bool broadcast;
  Message message;
  SendCallback done;
  std::optional<Route> route;  // decided when queued; else by the worker
};

// One uploaded object, shared by every send of the same content.
struct Object {
  Key key;
  std::string url;       // presigned GET, when the connector can presign
  std::string blocks;    // kHybridBlocksParam
  std::string identity;  // IdentityOf the payload it was uploaded from
  std::shared_future<Status> uploaded;
  int64_t pending_acks = 0;
  Clock::time_point last_use;
};

// An upload grant received from a party: where our next big send to it goes.
struct Grant {
  Key key;
  std::string url;                     // one presigned PUT, or:
  std::vector<std::string> part_urls;  // a multipart upload's parts
  std::string complete_url;
  Clock::time_point usable_until;
};

// An upload grant we issued: evicted when used, or once it has expired.
struct Issued {
  int32_t peer;
  Key key;
  std::string upload_id;  // a multipart grant
  Clock::time_point expires;
};

constexpr const char* kGrantType = "xsilo.hybrid.grant";
// The adaptive backend's echoes: param "t" is the pinger's clock, ns.
constexpr const char* kPingType = "xsilo.auto.ping";
constexpr const char* kPongType = "xsilo.auto.pong";
// The adaptive backend's probe of a link before its first payload: bytes sent inline, or a stub of
// an object to fetch; the receiver fetches (and acks) but never delivers it.
constexpr const char* kProbeType = "xsilo.auto.probe";
// How long a probe waits for the receiver's ack of its store transfer.
constexpr auto kStoreProbeTimeout = std::chrono::seconds(30);
// What a receiver reports in its ack of a store transfer it fetched over
// the network: bytes, microseconds, parallel connections.
constexpr const char* kAckFetchBytes = "fetch_bytes";
constexpr const char* kAckFetchUs = "fetch_us";
constexpr const char* kAckFetchStreams = "fetch_streams";

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// XSILO_DEBUG set (non-empty, not "0"): the adaptive backend logs its choices.
bool DebugLog() {
  static const bool on = [] {
    const char* v = std::getenv("XSILO_DEBUG");
    return v != nullptr && *v != 0 && std::string(v) != "0";
  }();
  return on;
}
constexpr size_t kGrantsPerPeer = 2;
// Fetches of one object before its message is refused when every fetch
// fails the checksum. (Transient failures are retried inside the fetch:
// connectors' and HttpGetUrlRanges' own retries.)
constexpr int kFetchAttempts = 3;

// kHybridBlocksParam: "<block bytes>:" then 16 hex digits per block.
std::string BlocksParam(uint64_t block_bytes, const std::vector<uint64_t>& sums) {
  std::string out = std::to_string(block_bytes) + ":";
  out.reserve(out.size() + 16 * sums.size());
  char hex[17];
  for (uint64_t v : sums) {
    std::snprintf(hex, sizeof hex, "%016" PRIx64, v);
    out.append(hex, 16);
  }
  return out;
}

// A payload on its way to the store: its bytes with the digest of their
// block checksums as payload.checksum, and the checksums as the stub's
// kHybridBlocksParam.
struct Prepared {
  EncodedPayload payload;
  std::string blocks;
};

// Hashes p->payload (on up to `threads` threads; 0: by the hardware).
void HashPrepared(Prepared* p, int threads = 0) {
  const uint64_t block = BlockBytesFor(p->payload.bytes.size);
  const std::vector<uint64_t> sums = BlockChecksums(p->payload.bytes, block, threads);
  p->payload.checksum = BlockDigest(sums);
  p->blocks = BlocksParam(block, sums);
}

Prepared Prepare(const TensorMap& tensors) {
  Prepared p;
  p.payload = EncodeSafetensors(tensors, {}, /*checksum=*/false);
  HashPrepared(&p);
  return p;
}

// What names an object's content: its digest and size.
std::string ContentOf(const EncodedPayload& payload) {
  return std::to_string(payload.checksum) + ":" + std::to_string(payload.bytes.size);
}

// Where a safetensors payload's bytes live: its header (made anew for each
// encoding, so by its bytes) and its tensors' addresses and sizes. The same
// identity may hold new content (a tensor changed in place), so it only
// says whether hashing first could find an object to reuse.
std::string IdentityOf(const GatherList& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.segments.size(); ++i) {
    const Buffer& seg = bytes.segments[i];
    if (i == 0) {
      out.append(reinterpret_cast<const char*>(seg.data()), seg.size());
    } else {
      out += ";" + std::to_string(reinterpret_cast<uintptr_t>(seg.data())) + "+" +
             std::to_string(seg.size());
    }
  }
  return out;
}

// Parses kHybridBlocksParam for an object of `size` bytes whose stub names
// `digest`; Corrupt unless it is well formed and matches both.
Status ParseBlocksParam(const std::string& text, uint64_t size, uint64_t digest,
                        uint64_t* block_bytes, std::vector<uint64_t>* sums) {
  const auto colon = text.find(':');
  uint64_t block = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + std::min(colon, text.size()), block);
  if (colon == std::string::npos || ec != std::errc() || end != text.data() + colon ||
      block < (1ull << 20) || block > (1ull << 40) || (block & (block - 1)) != 0) {
    return Corrupt("hybrid stub with a malformed block size");
  }
  const std::string_view hex = std::string_view(text).substr(colon + 1);
  const uint64_t n = (size + block - 1) / block;
  if (hex.size() != 16 * n) {
    return Corrupt("hybrid stub with " + std::to_string(hex.size() / 16) +
                   " block checksums for an object of " + std::to_string(n) + " blocks");
  }
  sums->resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    auto [e, c] = std::from_chars(hex.data() + 16 * i, hex.data() + 16 * (i + 1), (*sums)[i], 16);
    if (c != std::errc() || e != hex.data() + 16 * (i + 1)) {
      return Corrupt("hybrid stub with a malformed block checksum");
    }
  }
  if (BlockDigest(*sums) != digest) {
    return Corrupt("hybrid stub whose block checksums do not match its checksum");
  }
  *block_bytes = block;
  return Status::OK();
}

class HybridTransport final : public Transport {
 public:
  HybridTransport(const TransportOptions& options, std::unique_ptr<Transport> inner,
                  std::shared_ptr<Connector> connector, HybridOptions hybrid,
                  std::string connector_type, std::shared_ptr<void> keepalive)
      : Transport(options),
        keepalive_(std::move(keepalive)),
        inner_(std::move(inner)),
        connector_(std::move(connector)),
        hybrid_(hybrid),
        name_((hybrid.adaptive ? std::string("auto") : std::string(inner_->name())) + "+" +
              (connector_ ? std::string(connector_->type()) : connector_type)),
        router_(hybrid.adaptive ? std::make_unique<AutoRouter>(StripePolicy(hybrid.stripe_streams))
                                : nullptr),
        pool_(hybrid.recycle_bytes > 0
                  ? std::make_shared<BufferPool>(hybrid.recycle_bytes, std::chrono::seconds(5))
                  : nullptr) {}

  ~HybridTransport() override { Stop(); }

  std::string_view name() const override { return name_; }
  const std::shared_ptr<Connector>& connector() const { return connector_; }
  std::string RouteReason() const override { return router_ ? router_->last_reason() : ""; }
  double MeasuredGoodputBps(int32_t peer) override {
    if (!router_) return 0;
    const LinkEstimate e = router_->EstimateOf(peer);
    if (e.samples == 0) return 0;
    return std::max({0.0, e.one_stream_Bps, e.aggregate_Bps});
  }

  Status Start() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (started_) return FailedPrecondition(name_ + " already started");
      started_ = true;
    }
    for (int i = 0; i < std::max(1, hybrid_.workers); ++i) {
      workers_.emplace_back([this] { SendLoop(); });
    }
    fetcher_ = std::thread([this] { FetchLoop(); });
    reaper_ = std::thread([this] { ReapLoop(); });
    inner_->SetForwarder([this](Message m, const std::function<bool()>& abandon) {
      return OnInner(std::move(m), abandon);
    });
    XSILO_RETURN_IF_ERROR(inner_->Start());
    if (router_) {
      // Rank 0 talks to every client, a client to rank 0.
      std::vector<int32_t> peers;
      for (int32_t r = 0; r < world_size(); ++r) {
        if (r != rank() && (rank() == 0 || r == 0)) peers.push_back(r);
      }
      MaybePing(peers);
    }
    return Status::OK();
  }

  void Stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    NotifyAll();
    CloseInbox();  // wakes a fetch blocked on a full queue
    for (auto& t : workers_) t.join();
    inner_->Stop();  // fails the inner sends still in flight; no handler calls after this
    fetch_queue_.Close();
    if (fetcher_.joinable()) fetcher_.join();
    if (prober_.joinable()) prober_.join();
    if (reaper_.joinable()) reaper_.join();
    std::deque<SendJob> jobs;
    std::map<std::string, std::shared_ptr<Object>> objects;
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs.swap(jobs_);
      objects.swap(objects_by_id_);
      objects_by_content_.clear();
      objects_by_identity_.clear();
    }
    std::map<std::string, Issued> issued;
    {
      std::lock_guard<std::mutex> lock(mu_);
      issued.swap(issued_);
    }
    for (auto& [id, g] : issued) DropIssued(g);
    for (auto& j : jobs) j.done(Cancelled("transport stopped before the send started"));
    // Objects are ours: nothing outlives the sender's transport.
    for (auto& [id, obj] : objects) {
      if (obj->uploaded.valid() &&
          obj->uploaded.wait_for(std::chrono::seconds(0)) == std::future_status::ready &&
          obj->uploaded.get().ok() && connector_) {
        (void)connector_->Evict(obj->key);
      }
    }
  }

  void SendAsync(int32_t peer, Message message, SendCallback done) override {
    Status s = CheckPeer(peer);
    if (!s.ok()) return done(s);
    Enqueue({peer}, false, std::move(message), std::move(done));
  }

  void BroadcastAsync(std::vector<int32_t> peers, Message message, SendCallback done) override {
    for (int32_t p : peers) {
      Status s = CheckPeer(p);
      if (!s.ok()) return done(s);
    }
    if (peers.empty()) return done(Status::OK());
    Enqueue(std::move(peers), true, std::move(message), std::move(done));
  }

 private:
  // Queues a send for the workers, or issues it on the caller's thread
  // when that costs nothing: its route is known without waiting, it goes
  // inline, no send is queued or being prepared ahead of it, and it owes
  // no grants (whose multipart presign is a request to the store). A
  // message to a peer then takes the same threads as over the inner
  // transport alone: the hand-off to a worker cost a LAN send of the Small
  // tier ~0.3 ms (docs/auto.md).
  void Enqueue(std::vector<int32_t> peers, bool broadcast, Message message, SendCallback done) {
    std::optional<Route> route = RouteNow(message, peers);
    Status s;
    SendJob direct;
    bool issue_here = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_) {
        s = FailedPrecondition("transport not started");
      } else if (stopped_) {
        s = Cancelled("transport stopped");
      } else {
        const uint64_t seq = next_seq_++;
        SendJob job{seq, std::move(peers), broadcast, std::move(message), std::move(done), route};
        issue_here = route && !route->store && jobs_.empty() && next_issue_ == job.seq &&
                     !GrantsDueLocked(job.peers);
        if (issue_here)
          direct = std::move(job);
        else
          jobs_.push_back(std::move(job));
      }
    }
    if (!s.ok()) return done(s);
    if (!issue_here) return work_cv_.notify_one();
    const int stripe = route->stripe;
    Message m = std::move(direct.message);
    Issue(std::move(direct), std::move(m), stripe);
  }

  void SendLoop() {
    for (;;) {
      SendJob job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stopped_ || !jobs_.empty(); });
        if (stopped_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      int stripe = 1;
      Result<Message> stub = Offload(std::move(job.message), job.peers, job.route, &stripe);
      if (!Issue(std::move(job), std::move(stub), stripe)) return;
    }
  }

  // Hands a prepared send to the inner transport once every send queued
  // before it was; false when the transport stopped first (the send is
  // then cancelled).
  bool Issue(SendJob job, Result<Message> stub, int stripe) {
    // Adaptive over several streams: an inline message says how many it
    // takes (1, or K when the router stripes it).
    if (stub.ok() && router_ && hybrid_.stripe_streams > 1 &&
        !stub->params.count(kHybridKeyParam)) {
      stub->params[kStripeParam] = static_cast<int64_t>(stripe);
    }
    // Hand stubs to the inner transport in submission order, so per-peer
    // order holds although uploads run in parallel.
    {
      std::unique_lock<std::mutex> lock(mu_);
      turn_cv_.wait(lock, [&] { return stopped_ || next_issue_ == job.seq; });
      if (stopped_) {
        lock.unlock();
        job.done(Cancelled("transport stopped during the upload"));
        return false;
      }
    }
    if (stub.ok()) SendGrants(job.peers);
    if (router_) {
      job.done = [this, peers = job.peers, done = std::move(job.done)](const Status& s) {
        done(s);
        if (s.ok()) MaybePing(peers);
      };
    }
    if (!stub.ok()) {
      job.done(stub.status());
    } else if (job.broadcast) {
      inner_->BroadcastAsync(job.peers, std::move(stub).value(), std::move(job.done));
    } else {
      SendCallback done = TimeInlineSend(job.peers[0], *stub, stripe, std::move(job.done));
      inner_->SendAsync(job.peers[0], std::move(stub).value(), std::move(done));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++next_issue_;
    }
    turn_cv_.notify_all();
    return true;
  }

  // The route of a send when it is known without waiting or uploading:
  // by the threshold, inline when no tensor reaches it (larger ones are
  // for a worker: Offload); adaptive, the router's choice once the probes
  // the message would wait for are settled.
  std::optional<Route> RouteNow(const Message& m, const std::vector<int32_t>& peers) {
    if (!connector_ && peers.size() != 1) return Route{};  // no storage access: inline
    if (!router_) {
      for (const auto& [name, t] : m.tensors) {
        if (t.nbytes() > 0 && t.nbytes() >= hybrid_.threshold_bytes) return std::nullopt;
      }
      return Route{};
    }
    return ChooseRoute(m, peers, /*wait=*/false);
  }

  // Moves big tensors to the connector (once per content) and returns the
  // stub that crosses the control plane. `route`, when decided already
  // (RouteNow), says where the payload goes; adaptive, it is decided here
  // otherwise, after the probes it waits for. *stripe is the streams an
  // inline send takes.
  Result<Message> Offload(Message m, const std::vector<int32_t>& peers, std::optional<Route> route,
                          int* stripe) {
    const size_t receivers = peers.size();
    if (!connector_ && receivers != 1) return m;  // no storage access: inline
    if (router_ && !route) route = ChooseRoute(m, peers, /*wait=*/true);
    if (route) *stripe = route->stripe;
    if (route && !route->store) return m;
    // Adaptive: all of the payload goes to the store.
    const uint64_t threshold = route ? 1 : hybrid_.threshold_bytes;
    TensorMap big;
    for (auto it = m.tensors.begin(); it != m.tensors.end();) {
      if (it->second.nbytes() > 0 && it->second.nbytes() >= threshold) {
        big.insert(m.tensors.extract(it++));
      } else {
        ++it;
      }
    }
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
    if (DebugLog()) {
      std::cerr << "xsilo " << name_ << " rank " << rank()
                << ": hashing first: the payload's Buffers are those of an object still stored\n";
    }
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

  // Offload of bytes not seen before (no stored object came from where they
  // live): the upload and the hash run at once, the hash on a thread of its
  // own (the uploader waits on its I/O, or, into a local directory, takes
  // one core while the other would idle), instead of hashing first (8 ms
  // for Big on 2 threads). The content is looked up afterwards: if another
  // send stored the same bytes meanwhile, its object is reused and ours
  // evicted.
  Result<Message> OffloadNew(Message m, Prepared prepared, const std::string& identity,
                             size_t receivers) {
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

  struct Stored {
    Key key;
    std::string url;  // presigned GET, when the connector can presign
  };

  // An uploaded object: where it is, its stub's block checksums, and the
  // Buffers it came from, found by id (acks) and by identity (Offload).
  void KeepLocked(const std::shared_ptr<Object>& obj, Stored stored, std::string blocks,
                  const std::string& identity) {
    obj->key = std::move(stored.key);
    obj->url = std::move(stored.url);
    obj->blocks = std::move(blocks);
    obj->identity = identity;
    objects_by_id_[obj->key.id] = obj;
    objects_by_identity_[identity] = obj;
  }

  // Puts `bytes` into the connector and presigns a GET for receivers without
  // storage access; on failure nothing is left stored.
  // Adaptive: its time (the store path's write leg) goes to the router.
  Result<Stored> PutObject(const GatherList& bytes) {
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
      if (DebugLog()) {
        std::cerr << "xsilo " << name_ << " rank " << rank() << ": stored " << bytes.size
                  << " bytes in " << seconds * 1e3 << " ms\n";
      }
    }
    return out;
  }

  // Turns `m` into the stub of an object: what a receiver fetches and checks.
  static void MakeStub(Message* m, const Key& key, uint64_t checksum, const std::string& blocks,
                       const std::string& url) {
    m->params[kHybridKeyParam] = key.ToJson();
    m->params[kHybridChecksumParam] = static_cast<int64_t>(checksum);
    m->params[kHybridBlocksParam] = blocks;
    if (!url.empty()) m->params[kHybridUrlParam] = url;
  }

  // Adaptive: the whole payload goes inline or to the store as the router
  // picks from the receivers' links. A message that would wait for their
  // probes (or echoes) waits with `wait`, else has no route yet (nullopt;
  // a worker routes it then).
  // The caller has sent a broadcast of a party without storage access
  // inline already (RouteNow, Offload).
  std::optional<Route> ChooseRoute(const Message& m, const std::vector<int32_t>& peers, bool wait) {
    const uint64_t bytes = m.payload_bytes();
    // An echo goes ahead of a small message only; after a big one it goes
    // when the send completes (Issue): queued ahead of a Large message on
    // loopback, an echo made that message ~350 ms slower (docs/auto.md).
    if (bytes < AutoRouter::kProbeMinBytes) MaybePing(peers);
    if (bytes == 0) return Route{};
    bool store = connector_ != nullptr;
    if (!store) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = grants_.find(peers[0]);
      store = it != grants_.end() && !it->second.empty();
    }
    if (bytes >= AutoRouter::kProbeMinBytes) {
      const std::vector<int32_t> probed = router_->ProbeSet(peers);
      const auto start = Clock::now();
      for (int32_t p : router_->WantProbe(probed)) StartProbe(p);
      if (!wait) {
        if (!router_->Settled(peers)) return std::nullopt;
      } else {
        router_->WaitSettled(peers);  // ProbeSet again at every echo
      }
      const double waited = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (DebugLog() && waited >= 1) {
        std::cerr << "xsilo " << name_ << " rank " << rank() << ": waited " << waited
                  << " ms for the probes or echoes of " << probed.size() << " of " << peers.size()
                  << " receivers\n";
      }
    }
    AutoChoice c = router_->Choose(peers, bytes, store);
    if (DebugLog()) {
      std::cerr << "xsilo " << name_ << " rank " << rank() << " -> "
                << (peers.size() == 1 ? "rank " + std::to_string(peers[0])
                                      : std::to_string(peers.size()) + " ranks")
                << ": " << c.reason << "\n";
    }
    Route r;
    r.store = c.path == AutoPath::kStore;
    r.stripe = c.path == AutoPath::kStriped ? c.streams : 1;
    return r;
  }

  static AutoPolicyOptions StripePolicy(int max_streams) {
    AutoPolicyOptions o;
    o.max_streams = std::max(max_streams, 1);
    return o;
  }

  // Echoes to the peers whose link is to be measured (again).
  void MaybePing(const std::vector<int32_t>& peers) {
    const auto now = Clock::now();
    for (int32_t p : peers) {
      if (!router_->WantsPing(p, now)) continue;
      router_->PingSent(p, now);
      Message ping;
      ping.type = kPingType;
      ping.params["t"] = NowNs();
      inner_->SendAsync(p, std::move(ping), [this, p](const Status& s) {
        if (DebugLog() && !s.ok())
          std::cerr << "xsilo " << name_ << " rank " << rank() << ": echo to rank " << p
                    << " not sent: " << s.ToString() << "\n";
      });
    }
  }

  // Adaptive: queues the probe of `peer` for the prober thread. It waits
  // for deliveries and acks, which must not hold up a send worker; and it
  // probes one peer at a time, so that probes do not share the sender's
  // link (or its memory: one probe's buffers at a time).
  void StartProbe(int32_t peer) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopped_) {
        probe_queue_.push_back(peer);
        if (!prober_.joinable()) prober_ = std::thread([this] { ProbeLoop(); });
        probe_cv_.notify_all();
        return;
      }
    }
    router_->ProbeDone(peer);
  }

  void ProbeLoop() {
    for (;;) {
      int32_t peer;
      {
        std::unique_lock<std::mutex> lock(mu_);
        probe_cv_.wait(lock, [&] { return stopped_ || !probe_queue_.empty(); });
        if (stopped_) break;
        peer = probe_queue_.front();
        probe_queue_.pop_front();
      }
      ProbeLink(peer);
      router_->ProbeDone(peer);
    }
    std::deque<int32_t> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      left.swap(probe_queue_);
    }
    for (int32_t peer : left) router_->ProbeDone(peer);
  }

  // One inline send, then (with storage access) one store transfer, each
  // of fresh bytes; their times go to the router like any transfer's. The
  // inline one follows an unmeasured warm-up send: the first bytes on a
  // fresh connection pay for its flow-control windows and the receiver's
  // first buffers, which no later message does.
  // The inline send goes kInlineProbes times and the fastest counts: one
  // slow spell of the machine during a single send read 163-349 MB/s for
  // a stream of ~1000-1700 (docs/auto.md, "The probe").
  void ProbeLink(int32_t peer) {
    if (!SendProbeInline(peer, AutoRouter::kInlineWarmupBytes).ok()) return;
    double fastest = std::numeric_limits<double>::infinity();
    for (int i = 0; i < AutoRouter::kInlineProbes; ++i) {
      auto seconds = SendProbeInline(peer, AutoRouter::kInlineProbeBytes);
      if (!seconds.ok()) return;
      if (DebugLog()) {
        std::cerr << "xsilo " << name_ << " rank " << rank() << " -> rank " << peer
                  << ": inline probe of " << AutoRouter::kInlineProbeBytes << " bytes took "
                  << *seconds * 1e3 << " ms\n";
      }
      fastest = std::min(fastest, *seconds);
    }
    router_->OnTransfer(peer, AutoRouter::kInlineProbeBytes, fastest, 1);
    if (connector_ && !stopping()) ProbeStore(peer);
  }

  // Seconds from handing `bytes` to the inner transport (one stream) to the
  // peer's delivery confirmation.
  Result<double> SendProbeInline(int32_t peer, uint64_t bytes) {
    XSILO_ASSIGN_OR_RETURN(Message probe, ProbeMessage(bytes));
    if (hybrid_.stripe_streams > 1) probe.params[kStripeParam] = int64_t{1};
    auto sent = std::make_shared<std::promise<Status>>();
    auto delivered = sent->get_future();
    const auto start = Clock::now();
    inner_->SendAsync(peer, std::move(probe), [sent](const Status& s) { sent->set_value(s); });
    // The inner transport reports every send, at the latest when it stops.
    XSILO_RETURN_IF_ERROR(delivered.get());
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  // The store probe: an object uploaded for `peer` alone, whose fetch the
  // peer reports in its ack (OnAck feeds the router and evicts it).
  void ProbeStore(int32_t peer) {
    auto probe = ProbeMessage(AutoRouter::kStoreProbeBytes);
    if (!probe.ok()) return;
    Prepared prepared = Prepare(probe->tensors);
    const EncodedPayload& payload = prepared.payload;
    auto stored = PutObject(payload.bytes);
    if (!stored.ok()) return;
    const Key& key = stored->key;
    auto obj = std::make_shared<Object>();
    obj->key = key;
    obj->pending_acks = 1;
    obj->last_use = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      objects_by_id_[key.id] = obj;
      probes_out_.insert(key.id);
    }
    Message stub;
    stub.type = kProbeType;
    MakeStub(&stub, key, payload.checksum, prepared.blocks, stored->url);
    inner_->SendAsync(peer, std::move(stub), [](const Status&) {});
    std::unique_lock<std::mutex> lock(mu_);
    probe_cv_.wait_for(lock, kStoreProbeTimeout,
                       [&] { return stopped_ || probes_out_.count(key.id) == 0; });
    if (probes_out_.count(key.id) == 0) return;  // fetched: the ack evicted it
    // Not fetched (the peer failed, or we stop): the object is ours to drop.
    probes_out_.erase(key.id);
    if (objects_by_id_.erase(key.id) == 0) return;  // the reaper took it
    lock.unlock();
    (void)connector_->Evict(key);
  }

  // A probe of `bytes` fresh bytes (their first 8 are a nonce: a store probe
  // must not be taken for an earlier object of the same content).
  Result<Message> ProbeMessage(uint64_t bytes) {
    XSILO_ASSIGN_OR_RETURN(Tensor t, Tensor::Zeros(DType::kU8, {static_cast<int64_t>(bytes)}));
    const int64_t nonce = NowNs();
    std::memcpy(t.data.mutable_data(), &nonce, std::min<uint64_t>(sizeof nonce, bytes));
    Message m;
    m.type = kProbeType;
    m.tensors.emplace("probe", std::move(t));
    return m;
  }

  // Adaptive: a send handed to the inner transport inline reports its time
  // (to the peer's delivery confirmation) as a one-stream transfer.
  SendCallback TimeInlineSend(int32_t peer, const Message& stub, int streams, SendCallback done) {
    if (!router_ || stub.params.count(kHybridKeyParam)) return done;
    const uint64_t bytes = stub.payload_bytes();
    const auto start = Clock::now();
    return [this, peer, bytes, start, streams, done = std::move(done)](const Status& s) {
      if (s.ok()) {
        router_->OnTransfer(peer, bytes,
                            std::chrono::duration<double>(Clock::now() - start).count(), streams);
      }
      done(s);
    };
  }

  // A party without storage access: upload through a grant from `peer`, or
  // put the tensors back inline when it holds none (or the upload fails).
  Message OffloadThroughGrant(Message m, TensorMap big, int32_t peer) {
    std::optional<Grant> grant;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& held = grants_[peer];
      while (!held.empty() && !grant) {
        if (held.front().usable_until > Clock::now()) grant = held.front();
        held.pop_front();
      }
    }
    if (grant) {
      Prepared prepared = Prepare(big);
      const EncodedPayload& payload = prepared.payload;
      Status put;
      const auto start = Clock::now();
      if (grant->part_urls.empty()) {
        put = HttpPutUrl(grant->url, payload.bytes, std::chrono::minutes(10),
                         UrlTlsOptions{.ca_file = hybrid_.url_ca_file});
      } else {
        UrlUploadArgs up;
        up.part_urls = grant->part_urls;
        up.complete_url = grant->complete_url;
        up.body = payload.bytes;
        up.connections = hybrid_.url_connections;
        up.tls.ca_file = hybrid_.url_ca_file;
        put = HttpPutUrlParts(up).status();
      }
      if (put.ok() && router_) {
        router_->OnTransfer(peer, payload.bytes.size,
                            std::chrono::duration<double>(Clock::now() - start).count(),
                            grant->part_urls.empty() ? 1 : hybrid_.url_connections);
      }
      if (put.ok()) {
        Key key = grant->key;
        key.size = payload.bytes.size;
        MakeStub(&m, key, payload.checksum, prepared.blocks, "");
        return m;
      }
      std::cerr << "xsilo " << name_ << ": upload through a grant of rank " << peer
                << " failed, sending inline: " << put.ToString() << "\n";
    }
    for (auto& [name, t] : big) m.tensors.insert_or_assign(name, std::move(t));
    return m;
  }

  bool IssuesGrants() const {
    return hybrid_.grant_uploads && connector_ && connector_->presigned();
  }

  // True when a send to `peers` would grant one of them a fresh upload key.
  bool GrantsDueLocked(const std::vector<int32_t>& peers) {
    if (!IssuesGrants()) return false;
    for (int32_t p : peers) {
      if (issued_per_peer_[p] < kGrantsPerPeer) return true;
    }
    return false;
  }

  // Grants each peer that holds fewer than kGrantsPerPeer a fresh upload key.
  // Sent ahead of the message, on the same ordered channel.
  void SendGrants(const std::vector<int32_t>& peers) {
    if (!IssuesGrants()) return;
    for (int32_t p : peers) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (issued_per_peer_[p] >= kGrantsPerPeer) continue;
      }
      auto key = connector_->NewKey();
      if (!key.ok()) return;
      Message g;
      g.type = kGrantType;
      g.params["key"] = key->ToJson();
      std::string upload_id;
      // Several connections: a multipart grant, so the upload runs in
      // parallel like the downloads do.
      auto multi = hybrid_.url_connections > 1
                       ? connector_->presigned()->PresignMultipartPut(*key, hybrid_.url_connections,
                                                                      hybrid_.presign_expiry)
                       : Result<PresignedAccess::MultipartGrant>(Unimplemented("one connection"));
      if (multi.ok()) {
        upload_id = multi->upload_id;
        std::string parts;
        for (const auto& u : multi->part_urls) parts += (parts.empty() ? "" : "\n") + u;
        g.params["parts"] = parts;
        g.params["complete"] = multi->complete_url;
      } else {
        auto url = connector_->presigned()->PresignPut(*key, hybrid_.presign_expiry);
        if (!url.ok()) return;
        g.params["url"] = *url;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        issued_[key->id] = {p, *key, upload_id, Clock::now() + hybrid_.presign_expiry};
        ++issued_per_peer_[p];
      }
      g.params["expires_s"] = static_cast<int64_t>(hybrid_.presign_expiry.count());
      inner_->SendAsync(p, std::move(g), [](const Status&) {});
    }
  }

  // An issued grant is done with (used, lapsed, or the transport stops): its
  // object goes, and so do the parts of a multipart upload never completed.
  void DropIssued(const Issued& g) {
    (void)connector_->Evict(g.key);
    if (!g.upload_id.empty()) (void)connector_->presigned()->AbortMultipartPut(g.key, g.upload_id);
  }

  void OnGrant(const Message& m) {
    auto key_json = m.GetString("key");
    auto expires = m.GetInt("expires_s");
    if (!key_json.ok() || !expires.ok()) return;
    auto key = Key::FromJson(*key_json);
    if (!key.ok()) return;
    Grant grant{*key, {}, {}, {}, {}};
    if (auto url = m.GetString("url"); url.ok()) {
      grant.url = *url;
    } else {
      auto parts = m.GetString("parts");
      auto complete = m.GetString("complete");
      if (!parts.ok() || !complete.ok() || parts->empty() || complete->empty()) return;
      for (size_t a = 0; a <= parts->size();) {
        size_t b = std::min(parts->find('\n', a), parts->size());
        grant.part_urls.push_back(parts->substr(a, b - a));
        a = b + 1;
      }
      grant.complete_url = *complete;
    }
    // Keep a margin for the upload itself and for clock drift.
    auto life = std::chrono::seconds(*expires);
    auto until = Clock::now() + life - std::min<Clock::duration>(life / 4, std::chrono::minutes(1));
    std::lock_guard<std::mutex> lock(mu_);
    grant.usable_until = until;
    auto& held = grants_[m.sender];
    held.push_back(std::move(grant));
    while (held.size() > 2 * kGrantsPerPeer) held.pop_front();
  }

  // Caller holds mu_. True when `id` is a grant this party issued (now used).
  bool TakeIssued(const std::string& id, Issued* issued) {
    auto it = issued_.find(id);
    if (it == issued_.end()) return false;
    *issued = it->second;
    --issued_per_peer_[it->second.peer];
    issued_.erase(it);
    return true;
  }

  void OnAck(const Message& m) {
    auto id = m.GetString("id");
    if (!id.ok()) return;
    auto bytes = m.GetInt(kAckFetchBytes);
    auto us = m.GetInt(kAckFetchUs);
    auto streams = m.GetInt(kAckFetchStreams);
    if (router_ && bytes.ok() && us.ok() && streams.ok() && *bytes > 0 && *us > 0) {
      router_->OnTransfer(m.sender, static_cast<uint64_t>(*bytes), static_cast<double>(*us) * 1e-6,
                          static_cast<int>(std::clamp<int64_t>(*streams, 1, 1024)));
      if (DebugLog()) {
        std::cerr << "xsilo " << name_ << " rank " << rank() << ": rank " << m.sender << " fetched "
                  << *bytes << " bytes from the store in " << *us / 1000.0 << " ms over "
                  << *streams << " connections\n";
      }
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

  // Caller holds mu_.
  void Forget(const std::shared_ptr<Object>& obj) {
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

  // What the inner transport receives, on its delivery thread. Echoes are
  // handled here (OnEcho). A message
  // that is neither a stub nor the backend's own goes to the user at once
  // when nothing received before it waits in the fetch queue (the hop to
  // the fetcher cost a LAN send of the Small tier ~0.3 ms); everything else
  // queues for FetchLoop, in arrival order. Blocking here while the queue
  // (or the user's inbox) is full is the inner senders' backpressure.
  // `abandon` is the inner deliverer's stop test (inproc: the sender's).
  Status OnInner(Message m, const std::function<bool()>& abandon) {
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

  // An echo is answered (ping) or timed (pong) as it arrives, on the inner
  // transport's delivery thread: it measures the link, and it has no place
  // in the order of the messages. Queued behind a fetch, as it once was,
  // the ping that follows a store message waited for that message's fetch:
  // 382-489 ms on geo-proximal Big (a 1.6-1.9 ms link), 1.2 s on ca-hk Big
  // and 5.4 s on ca-hk Large (167 ms; results/p2p-auto-all-v9/logs). Three
  // such round trips in a row fill the router's window (kRttWindow) and
  // read as the link slowing down.
  void OnEcho(const Message& m) {
    if (stopping()) return;
    if (m.type == kPingType) {
      Message pong;
      pong.type = kPongType;
      pong.params = m.params;
      inner_->SendAsync(m.sender, std::move(pong), [](const Status&) {});
      return;
    }
    auto t = m.GetInt("t");
    if (!router_ || !t.ok()) return;
    const int64_t ns = NowNs() - *t;
    if (DebugLog())
      std::cerr << "xsilo " << name_ << " rank " << rank() << ": echo from rank " << m.sender
                << " in " << static_cast<double>(ns) * 1e-6 << " ms\n";
    router_->OnRtt(m.sender, static_cast<double>(ns) * 1e-9);
    MaybePing({m.sender});  // the start's echoes go back to back
    if (router_->ProbeDue(m.sender)) StartProbe(m.sender);
  }

  // Reads the fetch queue (OnInner), counts acks, rebuilds stubs and
  // delivers them in arrival order.
  void FetchLoop() {
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
        std::cerr << "xsilo " << name_ << ": dropping message from rank " << m.sender << ": "
                  << s.ToString() << "\n";
        continue;
      }
      int32_t sender = m.sender;
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
        inner_->SendAsync(sender, std::move(ack), [](const Status&) {});
      }
    }
  }

  // A network fetch by URL, for the sender's link estimate.
  struct FetchReport {
    uint64_t bytes = 0;
    int64_t micros = 0;
    int streams = 0;
  };

  // Fetches the offloaded tensors of a stub back into it.
  Status Restore(Message* m, std::string* key_id, FetchReport* report = nullptr) {
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
      std::cerr << "xsilo " << name_ << ": fetching again (attempt " << attempt + 1 << " of "
                << kFetchAttempts << "): " << object.status().ToString() << "\n";
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

  struct Blocks {
    uint64_t block_bytes = 0;
    std::vector<uint64_t> sums;
  };

  // One fetch of a stub's object, with the connector or by its URL (which
  // checks the bytes against `blocks` as they arrive).
  Result<Buffer> Fetch(const Message& m, const Key& key, const Blocks& blocks) {
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
      if (!fetched.ok() && fetched.status().code() != StatusCode::kNotFound)
        return fetched.status();
      if (fetched.ok()) object = std::move(fetched->data);
    }
    if (!object) return NotFound("object " + key.id + " is gone (evicted or expired)");
    return std::move(*object);
  }

  void ReapLoop() {
    const auto tick = std::min<Clock::duration>(hybrid_.ttl / 4, std::chrono::seconds(1));
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_cv_.wait_for(lock, tick, [&] { return stopped_; })) {
      std::vector<std::shared_ptr<Object>> expired;
      auto now = Clock::now();
      for (const auto& [id, obj] : objects_by_id_) {
        if (now - obj->last_use > hybrid_.ttl) expired.push_back(obj);
      }
      for (const auto& obj : expired) Forget(obj);
      std::vector<Issued> lapsed;
      for (auto it = issued_.begin(); it != issued_.end();) {
        if (now > it->second.expires) {
          lapsed.push_back(it->second);
          --issued_per_peer_[it->second.peer];
          it = issued_.erase(it);
        } else {
          ++it;
        }
      }
      lock.unlock();
      for (const auto& obj : expired) (void)connector_->Evict(obj->key);
      for (const auto& g : lapsed) DropIssued(g);
      if (pool_) pool_->Trim();  // idle download buffers past their 5 s
      lock.lock();
    }
  }

  bool stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return stopped_;
  }

  void NotifyAll() {
    work_cv_.notify_all();
    turn_cv_.notify_all();
    probe_cv_.notify_all();
    stop_cv_.notify_all();
  }

  const std::shared_ptr<void> keepalive_;  // destroyed last
  const std::unique_ptr<Transport> inner_;
  const std::shared_ptr<Connector> connector_;
  const HybridOptions hybrid_;
  const std::string name_;

  std::mutex mu_;
  // One per kind of waiter, so that a send wakes one worker and nothing
  // else: workers wait for jobs (work_cv_) and for their turn to hand a
  // stub to the inner transport (turn_cv_), the prober for probes and
  // their acks (probe_cv_), the reaper only for Stop (stop_cv_).
  std::condition_variable work_cv_, turn_cv_, probe_cv_, stop_cv_;
  // Received messages for FetchLoop (OnInner), bounded like an inbox.
  Inbox fetch_queue_{options_.receive_queue_capacity};
  // Orders OnInner's direct deliveries after the queued messages.
  std::mutex order_mu_;
  uint64_t fetch_pending_ = 0;  // queued or in FetchLoop, not yet done with
  bool started_ = false, stopped_ = false;
  std::deque<SendJob> jobs_;
  uint64_t next_seq_ = 0, next_issue_ = 0;
  std::map<std::string, std::shared_ptr<Object>> objects_by_content_;
  // Where each stored object's bytes came from (IdentityOf).
  std::map<std::string, std::shared_ptr<Object>> objects_by_identity_;
  std::map<std::string, std::shared_ptr<Object>> objects_by_id_;
  std::map<int32_t, std::deque<Grant>> grants_;  // received, by granting rank
  std::map<std::string, Issued> issued_;         // issued, by key id
  std::map<int32_t, size_t> issued_per_peer_;
  std::set<std::string> probes_out_;  // store probes awaiting their ack, by key id
  std::vector<std::thread> workers_;
  std::deque<int32_t> probe_queue_;  // peers to probe (adaptive)
  std::thread prober_;
  std::thread fetcher_, reaper_;
  const std::unique_ptr<AutoRouter> router_;  // adaptive only
  const std::shared_ptr<BufferPool> pool_;    // downloads by URL; null if recycle_bytes=0
};

}  // namespace

std::shared_ptr<Connector> HybridConnectorOf(const Transport& transport) {
  const auto* hybrid = dynamic_cast<const HybridTransport*>(&transport);
  return hybrid == nullptr ? nullptr : hybrid->connector();
}

std::unique_ptr<Transport> MakeHybridTransport(const TransportOptions& options,
                                               std::unique_ptr<Transport> inner,
                                               std::shared_ptr<Connector> connector,
                                               HybridOptions hybrid, std::string connector_type,
                                               std::shared_ptr<void> keepalive) {
  return std::make_unique<HybridTransport>(options, std::move(inner), std::move(connector), hybrid,
                                           std::move(connector_type), std::move(keepalive));
}

}  // namespace xsilo
