// A transport that decorates another, after LevelDB's EnvWrapper: every
// virtual forwards to the inner transport, and the inner transport's
// deliveries come through OnDelivery into this transport's inbox. A
// decorator (metrics, compression, faults, the hybrid) overrides what it changes and inherits
// the rest, so it cannot drop a capability the interface gains later, nor
// get the stop order below wrong.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "xsilo/transport/transport.h"

namespace xsilo {

class ForwardingTransport : public Transport {
 public:
  ~ForwardingTransport() override { Stop(); }

  std::string_view name() const override { return inner_->name(); }
  Status Start() override { return inner_->Start(); }
  // Closes this transport's inbox before stopping the inner one: a delivery
  // blocked on our full inbox holds the inner transport's delivering thread
  // (inproc: the sender's, under the gate its Stop takes), which the inner
  // Stop waits for. MeteredTransport and the compressing decorator each
  // deadlocked on it before they shared this class.
  void Stop() override {
    CloseInbox();
    inner_->Stop();
  }
  void SendAsync(int32_t peer, Message message, SendCallback done) override {
    inner_->SendAsync(peer, std::move(message), std::move(done));
  }
  void BroadcastAsync(std::vector<int32_t> peers, Message message, SendCallback done) override {
    inner_->BroadcastAsync(std::move(peers), std::move(message), std::move(done));
  }
  // Every capability of the inner transport, as it is; a decorator whose
  // behaviour a capability would bypass hands out one of its own instead.
  LinkObserver* link_observer() override { return inner_->link_observer(); }
  StreamSink* stream_sink() override { return inner_->stream_sink(); }

  Transport& inner() const { return *inner_; }

 protected:
  // Takes `inner` (not started) and routes its deliveries through
  // OnDelivery. A derived class whose OnDelivery or sends use members of
  // its own must call Stop() in its own destructor, so that the inner
  // transport's threads are done before those members go.
  explicit ForwardingTransport(std::unique_ptr<Transport> inner)
      : ForwardingTransport(inner->options(), std::move(inner)) {}
  // The same, with options of its own (rank and world as the inner's).
  // `inner` is taken by rvalue reference, so that the delegation above
  // reads its options before anything moves from it.
  ForwardingTransport(TransportOptions options, std::unique_ptr<Transport>&& inner)
      : Transport(std::move(options)), inner_(std::move(inner)) {
    inner_->SetForwarder([this](Message m, const std::function<bool()>& abandon) {
      return OnDelivery(std::move(m), abandon);
    });
  }

  // On the inner transport's delivering thread, for every message it
  // delivers, with its abandon test. The default hands it to our inbox.
  virtual Status OnDelivery(Message m, const std::function<bool()>& abandon) {
    return Deliver(std::move(m), abandon);
  }

 private:
  std::unique_ptr<Transport> inner_;
};

}  // namespace xsilo
