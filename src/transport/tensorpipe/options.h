// Backend options of the tensorpipe transport (TransportOptions::backend),
// parsed and validated once. Every key is documented in
// docs/transport-tensorpipe.md.
#pragma once

#include <cstdint>
#include <string>

#include "xsilo/transport/transport.h"

namespace xsilo::tplink {

struct TensorPipeOptions {
  // "transports": uv (default, TCP) or uv,shm (shared memory when both
  // peers share a host; uv still makes the first contact).
  bool shm = false;
  // "lanes": parallel uv connections of the mpt channel. 1 (default) uses
  // the basic channel only; N > 1 registers mpt with N lanes. 1 .. 64.
  int lanes = 1;
  // "lane_host": IP address this party's mpt lanes listen on. Default: the
  // server's host for the server; 127.0.0.1 for a client of a loopback
  // server, else the address of this host's name.
  std::string lane_host;
  // "channels": extra channels besides basic (and mpt): any of cma, xth,
  // comma-separated. Default none.
  bool cma = false;
  bool xth = false;
  // "piece_bytes": largest TensorPipe tensor on the wire; bigger tensors
  // travel as several pieces read straight into one Buffer. Default 1 GiB;
  // 1 MiB .. 1 TiB (1 TiB: no splitting in practice).
  uint64_t piece_bytes = 1ull << 30;
  // "verify_checksum": the sender sends an XXH3-64 per tensor, the receiver
  // verifies it. Default 1.
  bool verify_checksum = true;

  // From options.address ("host:port"; host a numeric IP or "localhost").
  std::string host;
  int port = 0;

  std::string url() const { return "tcp://" + host + ":" + std::to_string(port); }
};

Result<TensorPipeOptions> ParseTensorPipeOptions(const TransportOptions& options);

}  // namespace xsilo::tplink
