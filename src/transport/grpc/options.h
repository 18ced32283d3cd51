// Backend options of the grpc transport (TransportOptions::backend), parsed
// and validated once through GrpcOptionTable() (transport/builtin.h), which holds every key's
// default, range and doc line (docs/backend-options.md is made from it).
// The defaults below are the table's.
#pragma once

#include <cstdint>
#include <string>

#include "xsilo/transport/transport.h"

namespace xsilo::grpclink {

struct GrpcOptions {
  // "stream" (default): chunked frames over a client-initiated bidi stream.
  // "unary": one unary call per message carrying the whole frame (baseline).
  std::string mode = "stream";
  // Bytes of message per Chunk frame. Default 1 MiB; 1 KiB .. 64 MiB. Chunks
  // are sent from the message's own Buffers (wire.h). With streams=N each
  // stream sends chunks of chunk_bytes / N (at least 64 KiB).
  uint64_t chunk_bytes = 1ull << 20;
  // Bytes a sender may have sent to one peer that the peer has not yet
  // consumed. Default 32 MiB; at least 1 (a chunk may exceed it when alone).
  uint64_t window_bytes = 32ull << 20;
  // Bytes of finished messages' buffers a receiver keeps for reuse after
  // the messages were dropped, so that the next large message lands in
  // memory that is already faulted in (core BufferPool; only messages of
  // 8 MiB and more; idle buffers are unmapped after 5 s). Default 2 GiB,
  // one Large-tier model (1.23 GB);
  // 0 = every buffer goes back to the kernel at once.
  uint64_t recycle_bytes = 2ull << 30;
  // Parallel channels (each with its own stream and TCP connection) that a
  // client opens to the server; large messages are striped over them.
  // Default 1 (the paper's single-channel baseline); 1 .. 64.
  int streams = 1;
  // TLS: PEM file paths. Server: tls_cert + tls_key enable TLS; tls_ca
  // additionally requires and verifies client certificates (mutual TLS).
  // Client: tls_ca enables TLS and verifies the server; tls_cert + tls_key
  // present a client certificate. Default empty (plaintext).
  std::string tls_ca, tls_cert, tls_key;
  // Name the client expects in the server certificate. Default: the host of
  // options.address.
  std::string tls_server_name;
  // Shared secret every client must present. Default empty (none).
  std::string token;
  // Interval of HTTP/2 keepalive pings. Default 20000 ms.
  int64_t keepalive_ms = 20000;
  // Reconnect backoff: first delay and cap, doubled per failed attempt with
  // +-20% jitter. Defaults 100 ms and 5000 ms.
  int64_t initial_backoff_ms = 100;
  int64_t max_backoff_ms = 5000;
  // How long Stop waits, at most, for a clean end (docs/transport-grpc.md,
  // "Stop"): every message this party sent gets its outcome from the peer,
  // every delivery confirmation it owes is written, then a Goodbye ends
  // each stream and the peer closes the session. A peer that does not
  // answer in time is cut off as before (pending sends fail with Cancelled,
  // "before peer N confirmed delivery"). Default 5000 ms; 0 = no drain.
  int64_t drain_ms = 5000;

  bool tls() const { return !tls_ca.empty() || !tls_cert.empty() || !tls_key.empty(); }
};

Result<GrpcOptions> ParseGrpcOptions(const TransportOptions& options);

}  // namespace xsilo::grpclink
