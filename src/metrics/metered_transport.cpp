#include "xsilo/metrics/metered_transport.h"

#include <chrono>
#include <mutex>

#include "xsilo/core/encode_stream.h"
#include "xsilo/transport/forwarding.h"

namespace xsilo::metrics {

namespace {

using Clock = std::chrono::steady_clock;

// The counters of one (peer, route) pair, looked up once.
struct PeerSeries {
  Counter* sent_bytes;
  Counter* sent_messages;
  Counter* send_errors;
  Gauge* send_seconds;
  Gauge* goodput;
  Counter* received_bytes;
  Counter* received_messages;
};

// Streamed sends (StreamSink) are counted too: their bytes are what the
// stream held when the send completed.
class MeteredTransport final : public ForwardingTransport, private StreamSink {
 public:
  // Received messages are counted on the inner transport's delivering
  // thread (OnDelivery) and pushed into our inbox with its abandon test, so
  // the inner backpressure rules hold as without us.
  MeteredTransport(std::unique_ptr<Transport> inner, Registry& registry, MeteredOptions options)
      : ForwardingTransport(std::move(inner)),
        registry_(registry),
        party_(options.party.empty() ? "rank " + std::to_string(rank()) : std::move(options.party)),
        backend_(ForwardingTransport::name()) {}
  ~MeteredTransport() override { Stop(); }

  void SendAsync(int32_t peer, Message message, SendCallback done) override {
    const uint64_t bytes = message.payload_bytes();
    const auto start = Clock::now();
    inner().SendAsync(peer, std::move(message),
                      [this, peer, bytes, start, done = std::move(done)](const Status& s) {
                        Account({peer}, bytes, start, s);
                        if (done) done(s);
                      });
  }

  StreamSink* stream_sink() override {
    return inner().stream_sink() != nullptr ? static_cast<StreamSink*>(this) : nullptr;
  }

  void BroadcastAsync(std::vector<int32_t> peers, Message message, SendCallback done) override {
    const uint64_t bytes = message.payload_bytes();
    const auto start = Clock::now();
    std::vector<int32_t> copy = peers;
    inner().BroadcastAsync(
        std::move(peers), std::move(message),
        [this, copy = std::move(copy), bytes, start, done = std::move(done)](const Status& s) {
          Account(copy, bytes, start, s);
          if (done) done(s);
        });
  }

 private:
  bool StreamsSends(int32_t peer) override { return inner().stream_sink()->StreamsSends(peer); }
  void SendStreamAsync(int32_t peer, std::shared_ptr<EncodeStream> stream,
                       SendCallback done) override {
    const auto start = Clock::now();
    std::shared_ptr<EncodeStream> counted = stream;
    inner().stream_sink()->SendStreamAsync(
        peer, std::move(stream),
        [this, peer, counted = std::move(counted), start, done = std::move(done)](const Status& s) {
          Account({peer}, counted ? counted->Now().ready : 0, start, s);
          if (done) done(s);
        });
  }

  Status OnDelivery(Message m, const std::function<bool()>& abandon) override {
    PeerSeries& s = Series(m.sender, backend_);
    s.received_bytes->Add(m.payload_bytes());
    s.received_messages->Add();
    return Deliver(std::move(m), abandon);
  }

  std::string Route() const {
    LinkObserver* observer = inner().link_observer();
    std::string reason = observer != nullptr ? observer->RouteReason() : std::string();
    std::string route = reason.substr(0, reason.find(':'));
    while (!route.empty() && route.back() == ' ') route.pop_back();
    return route.empty() ? backend_ : route;
  }

  void Account(const std::vector<int32_t>& peers, uint64_t bytes, Clock::time_point start,
               const Status& s) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const std::string route = Route();
    for (int32_t p : peers) {
      PeerSeries& series = Series(p, route);
      if (!s.ok()) {
        series.send_errors->Add();
        continue;
      }
      series.sent_bytes->Add(bytes);
      series.sent_messages->Add();
      series.send_seconds->Add(seconds);
      if (seconds > 0 && bytes > 0) series.goodput->Set(static_cast<double>(bytes) / seconds);
    }
  }

  PeerSeries& Series(int32_t peer, const std::string& route) {
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_pair(peer, route);
    auto it = series_.find(key);
    if (it != series_.end()) return it->second;
    const Labels l = {{"party", party_}, {"peer", std::to_string(peer)}, {"route", route}};
    PeerSeries s{
        &registry_.GetCounter("xsilo_transport_sent_bytes_total",
                              "Payload bytes of sends that completed OK.", l),
        &registry_.GetCounter("xsilo_transport_sent_messages_total",
                              "Messages whose send completed OK.", l),
        &registry_.GetCounter("xsilo_transport_send_errors_total", "Sends that failed.", l),
        &registry_.GetFloatCounter("xsilo_transport_send_seconds_total",
                                   "Seconds from SendAsync to completion, summed over OK sends.",
                                   l),
        &registry_.GetGauge("xsilo_transport_goodput_bytes_per_second",
                            "Payload bytes per second of the last completed send.", l),
        &registry_.GetCounter("xsilo_transport_received_bytes_total",
                              "Payload bytes of messages delivered to this party.", l),
        &registry_.GetCounter("xsilo_transport_received_messages_total",
                              "Messages delivered to this party.", l),
    };
    return series_.emplace(key, s).first->second;
  }

  Registry& registry_;
  const std::string party_;
  const std::string backend_;
  std::mutex mu_;
  std::map<std::pair<int32_t, std::string>, PeerSeries> series_;
};

}  // namespace

std::unique_ptr<Transport> MakeMeteredTransport(std::unique_ptr<Transport> inner,
                                                Registry& registry, MeteredOptions options) {
  return std::make_unique<MeteredTransport>(std::move(inner), registry, std::move(options));
}

}  // namespace xsilo::metrics
