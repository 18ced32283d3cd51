// Transport: the control plane. Moves Messages between ranked peers.
//
// Contract every backend keeps (and the conformance suite checks):
//  - Rank 0 is the server; ranks 1..world_size-1 are clients.
//  - Messages from one sender to one receiver arrive in send order.
//  - SendAsync/BroadcastAsync never block on the network; their callback
//    fires exactly once: OK when the message was handed to the peer, or an
//    error (Cancelled if the transport stopped under it).
//  - Broadcast shares the Message's tensor Buffers among all receivers; no
//    backend copies the payload once per receiver.
//  - Received messages go to the handler if one is set, otherwise into a
//    bounded queue read by Receive(timeout). A full queue pushes back on the
//    sender instead of growing without bound.
//  - Stop() is idempotent, fails pending sends, wakes blocked receivers and
//    returns only when no transport thread will touch user callbacks again.
//  - Every blocking call takes a timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "xsilo/core/message.h"
#include "xsilo/core/status.h"
#include "xsilo/transport/capabilities.h"
#include "xsilo/transport/inbox.h"

namespace xsilo {

struct TransportOptions {
  // This party's rank. Rank 0 is the server.
  int32_t rank = 0;
  // Number of parties, server included. Default 1 (a lone server).
  int32_t world_size = 1;
  // Where the server listens and clients dial: "host:port" for network
  // backends, a fabric name for inproc. Default empty (backend-chosen).
  std::string address;
  // Capacity of the receive queue, in messages. Default 64.
  size_t receive_queue_capacity = 64;
  // Largest incoming message accepted, in bytes. Default 1 TiB.
  uint64_t max_message_bytes = 1ull << 40;
  // How long Start() and a send to a not-yet-connected peer wait for the
  // peer. Default 60 s.
  Duration connect_timeout = std::chrono::seconds(60);
  // Backend-specific settings as key=value strings; each backend documents
  // its keys (e.g. grpc "streams", "chunk_bytes"). Unknown keys are rejected.
  std::map<std::string, std::string> backend;
};

// Message param (int) read and removed by a transport that stripes a peer's
// messages over several streams (grpc with streams > 1): this message's
// chunks go on at most that many of them (>= 1). The `auto` backend sets it
// per message (docs/auto.md); a transport without striping delivers it as
// an ordinary param.
inline constexpr const char* kStripeParam = "xsilo.stripe";
class Transport {
 public:
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  virtual std::string_view name() const = 0;
  int32_t rank() const { return options_.rank; }
  int32_t world_size() const { return options_.world_size; }
  const TransportOptions& options() const { return options_; }

  // Connects / listens. Blocks at most options().connect_timeout.
  virtual Status Start() = 0;
  // Idempotent. Fails pending sends with Cancelled and closes the inbox.
  virtual void Stop() = 0;

  // Sends `message` to `peer`; message.sender is set to rank().
  virtual void SendAsync(int32_t peer, Message message, SendCallback done) = 0;
  // Sends one Message to every peer, sharing its payload. `done` fires once
  // after all peers completed, with the first error if any. The default
  // implementation issues one SendAsync per peer with shared Buffers.
  virtual void BroadcastAsync(std::vector<int32_t> peers, Message message, SendCallback done);

  // Capabilities beyond this interface (capabilities.h); null when the
  // transport lacks them. The object returned lives as long as the
  // transport.
  virtual LinkObserver* link_observer() { return nullptr; }
  virtual StreamSink* stream_sink() { return nullptr; }

  // Blocking forms. On Timeout the send may still complete later.
  Status Send(int32_t peer, Message message, Duration timeout);
  Status Broadcast(std::vector<int32_t> peers, Message message, Duration timeout);

  // Next received message, in arrival order.
  Result<Message> Receive(Duration timeout) { return inbox_.Pop(timeout); }
  // Routes received messages to `handler` (on a transport thread; keep it short).
  void SetHandler(MessageHandler handler) { inbox_.SetHandler(std::move(handler)); }
  // Routes received messages to `forwarder` instead of the queue, with the
  // delivering thread's abandon test (Inbox::SetForwarder). Set it before
  // Start.
  void SetForwarder(MessageForwarder forwarder) { inbox_.SetForwarder(std::move(forwarder)); }

 protected:
  explicit Transport(TransportOptions options)
      : options_(std::move(options)), inbox_(options_.receive_queue_capacity) {}

  // For backends: validates a destination rank.
  Status CheckPeer(int32_t peer) const;
  // For backends: joins the `count` per-peer sends of one broadcast. The
  // returned factory makes each peer's send callback; `done` fires once,
  // after the last of them, with the first failure (naming its peer) or OK.
  static std::function<SendCallback(int32_t peer)> JoinBroadcast(size_t count, SendCallback done);
  // For backends: hands a received message to the user.
  Status Deliver(Message message, const std::function<bool()>& abandon = {}) {
    return inbox_.Push(std::move(message), abandon);
  }
  void CloseInbox() { inbox_.Close(); }

  TransportOptions options_;

 private:
  Inbox inbox_;
};

}  // namespace xsilo
