// HybridTransport: big tensors through a Connector, the rest (and the
// stubs that name the objects) over an inner transport. The class and what
// its parts share; each part is a file of its own:
//   hybrid_transport.cpp  lifecycle, the send pipeline (queue, workers,
//                         ordered hand-off), the reaper, the factory;
//   hybrid_offload.cpp    offload: upload once per content, dedup by
//                         identity and content, acks' bookkeeping;
//   hybrid_stub.cpp       the stub format: block checksums, content names;
//   hybrid_fetch.cpp      the receiving side: fetch queue, fetch, verify,
//                         deliver, ack;
//   hybrid_grants.cpp     upload grants for parties without storage access;
//   hybrid_probe.cpp      the adaptive backend (auto+<connector>): routes,
//                         echoes and link probes.
//
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
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "hybrid/auto_router.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/log.h"
#include "xsilo/hybrid/hybrid.h"
#include "xsilo/transport/forwarding.h"

namespace xsilo::hybrid_detail {

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
  // A message still being encoded (SendStreamAsync): `message` is empty.
  std::shared_ptr<EncodeStream> stream;
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
  uint64_t min_part_bytes = 5ull << 20;  // the issuer's store's smallest part
  Clock::time_point usable_until;
};

// An upload grant we issued: evicted when used, or once it has expired.
struct Issued {
  int32_t peer;
  Key key;
  std::string upload_id;  // a multipart grant
  Clock::time_point expires;
};

inline constexpr const char* kGrantType = "xsilo.hybrid.grant";
// The adaptive backend's echoes: param "t" is the pinger's clock, ns.
inline constexpr const char* kPingType = "xsilo.auto.ping";
inline constexpr const char* kPongType = "xsilo.auto.pong";
// The adaptive backend's probe of a link before its first payload: bytes sent inline, or a stub of
// an object to fetch; the receiver fetches (and acks) but never delivers it.
inline constexpr const char* kProbeType = "xsilo.auto.probe";

// Steady clock, ns.
int64_t NowNs();
// The hybrid's log lines (xsilo/core/log.h): its choices and transfers at
// debug, what it gives up on at warn.
inline constinit LogComponent kLog("hybrid");

// A payload on its way to the store: its bytes with the digest of their
// block checksums as payload.checksum, and the checksums as the stub's
// kHybridBlocksParam.
struct Prepared {
  EncodedPayload payload;
  std::string blocks;
};

// Moves the tensors of `m` with bytes, `threshold` or more, out into the
// map returned: the object of a send to the store.
TensorMap TakeTensors(Message* m, uint64_t threshold);

// Hashes p->payload (on up to `threads` threads; 0: by the hardware).
void HashPrepared(Prepared* p, int threads = 0);
// Encodes `tensors` (safetensors) and hashes them.
Prepared Prepare(const TensorMap& tensors);
// What names an object's content: its digest and size.
std::string ContentOf(const EncodedPayload& payload);
// Where a safetensors payload's bytes live: its header (made anew for each
// encoding, so by its bytes) and its tensors' addresses and sizes. The same
// identity may hold new content (a tensor changed in place), so it only
// says whether hashing first could find an object to reuse.
std::string IdentityOf(const GatherList& bytes);
// Parses kHybridBlocksParam for an object of `size` bytes whose stub names
// `digest`; Corrupt unless it is well formed and matches both.
Status ParseBlocksParam(const std::string& text, uint64_t size, uint64_t digest,
                        uint64_t* block_bytes, std::vector<uint64_t>* sums);

// What the hybrid keeps alive (the embedded S3 server its connector talks
// to): a base declared before ForwardingTransport, so that it outlives the
// inner transport and every member.
struct KeepAlive {
  std::shared_ptr<void> keepalive_;
};

// A decorator of the inner transport (its stubs, acks, grants and echoes
// go through it). It has both capabilities of its own: it measures its
// links (LinkObserver; adaptive only, else nothing is measured) and takes
// streamed sends through upload grants (StreamSink).
class HybridTransport final : private KeepAlive,
                              public ForwardingTransport,
                              private LinkObserver,
                              private StreamSink {
 public:
  HybridTransport(const TransportOptions& options, std::unique_ptr<Transport> inner,
                  std::shared_ptr<Connector> connector, HybridOptions hybrid,
                  std::string connector_type, std::shared_ptr<void> keepalive)
      : KeepAlive{std::move(keepalive)},
        ForwardingTransport(options, std::move(inner)),
        connector_(std::move(connector)),
        hybrid_(hybrid),
        name_((hybrid.offload == Offload::kAdaptive ? std::string("auto")
                                                    : std::string(this->inner().name())) +
              "+" + (connector_ ? std::string(connector_->type()) : connector_type)),
        router_(hybrid.offload == Offload::kAdaptive
                    ? std::make_unique<AutoRouter>(StripePolicy(hybrid.stripe_streams))
                    : nullptr),
        pool_(hybrid.recycle_bytes > 0
                  ? std::make_shared<BufferPool>(hybrid.recycle_bytes, std::chrono::seconds(5))
                  : nullptr) {}

  ~HybridTransport() override { Stop(); }

  std::string_view name() const override { return name_; }
  const std::shared_ptr<Connector>& connector() const { return connector_; }
  LinkObserver* link_observer() override { return this; }
  StreamSink* stream_sink() override { return this; }

  Status Start() override;
  void Stop() override;
  void SendAsync(int32_t peer, Message message, SendCallback done) override;
  void BroadcastAsync(std::vector<int32_t> peers, Message message, SendCallback done) override;

 private:
  // LinkObserver.
  std::string RouteReason() const override { return router_ ? router_->last_reason() : ""; }
  // The router's figure for sends to `peer`; before any was measured, what
  // our own fetches of the peer's stored objects achieved (our path to the
  // store, which our uploads take too), so that a client's first update is
  // judged by the model it just pulled. 0 when neither exists.
  double MeasuredGoodputBps(int32_t peer) override {
    if (!router_) return 0;
    const LinkEstimate e = router_->EstimateOf(peer);
    const double out = e.samples == 0 ? 0 : std::max({0.0, e.one_stream_Bps, e.aggregate_Bps});
    if (out > 0) return out;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fetched_Bps_.find(peer);
    return it == fetched_Bps_.end() ? 0 : it->second;
  }

  // Adaptive: the router's smoothed echo round trip; < 0 before one.
  double MeasuredRttS(int32_t peer) override;
  // Adaptive, for a message the router would wait for (kProbeMinBytes or
  // more): waits for the receivers' echoes (AutoRouter::WaitEchoes, at
  // most kProbeWait), not for their probes, which the send runs.
  void LearnLink(const std::vector<int32_t>& peers, uint64_t bytes) override;

  // StreamSink.
  // A party without storage access, routed by the router (or with
  // threshold 1), holding a multipart upload grant of `peer`: its
  // compressed update goes up part by part while it is encoded
  // (OffloadStream).
  bool StreamsSends(int32_t peer) override;
  void SendStreamAsync(int32_t peer, std::shared_ptr<EncodeStream> stream,
                       SendCallback done) override;

  Status OnDelivery(Message m, const std::function<bool()>& abandon) override {
    return OnInner(std::move(m), abandon);
  }

  // Queues a send for the workers, or issues it on the caller's thread
  // when that costs nothing: its route is known without waiting, it goes
  // inline, no send is queued or being prepared ahead of it, and it owes
  // no grants (whose multipart presign is a request to the store). A
  // message to a peer then takes the same threads as over the inner
  // transport alone: the hand-off to a worker cost a LAN send of the Small
  // tier ~0.3 ms (docs/auto.md).
  void Enqueue(std::vector<int32_t> peers, bool broadcast, Message message, SendCallback done,
               std::shared_ptr<EncodeStream> stream = nullptr);

  void SendLoop();

  // Hands a prepared send to the inner transport once every send queued
  // before it was; false when the transport stopped first (the send is
  // then cancelled).
  bool Issue(SendJob job, Result<Message> stub, int stripe);

  // The route of a send when it is known without waiting or uploading:
  // by the threshold, inline when no tensor reaches it (larger ones are
  // for a worker: Offload); adaptive, the router's choice once the probes
  // the message would wait for are settled.
  std::optional<Route> RouteNow(const Message& m, const std::vector<int32_t>& peers);

  // Moves big tensors to the connector (once per content) and returns the
  // stub that crosses the control plane. `route`, when decided already
  // (RouteNow), says where the payload goes; adaptive, it is decided here
  // otherwise, after the probes it waits for. *stripe is the streams an
  // inline send takes.
  Result<Message> Offload(Message m, const std::vector<int32_t>& peers, std::optional<Route> route,
                          int* stripe);

  // Offload of bytes not seen before (no stored object came from where they
  // live): the upload and the hash run at once, the hash on a thread of its
  // own (the uploader waits on its I/O, or, into a local directory, takes
  // one core while the other would idle), instead of hashing first (8 ms
  // for Big on 2 threads). The content is looked up afterwards: if another
  // send stored the same bytes meanwhile, its object is reused and ours
  // evicted.
  Result<Message> OffloadNew(Message m, Prepared prepared, const std::string& identity,
                             size_t receivers);

  struct Stored {
    Key key;
    std::string url;  // presigned GET, when the connector can presign
  };

  // An uploaded object: where it is, its stub's block checksums, and the
  // Buffers it came from, found by id (acks) and by identity (Offload).
  void KeepLocked(const std::shared_ptr<Object>& obj, Stored stored, std::string blocks,
                  const std::string& identity);

  // Puts `bytes` into the connector and presigns a GET for receivers without
  // storage access; on failure nothing is left stored.
  // Adaptive: its time (the store path's write leg) goes to the router.
  Result<Stored> PutObject(const GatherList& bytes);

  // Turns `m` into the stub of an object: what a receiver fetches and checks.
  static void MakeStub(Message* m, const Key& key, uint64_t checksum, const std::string& blocks,
                       const std::string& url);

  // Adaptive: the whole payload goes inline or to the store as the router
  // picks from the receivers' links. A message that would wait for their
  // probes (or echoes) waits with `wait`, else has no route yet (nullopt;
  // a worker routes it then).
  // The caller has sent a broadcast of a party without storage access
  // inline already (RouteNow, Offload).
  std::optional<Route> ChooseRoute(const Message& m, const std::vector<int32_t>& peers, bool wait);
  // The same for a payload of `bytes` (a message still being encoded).
  std::optional<Route> ChooseRoute(uint64_t bytes, const std::vector<int32_t>& peers, bool wait);

  static AutoPolicyOptions StripePolicy(int max_streams) {
    AutoPolicyOptions o;
    o.max_streams = std::max(max_streams, 1);
    return o;
  }

  // Echoes to the peers whose link is to be measured (again).
  void MaybePing(const std::vector<int32_t>& peers);

  // Adaptive: queues the probe of `peer` for the prober thread. It waits
  // for deliveries and acks, which must not hold up a send worker; and it
  // probes one peer at a time, so that probes do not share the sender's
  // link (or its memory: one probe's buffers at a time).
  void StartProbe(int32_t peer);

  void ProbeLoop();

  // One inline send, then (with storage access) one store transfer, each
  // of fresh bytes; their times go to the router like any transfer's. The
  // inline one follows an unmeasured warm-up send: the first bytes on a
  // fresh connection pay for its flow-control windows and the receiver's
  // first buffers, which no later message does.
  // The inline send goes kInlineProbes times and the fastest counts: one
  // slow spell of the machine during a single send read 163-349 MB/s for
  // a stream of ~1000-1700 (docs/auto.md, "The probe").
  void ProbeLink(int32_t peer);

  // Seconds from handing `bytes` to the inner transport (one stream) to the
  // peer's delivery confirmation.
  Result<double> SendProbeInline(int32_t peer, uint64_t bytes);

  // The store probe: an object uploaded for `peer` alone, whose fetch the
  // peer reports in its ack (OnAck feeds the router and evicts it).
  void ProbeStore(int32_t peer);

  // A probe of `bytes` fresh bytes (their first 8 are a nonce: a store probe
  // must not be taken for an earlier object of the same content).
  Result<Message> ProbeMessage(uint64_t bytes);

  // Adaptive: a send handed to the inner transport inline reports its time
  // (to the peer's delivery confirmation) as a one-stream transfer.
  SendCallback TimeInlineSend(int32_t peer, const Message& stub, int streams, SendCallback done);
  // A broadcast handed over inline reports its time to the router as the
  // egress its copies shared (AutoRouter::OnInlineBroadcast).
  SendCallback TimeInlineBroadcast(const std::vector<int32_t>& peers, const Message& stub,
                                   SendCallback done);

  // A party without storage access: upload through `grant` (else one
  // taken from `peer`), or put the tensors back inline when it holds none
  // (or the upload fails).
  Message OffloadThroughGrant(Message m, TensorMap big, int32_t peer,
                              std::optional<Grant> grant = std::nullopt);
  // The stub of `big` uploaded through `grant` when `put` succeeded; else
  // `m` with its tensors back inline.
  Message GrantStub(Message m, TensorMap big, const Grant& grant, const Prepared& prepared,
                    const Status& put, int32_t peer);

  // The first usable grant of `peer`, taken; nullopt when none.
  std::optional<Grant> TakeGrant(int32_t peer);
  // Uploads a prepared payload through a grant (its time to the router).
  Status PutThroughGrant(const Grant& grant, const Prepared& prepared, int32_t peer);

  // A send of a message still being encoded (SendStreamAsync): routed by
  // the size the stream expects; through a multipart grant, its parts go
  // up as the encoder appends them (HttpPutUrlStream) and the safetensors
  // header, made once the message is final, last. A stream abandoned, or
  // a final message that is not the bytes streamed, goes through the same
  // grant whole; without a grant, or inline, the message goes the ordinary
  // way once encoded.
  Result<Message> OffloadStream(EncodeStream& stream, int32_t peer, int* stripe);

  bool IssuesGrants() const {
    return hybrid_.grant_uploads && connector_ && connector_->presigned();
  }

  // True when a send to `peers` would grant one of them a fresh upload key.
  bool GrantsDueLocked(const std::vector<int32_t>& peers);

  // Grants each peer that holds fewer than kGrantsPerPeer a fresh upload key.
  // Sent ahead of the message, on the same ordered channel.
  void SendGrants(const std::vector<int32_t>& peers);

  // An issued grant is done with (used, lapsed, or the transport stops): its
  // object goes, and so do the parts of a multipart upload never completed.
  void DropIssued(const Issued& g);

  void OnGrant(const Message& m);

  // Caller holds mu_. True when `id` is a grant this party issued (now used).
  bool TakeIssued(const std::string& id, Issued* issued);

  void OnAck(const Message& m);

  // Caller holds mu_.
  void Forget(const std::shared_ptr<Object>& obj);

  // What the inner transport receives, on its delivery thread. Echoes are
  // handled here (OnEcho). A message
  // that is neither a stub nor the backend's own goes to the user at once
  // when nothing received before it waits in the fetch queue (the hop to
  // the fetcher cost a LAN send of the Small tier ~0.3 ms); everything else
  // queues for FetchLoop, in arrival order. Blocking here while the queue
  // (or the user's inbox) is full is the inner senders' backpressure.
  // `abandon` is the inner deliverer's stop test (inproc: the sender's).
  Status OnInner(Message m, const std::function<bool()>& abandon);

  // An echo is answered (ping) or timed (pong) as it arrives, on the inner
  // transport's delivery thread: it measures the link, and it has no place
  // in the order of the messages. Queued behind a fetch, as it once was,
  // the ping that follows a store message waited for that message's fetch:
  // 382-489 ms on geo-proximal Big (a 1.6-1.9 ms link), 1.2 s on ca-hk Big
  // and 5.4 s on ca-hk Large (167 ms; 908e3fc:results/archive/p2p-auto-all-v9/logs). Three
  // such round trips in a row fill the router's window (kRttWindow) and
  // read as the link slowing down.
  void OnEcho(const Message& m);

  // Reads the fetch queue (OnInner), counts acks, rebuilds stubs and
  // delivers them in arrival order.
  void FetchLoop();

  // A network fetch by URL, for the sender's link estimate.
  struct FetchReport {
    uint64_t bytes = 0;
    int64_t micros = 0;
    int streams = 0;
  };

  // Fetches the offloaded tensors of a stub back into it.
  Status Restore(Message* m, std::string* key_id, FetchReport* report = nullptr);

  struct Blocks {
    uint64_t block_bytes = 0;
    std::vector<uint64_t> sums;
  };

  // One fetch of a stub's object, with the connector or by its URL (which
  // checks the bytes against `blocks` as they arrive).
  Result<Buffer> Fetch(const Message& m, const Key& key, const Blocks& blocks);

  void ReapLoop();

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
  // Goodput of our fetches of each peer's objects (1 MiB or more), the
  // last one's (MeasuredGoodputBps).
  std::map<int32_t, double> fetched_Bps_;
  std::vector<std::thread> workers_;
  std::deque<int32_t> probe_queue_;  // peers to probe (adaptive)
  std::thread prober_;
  std::thread fetcher_, reaper_;
  const std::unique_ptr<AutoRouter> router_;  // adaptive only
  const std::shared_ptr<BufferPool> pool_;    // downloads by URL; null if recycle_bytes=0
};

}  // namespace xsilo::hybrid_detail
