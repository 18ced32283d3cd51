// Inbox: the bounded, closable queue a Transport delivers received
// Messages into (transport.h), with an optional handler or forwarder that
// takes them instead. Usable on its own by a decorator that queues what an
// inner transport delivers (the hybrid's fetch queue).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>

#include "xsilo/core/message.h"
#include "xsilo/core/status.h"

namespace xsilo {

// Every timeout of the transport layer.
using Duration = std::chrono::milliseconds;

using MessageHandler = std::function<void(Message)>;
// Takes a received message on the delivering thread, like a handler, but
// may block: `abandon` (possibly empty) is the deliverer's own stop test,
// to poll while blocked; the result is the delivery's outcome (Cancelled
// once abandoned). For transports that decorate another (hybrid).
using MessageForwarder = std::function<Status(Message, const std::function<bool()>& abandon)>;

// A bounded, closable queue of received Messages with an optional handler.
// Backends push; users pop. Thread-safe.
class Inbox {
 public:
  explicit Inbox(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  // With a handler set, Push hands messages to it (on the pushing thread)
  // instead of queueing; messages already queued are handed over first.
  void SetHandler(MessageHandler handler);
  // With a forwarder set (before any Push), Push hands every message to it
  // and returns its result. Takes precedence over a handler.
  void SetForwarder(MessageForwarder forwarder);
  // Blocks while the queue is full. Cancelled once closed, or once
  // `abandon` (polled while blocked) returns true.
  Status Push(Message message, const std::function<bool()>& abandon = {});
  // Timeout if nothing arrives in time; Cancelled once closed and drained.
  Result<Message> Pop(Duration timeout);
  // Wakes every waiter; later pushes fail. Queued messages stay poppable.
  void Close();
  size_t size() const;

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<Message> queue_;
  MessageHandler handler_;
  MessageForwarder forwarder_;
  bool closed_ = false;
};

}  // namespace xsilo
