#include "transport/inproc/inproc_transport.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "transport/builtin.h"
#include "xsilo/core/codec.h"

namespace xsilo {

namespace {

class InprocTransport;

// A rank's mailbox on the fabric. Senders hold `gate` shared while they
// deliver; the owner takes it exclusively to detach, so once detached no
// sender touches the owner again.
struct Endpoint {
  std::shared_mutex gate;
  InprocTransport* owner = nullptr;  // null once detached
};

struct Fabric {
  std::mutex mu;
  std::condition_variable changed;
  std::map<int32_t, std::shared_ptr<Endpoint>> endpoints;
};

// Explicit process-wide registry of fabrics by name.
std::mutex g_fabrics_mu;
std::map<std::string, std::weak_ptr<Fabric>> g_fabrics;

std::shared_ptr<Fabric> JoinFabric(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_fabrics_mu);
  auto& weak = g_fabrics[name];
  auto fabric = weak.lock();
  if (!fabric) {
    fabric = std::make_shared<Fabric>();
    weak = fabric;
  }
  return fabric;
}

struct PendingSend {
  int32_t peer;
  Message message;
  SendCallback done;
};

class InprocTransport final : public Transport {
 public:
  InprocTransport(const TransportOptions& options, bool serialize)
      : Transport(options), serialize_(serialize) {}
  ~InprocTransport() override { Stop(); }

  std::string_view name() const override { return "inproc"; }

  Status Start() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_) return FailedPrecondition("inproc transport already started");
    if (stopped_) return FailedPrecondition("inproc transport was stopped");
    fabric_ = JoinFabric(options_.address);
    endpoint_ = std::make_shared<Endpoint>();
    endpoint_->owner = this;
    {
      std::lock_guard<std::mutex> flock(fabric_->mu);
      auto [it, inserted] = fabric_->endpoints.emplace(rank(), endpoint_);
      if (!inserted) {
        return AlreadyExists("rank " + std::to_string(rank()) + " already on fabric '" +
                             options_.address + "'");
      }
    }
    fabric_->changed.notify_all();
    started_ = true;
    worker_ = std::thread([this] { Run(); });
    return Status::OK();
  }

  void Stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    stop_requested_.store(true, std::memory_order_release);
    work_cv_.notify_all();
    if (fabric_) fabric_->changed.notify_all();
    // Wake peers blocked on our full queue, then detach so no peer touches us.
    CloseInbox();
    if (endpoint_) {
      std::unique_lock<std::shared_mutex> gate(endpoint_->gate);
      endpoint_->owner = nullptr;
    }
    if (fabric_) {
      std::lock_guard<std::mutex> flock(fabric_->mu);
      auto it = fabric_->endpoints.find(rank());
      if (it != fabric_->endpoints.end() && it->second == endpoint_) fabric_->endpoints.erase(it);
    }
    if (worker_.joinable()) worker_.join();
    // Anything still queued (never started) fails now.
    std::deque<PendingSend> leftover;
    {
      std::lock_guard<std::mutex> lock(mu_);
      leftover.swap(queue_);
    }
    for (auto& p : leftover) p.done(Cancelled("transport stopped before the send started"));
  }

  void SendAsync(int32_t peer, Message message, SendCallback done) override {
    Status s = CheckPeer(peer);
    if (!s.ok()) {
      done(s);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_ || stopped_) {
        s = started_ ? Cancelled("transport stopped") : FailedPrecondition("transport not started");
      } else {
        message.sender = rank();
        queue_.push_back({peer, std::move(message), std::move(done)});
      }
    }
    if (!s.ok()) {
      done(s);
      return;
    }
    work_cv_.notify_one();
  }

 private:
  bool stopping() const { return stop_requested_.load(std::memory_order_acquire); }

  // One worker per sender keeps per-peer order and never blocks the caller.
  void Run() {
    for (;;) {
      PendingSend p;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stopped_ || !queue_.empty(); });
        if (stopped_) return;  // Stop() fails the rest
        p = std::move(queue_.front());
        queue_.pop_front();
      }
      Status s = DeliverTo(p.peer, std::move(p.message));
      p.done(s);
    }
  }

  Result<std::shared_ptr<Endpoint>> WaitForPeer(int32_t peer) {
    std::unique_lock<std::mutex> lock(fabric_->mu);
    bool found = fabric_->changed.wait_for(lock, options_.connect_timeout, [&] {
      return fabric_->endpoints.count(peer) > 0 || stopping();
    });
    if (!found) {
      return Unavailable("peer " + std::to_string(peer) + " did not join fabric '" +
                         options_.address + "' within the connect timeout");
    }
    auto it = fabric_->endpoints.find(peer);
    if (it == fabric_->endpoints.end()) return Cancelled("transport stopped");
    return it->second;
  }

  Status DeliverTo(int32_t peer, Message message) {
    XSILO_ASSIGN_OR_RETURN(std::shared_ptr<Endpoint> ep, WaitForPeer(peer));
    if (serialize_) {
      EncodedFrame frame = EncodeMessage(message);
      XSILO_ASSIGN_OR_RETURN(Buffer flat, frame.bytes.Flatten());
      DecodeLimits limits;
      limits.max_payload_bytes = options_.max_message_bytes;
      XSILO_ASSIGN_OR_RETURN(message, DecodeMessage(flat, limits));
    }
    std::shared_lock<std::shared_mutex> gate(ep->gate);
    if (ep->owner == nullptr) return Unavailable("peer " + std::to_string(peer) + " has stopped");
    return ep->owner->Deliver(std::move(message), [this] { return stopping(); });
  }

  const bool serialize_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::deque<PendingSend> queue_;
  bool started_ = false;
  bool stopped_ = false;
  std::atomic<bool> stop_requested_{false};  // mirrors stopped_ for lock-free polling
  std::thread worker_;
  std::shared_ptr<Fabric> fabric_;
  std::shared_ptr<Endpoint> endpoint_;
};

}  // namespace

std::unique_ptr<Transport> MakeInprocTransport(const TransportOptions& options, bool serialize) {
  return std::make_unique<InprocTransport>(options, serialize);
}

const OptionTable& InprocOptionTable() {
  static const OptionTable table(
      "inproc", {{"serialize", OptionType::kFlag, "0", 0, 0, "",
                  "1: encode and decode every message instead of handing it over"}});
  return table;
}

TransportFactory InprocTransportFactory() {
  TransportFactory f;
  f.name = "inproc";
  f.description = "threads in one process sharing a named fabric; zero-copy hand-over";
  f.viable = [] { return Status::OK(); };
  f.create = [](const TransportOptions& options) -> Result<std::unique_ptr<Transport>> {
    const OptionTable& t = InprocOptionTable();
    XSILO_RETURN_IF_ERROR(t.CheckKeys(options.backend));
    XSILO_ASSIGN_OR_RETURN(bool serialize, t.Flag(options.backend, "serialize"));
    return MakeInprocTransport(options, serialize);
  };
  f.options = &InprocOptionTable();
  return f;
}

}  // namespace xsilo
