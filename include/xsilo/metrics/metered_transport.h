// A transport decorator that counts what another transport moves, per peer
// and route, into a metrics Registry (docs/metrics.md). Sends and receives
// pass through untouched: BroadcastAsync stays one inner BroadcastAsync
// (the payload still shared, a hybrid backend still uploading once).
//
//   xsilo_transport_sent_bytes_total{peer,route}        payload bytes of sends that completed OK
//   xsilo_transport_sent_messages_total{peer,route}
//   xsilo_transport_send_errors_total{peer,route}       sends that failed (a failed broadcast
//                                                       counts against each of its peers:
//                                                       the transport names only the first)
//   xsilo_transport_send_seconds_total{peer,route}      SendAsync to completion, summed
//   xsilo_transport_goodput_bytes_per_second{peer,route} of the last completed send
//   xsilo_transport_received_bytes_total{peer,route}    payload bytes delivered to this party
//   xsilo_transport_received_messages_total{peer,route}
//
// Payload bytes are the messages' tensor bytes (Message::payload_bytes()),
// what the job asked to move; framing and retransmissions are not seen here.
// `route` is the inner transport's RouteReason() up to its first ':' (e.g.
// "store" or "direct" for auto backends) when it gives one, else the
// backend's name. Every series also carries `party` (the options' label).
#pragma once

#include <memory>
#include <string>

#include "xsilo/metrics/metrics.h"
#include "xsilo/transport/transport.h"

namespace xsilo::metrics {

struct MeteredOptions {
  // The `party` label of every series, e.g. "server" or "client 3".
  // Default: "rank <rank>".
  std::string party;
};

// Wraps `inner` (not yet started); `registry` must outlive the result. The
// result takes over `inner`'s receive side (its forwarder), so use only
// the result from then on.
std::unique_ptr<Transport> MakeMeteredTransport(std::unique_ptr<Transport> inner,
                                                Registry& registry, MeteredOptions options = {});

}  // namespace xsilo::metrics
