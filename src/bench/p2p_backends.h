// The backends `xsilo bench p2p --backends` accepts: one row per name
// (p2p_backends.cpp), the striped grpc-s<K> rows and BASE~CODEC.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace xsilo::bench {

// Backends. One row per name accepted by --backends. `transport` is the
// TransportRegistry name, `options` its TransportOptions::backend.
//
// A new backend is one row here (and in kP2pBackends); nothing else in
// the benchmark is backend-specific.
struct BackendSpec {
  std::string name;
  std::string transport;
  std::map<std::string, std::string> options;
  // The sender or receiver copies the whole message through the codec
  // (flattened frame, or chunk copies of the frame): the serialization share
  // counts EncodeMessage + Flatten + DecodeMessage; otherwise Encode (gather
  // list, no copy) + Decode.
  bool serializes = true;
  // Ranks must be launched by mpirun.
  bool needs_mpirun = false;
  // Only runs when sender and receiver share a host address (lan).
  bool loopback_only = false;
  // TLS on every leg: grpc with mutual TLS and, for +s3, the embedded
  // object server on https, all with one self-signed pair the run makes
  // (TlsOptionsFor), which every party trusts.
  bool tls = false;
  // grpc+endpoint: every peer runs its own object endpoint (a child
  // `xsilo endpoint start` in its site), and the sender a relay
  // (`xsilo relay`, in the server site) they all register with.
  // "direct": the sender's endpoint listens for peers on the server site's
  // address, so receivers' endpoints dial it; "relayed": no endpoint
  // listens, the relay pipes every object. "" : not an endpoint row.
  std::string endpoint;
};

// Every named row, in the study's order.
const std::vector<BackendSpec>& Backends();

// A row of Backends(), or "grpc-s<K>" for any K in [1, 64]: grpc striped
// over K streams (e.g. K = ceil(multi / single) of the link, the stripe
// docs/auto.md predicts), or either with "~CODEC": compressed
// (SplitCompressionSuffix). nullptr for an unknown name. Not thread-safe
// (the coordinator is single-threaded).
const BackendSpec* FindBackend(const std::string& name);

}  // namespace xsilo::bench
