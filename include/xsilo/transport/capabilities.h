// Capabilities a transport may have beyond the core Transport interface.
// Each is a separate interface, reached through an accessor on Transport
// (link_observer(), stream_sink()) that returns null when the transport
// lacks it; the object returned lives as long as the transport. A
// decorator (ForwardingTransport) hands out its inner transport's, or one
// of its own that keeps the decorator's behaviour; it never drops one
// (tests/hybrid/capabilities_test.cpp checks every decorator).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "xsilo/core/status.h"

namespace xsilo {

class EncodeStream;
using SendCallback = std::function<void(const Status&)>;

// What a transport knows of its links to its peers (auto+<connector>
// measures them: docs/auto.md). Decorators that trade CPU for bytes
// (compression) decide by it.
class LinkObserver {
 public:
  virtual ~LinkObserver() = default;
  // The goodput measured to `peer` for large messages, bytes/s, on the
  // faster of the transport's paths; 0 when none was measured.
  virtual double MeasuredGoodputBps(int32_t peer) = 0;
  // The round trip measured to `peer`, seconds; < 0 when none was.
  virtual double MeasuredRttS(int32_t peer) = 0;
  // Learns the round trips a send of `bytes` to `peers` would have before
  // its path is chosen (waits at most a bounded time), so that a caller
  // can read them (MeasuredRttS) first.
  virtual void LearnLink(const std::vector<int32_t>& peers, uint64_t bytes) = 0;
  // The last path choice and why, one line ("store: 1 GiB, predicted
  // ..."); empty before the first choice or when paths are not chosen.
  virtual std::string RouteReason() const = 0;
};

// A transport that takes a message still being encoded (EncodeStream: its
// producer Finish()es it with the message, or with the encoder's error,
// which `done` then gets) and puts its first bytes on the wire meanwhile.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  // Whether a send to `peer` would stream now; a caller that encodes asks
  // before it starts a stream.
  virtual bool StreamsSends(int32_t peer) = 0;
  // `done` fires exactly once, as for Transport::SendAsync.
  virtual void SendStreamAsync(int32_t peer, std::shared_ptr<EncodeStream> stream,
                               SendCallback done) = 0;
};

}  // namespace xsilo
