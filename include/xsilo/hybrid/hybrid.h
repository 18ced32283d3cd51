// Hybrid backends: any transport plus any connector ("pass by proxy").
//
// Tensors at or above a size threshold are written once to the connector as
// one safetensors object; the Message that crosses the control plane
// carries its Key instead. Receivers fetch the object, verify its checksum,
// and see the original Message (metadata and tensors together). A payload
// sent again, or broadcast, is uploaded once (content hash -> key). Objects
// are evicted when every intended receiver has confirmed, or after a TTL.
//
// Registered as "<transport>+<connector>" (grpc+s3, inproc+file, ...). In
// TransportOptions::backend, keys starting with "store." configure the
// connector (store.dir, store.port, ...; see each connector); the keys below
// configure the hybrid layer; every other key goes to the inner transport.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "xsilo/core/option_table.h"
#include "xsilo/store/connector.h"
#include "xsilo/transport/transport.h"

namespace xsilo {

// Which tensors of a message travel through the connector.
enum class Offload {
  kThreshold,  // those of at least threshold_bytes (backend key "threshold=N")
  kAlways,     // every tensor ("threshold=always")
  kNever,      // none: every message inline ("threshold=never")
  kAdaptive,   // the backend "auto+<connector>": the router picks per message
};

struct HybridOptions {
  // Backend key "threshold": bytes, or "always" / "never" (offload below).
  // A tensor of at least this many bytes travels through the connector.
  // Default 10 MiB, the paper's guideline.
  uint64_t threshold_bytes = 10ull << 20;
  // Backend key "ttl_ms": an object not confirmed by all its receivers is
  // evicted this long after its upload. Default 10 minutes.
  std::chrono::milliseconds ttl = std::chrono::minutes(10);
  // Backend key "workers": threads that prepare and upload sends. Default 2.
  int workers = 2;
  // Backend key "presign_s": when the connector can presign (s3), stubs
  // carry a GET URL valid this long, so receivers need no credentials.
  // 0 turns it off. Default 3600 s.
  std::chrono::seconds presign_expiry{3600};
  // Backend key "connections": parallel connections a party without
  // storage access uses for presigned transfers: ranged GETs of an object
  // (ranges of at least 1 MiB, or 64 KiB across a long link:
  // UrlMinRangeBytes) and the parts of a grant upload (at least
  // min_part_bytes each). On a long link one TCP connection is
  // window-bound, so filling it takes many. Default 32.
  int url_connections = 32;
  // Backend key "min_part_bytes": the smallest part (but the last) of a
  // multipart upload that the store accepts. Grants carry it, so a
  // credential-less party cuts an upload into up to url_connections parts
  // of at least this size. Default 5 MiB (S3's rule); the embedded object
  // server accepts 64 KiB (EmbeddedS3::kMinPartBytes), and is told so,
  // so that a compressed update of a few MB still goes up over every
  // connection rather than a handful.
  uint64_t min_part_bytes = 5ull << 20;
  // Store key "ca_file": PEM roots that verify an https object server for
  // the presigned transfers (the connector takes the same key). Default "":
  // the system's.
  std::string url_ca_file;
  // Backend key "grants" (0|1): a party whose connector can presign attaches
  // to each message it sends an upload grant per receiver (a fresh key and
  // presigned multipart part URLs, or one PUT URL). A receiver without storage access uploads its
  // next big send to that party through the grant instead of sending it inline. Default 0; on
  // whenever the embedded object server is used. A compressed message goes
  // up through a multipart grant while it is encoded (compression.stream,
  // docs/compression.md "Streamed uploads").
  bool grant_uploads = false;
  // kThreshold uses threshold_bytes. kAdaptive, the backend
  // "auto+<connector>" (docs/auto.md): each message goes inline or through
  // the connector as ChooseAutoPath picks from the measured link to its
  // receivers (echo round trips at start and when the link changes, the
  // time of inline sends, store transfers reported back by receivers);
  // RouteReason() says why. Default kThreshold.
  Offload offload = Offload::kThreshold;
  // The least size of a tensor that travels through the connector:
  // threshold_bytes, 0 for kAlways, UINT64_MAX for kNever. REQUIRES: not
  // kAdaptive (the router decides).
  uint64_t store_threshold() const {
    return offload == Offload::kAlways  ? 0
           : offload == Offload::kNever ? UINT64_MAX
                                        : threshold_bytes;
  }
  // Adaptive: the most streams a striped send uses, the inner grpc's
  // `streams` (set by the registry from that key). Each message carries
  // its own stripe (kStripeParam): 1 inline, K striped. 1 = never striped.
  // Default 1.
  int stripe_streams = 1;
  // Backend key "recycle_bytes": idle storage of objects downloaded by URL
  // kept for reuse (core BufferPool, 5 s), so that a receiver of one big
  // model after another does not fault in and zero fresh memory for each.
  // Over grpc the key also sets grpc's own pool. 0 turns it off.
  // Default 2 GiB, as grpc's.
  uint64_t recycle_bytes = 2ull << 30;
};

// Wraps `inner` (not yet started) and `connector`. A null connector makes a
// party without storage access: it sends everything inline and fetches
// offloaded tensors through the presigned URLs in the stubs it receives.
// `keepalive` is held until the transport is destroyed (e.g. an embedded
// object server).
std::unique_ptr<Transport> MakeHybridTransport(const TransportOptions& options,
                                               std::unique_ptr<Transport> inner,
                                               std::shared_ptr<Connector> connector,
                                               HybridOptions hybrid,
                                               std::string connector_type = "",
                                               std::shared_ptr<void> keepalive = nullptr);

// The connector of a hybrid transport (its config() names the store and,
// for s3, the access key but not the secret); nullptr for a party without
// storage access or a transport that is not hybrid. For tools and tests
// that inspect the store.
std::shared_ptr<Connector> HybridConnectorOf(const Transport& transport);

// Installs the "<transport>+<connector>" composite factory in the global
// transport registry. Called automatically when the hybrid library is
// linked; calling it again is harmless.
void RegisterHybridTransports();
// The keys of <transport>+<connector> the hybrid reads itself (store.* keys
// but the embedded object server's and store.ca_file are the connector's).
const OptionTable& HybridOptionTable();

// Parameter names a hybrid stub carries (documented in docs/hybrid.md).
inline constexpr const char* kHybridKeyParam = "xsilo.hybrid.key";
// The object's checksum: the BlockDigest of its block checksums. (Named
// "xsilo.hybrid.xxh3", the XXH3-64 of the whole object, before block
// checksums: a receiver of that version refuses a stub of this one at once
// as "without key or checksum", not after three fetches.)
inline constexpr const char* kHybridChecksumParam = "xsilo.hybrid.digest";
inline constexpr const char* kHybridUrlParam = "xsilo.hybrid.url";
// "<block bytes>:<16 hex digits per block>": the XXH3-64 of each block of
// the object (core BlockChecksums); kHybridChecksumParam is then their
// BlockDigest.
inline constexpr const char* kHybridBlocksParam = "xsilo.hybrid.blocks";
// Prefix of the upload grant for rank r: "xsilo.hybrid.grant.<r>" = JSON
// {"key": <Key JSON>, "url": <presigned PUT URL>}.
inline constexpr const char* kHybridGrantPrefix = "xsilo.hybrid.grant.";
inline constexpr const char* kHybridAckType = "xsilo.hybrid.ack";

}  // namespace xsilo
