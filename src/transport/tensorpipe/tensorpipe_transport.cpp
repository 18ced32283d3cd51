#include "transport/tensorpipe/tensorpipe_transport.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <sstream>
#include <thread>

#include <tensorpipe/tensorpipe.h>

#include "net/sigpipe.h"
#include "transport/builtin.h"
#include "transport/tensorpipe/descriptor.h"
#include "transport/tensorpipe/options.h"
#include "xsilo/core/log.h"

namespace xsilo {

namespace {

constinit LogComponent kLog("tensorpipe");

using namespace std::chrono_literals;
using tplink::IncomingPlan;
using tplink::OutgoingPlan;
using tplink::TensorPipeOptions;

// Control messages: metadata only, no tensors. Data messages start "XTP1".
constexpr std::string_view kHello = "XTPH";    // client -> server: "XTPH <rank> <world>"
constexpr std::string_view kWelcome = "XTPW";  // server -> client: accepted
constexpr std::string_view kRefuse = "XTPR";   // server -> client: "XTPR <reason>"

// Channel priorities: TensorPipe picks the highest one both peers can use.
constexpr int64_t kBasicPriority = 0;
constexpr int64_t kMptPriority = 100;
constexpr int64_t kCmaPriority = 200;
constexpr int64_t kXthPriority = 300;

std::atomic<uint64_t> g_shm_counter{0};

struct Outgoing {
  Message message;  // keeps the tensor Buffers alive until every write completed
  OutgoingPlan plan;
};

struct Delivery {
  int32_t rank;
  std::shared_ptr<tensorpipe::Pipe> pipe;
  std::shared_ptr<IncomingPlan> plan;
};

bool IsLoopback(const std::string& host) { return host.rfind("127.", 0) == 0 || host == "::1"; }

class TensorPipeTransport final : public Transport {
 public:
  TensorPipeTransport(const TransportOptions& options, TensorPipeOptions tp)
      : Transport(options), tp_(std::move(tp)), pipes_(options.world_size) {}
  ~TensorPipeTransport() override { Stop(); }

  std::string_view name() const override { return "tensorpipe"; }

  Status Start() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (started_) return FailedPrecondition("tensorpipe transport already started");
      started_ = true;
    }
    if (stopping_) return Cancelled("tensorpipe transport stopped");
    try {
      XSILO_RETURN_IF_ERROR(MakeContext());
    } catch (const std::exception& e) {
      return Internal(std::string("tensorpipe context: ") + e.what());
    }
    delivery_thread_ = std::thread([this] { DeliveryLoop(); });
    try {
      return rank() == 0 ? StartServer() : StartClient();
    } catch (const std::exception& e) {
      return Internal(std::string("tensorpipe start: ") + e.what());
    }
  }

  void Stop() override {
    std::lock_guard<std::mutex> stop_lock(stop_mu_);
    if (stopped_) return;
    stopping_ = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
    CloseInbox();
    {
      std::lock_guard<std::mutex> lock(delivery_mu_);
      delivery_cv_.notify_all();
    }
    if (delivery_thread_.joinable()) delivery_thread_.join();
    // Calls into TensorPipe that passed the stopping_ check finish first, so
    // that closing the context fails every operation they queued.
    while (submitting_.load() > 0) std::this_thread::yield();
    if (ctx_) {
      try {
        if (listener_) listener_->close();
        ctx_->close();
        ctx_->join();  // every pending TensorPipe callback has fired
      } catch (const std::exception& e) {
        Log(std::string("error while closing: ") + e.what());
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& p : pipes_) p.reset();
    }
    listener_.reset();
    ctx_.reset();
    std::lock_guard<std::mutex> lock(delivery_mu_);
    deliveries_.clear();
    stopped_ = true;
  }

  void SendAsync(int32_t peer, Message message, SendCallback done) override {
    Status s = CheckDestination(peer);
    if (!s.ok()) {
      done(s);
      return;
    }
    message.sender = rank();
    Write(peer, Prepare(std::move(message)), std::move(done));
  }

  void BroadcastAsync(std::vector<int32_t> peers, Message message, SendCallback done) override {
    for (int32_t p : peers) {
      Status s = CheckDestination(p);
      if (!s.ok()) {
        done(s.WithContext("peer " + std::to_string(p)));
        return;
      }
    }
    if (peers.empty()) {
      done(Status::OK());
      return;
    }
    message.sender = rank();
    // One plan (descriptor, checksums, pieces) and one set of Buffers for all peers.
    auto out = Prepare(std::move(message));
    auto joined = JoinBroadcast(peers.size(), std::move(done));
    for (int32_t peer : peers) Write(peer, out, joined(peer));
  }

 private:
  // Counts a call into TensorPipe that Stop() must wait for; false once stopping.
  class Submission {
   public:
    explicit Submission(TensorPipeTransport* t) : t_(t) {
      t_->submitting_.fetch_add(1);
      ok_ = !t_->stopping_.load();
    }
    ~Submission() { t_->submitting_.fetch_sub(1); }
    bool ok() const { return ok_; }

   private:
    TensorPipeTransport* t_;
    bool ok_ = false;
  };

  // What the transport refuses, drops or loses, at warn.
  void Log(const std::string& what) const {
    XSILO_LOG(kLog, kWarn, "rank " << rank() << ": " << what);
  }

  Status CheckDestination(int32_t peer) const {
    XSILO_RETURN_IF_ERROR(CheckPeer(peer));
    if (rank() != 0 && peer != 0) {
      return InvalidArgument("a tensorpipe client reaches only rank 0, not peer " +
                             std::to_string(peer));
    }
    return Status::OK();
  }

  std::shared_ptr<const Outgoing> Prepare(Message message) {
    auto out = std::make_shared<Outgoing>();
    out->message = std::move(message);
    out->plan = tplink::PlanOutgoing(out->message, tp_.piece_bytes, tp_.verify_checksum);
    return out;
  }

  void Write(int32_t peer, std::shared_ptr<const Outgoing> out, SendCallback done) {
    std::shared_ptr<tensorpipe::Pipe> pipe;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pipe = pipes_[peer];
    }
    Submission submission(this);
    if (!submission.ok()) {
      done(Cancelled("tensorpipe transport stopped"));
      return;
    }
    if (!started_) {
      done(FailedPrecondition("tensorpipe transport not started"));
      return;
    }
    if (!pipe) {
      done(Unavailable("tensorpipe: peer " + std::to_string(peer) + " is not connected"));
      return;
    }
    tensorpipe::Message m;
    m.metadata = out->plan.metadata;
    m.tensors.reserve(out->plan.pieces.size());
    for (const auto& piece : out->plan.pieces) {
      tensorpipe::Message::Tensor t;
      t.buffer = tensorpipe::CpuBuffer{piece.data};
      t.length = piece.length;
      m.tensors.push_back(std::move(t));
    }
    pipe->write(std::move(m), [this, out, done = std::move(done)](const tensorpipe::Error& err) {
      if (!err) {
        done(Status::OK());
      } else if (stopping_) {
        done(Cancelled("tensorpipe transport stopped"));
      } else {
        done(Unavailable("tensorpipe write: " + err.what()));
      }
    });
  }

  // TensorPipe's loop threads start here and write with libuv's writev, which
  // raises SIGPIPE when a peer hangs up mid-write: they inherit SIGPIPE
  // blocked from this scope and see EPIPE instead.
  Status MakeContext() {
    net::SigpipeBlock sigpipe_blocked;
    ctx_ = std::make_shared<tensorpipe::Context>(
        tensorpipe::ContextOptions().name("xsilo-rank-" + std::to_string(rank())));
    ctx_->registerTransport(0, "tcp", tensorpipe::transport::uv::create());
    if (tp_.shm) ctx_->registerTransport(100, "shm", tensorpipe::transport::shm::create());
    ctx_->registerChannel(kBasicPriority, "basic", tensorpipe::channel::basic::create());
    if (tp_.lanes > 1) {
      std::string host = tp_.lane_host;
      if (host.empty()) {
        if (rank() == 0 && tp_.host != "0.0.0.0") {
          host = tp_.host;
        } else if (rank() != 0 && IsLoopback(tp_.host)) {
          host = "127.0.0.1";
        } else {
          auto [err, addr] = tensorpipe::transport::uv::lookupAddrForHostname();
          if (err) return Unavailable("tensorpipe: no address for the mpt lanes: " + err.what());
          host = addr;
        }
      }
      std::vector<std::shared_ptr<tensorpipe::transport::Context>> contexts;
      std::vector<std::shared_ptr<tensorpipe::transport::Listener>> listeners;
      for (int i = 0; i < tp_.lanes; ++i) {
        contexts.push_back(tensorpipe::transport::uv::create());
        listeners.push_back(contexts.back()->listen(host));
      }
      ctx_->registerChannel(kMptPriority, "mpt",
                            tensorpipe::channel::mpt::create(contexts, listeners));
    }
    if (tp_.cma) ctx_->registerChannel(kCmaPriority, "cma", tensorpipe::channel::cma::create());
    if (tp_.xth) ctx_->registerChannel(kXthPriority, "xth", tensorpipe::channel::xth::create());
    return Status::OK();
  }

  // ---- server -------------------------------------------------------------

  Status StartServer() {
    std::vector<std::string> urls = {tp_.url()};
    if (tp_.shm) {
      urls.push_back("shm://xsilo-tp-" + std::to_string(getpid()) + "-" +
                     std::to_string(g_shm_counter++));
    }
    listener_ = ctx_->listen(urls);
    AcceptNext();
    std::unique_lock<std::mutex> lock(mu_);
    const bool all = cv_.wait_for(lock, options_.connect_timeout,
                                  [&] { return stopping_ || connected_ == world_size() - 1; });
    if (stopping_) return Cancelled("tensorpipe transport stopped during Start");
    if (!all) {
      return Timeout("tensorpipe server: " + std::to_string(connected_) + " of " +
                     std::to_string(world_size() - 1) + " clients connected within " +
                     std::to_string(options_.connect_timeout.count()) + " ms");
    }
    return Status::OK();
  }

  void AcceptNext() {
    Submission submission(this);
    if (!submission.ok()) return;
    listener_->accept([this](const tensorpipe::Error& err, std::shared_ptr<tensorpipe::Pipe> pipe) {
      if (err) {
        if (!stopping_) Log("accept failed: " + err.what());
        return;
      }
      AcceptNext();
      ReadHello(std::move(pipe));
    });
  }

  void ReadHello(std::shared_ptr<tensorpipe::Pipe> pipe) {
    Submission submission(this);
    if (!submission.ok()) return;
    pipe->readDescriptor([this, pipe](const tensorpipe::Error& err, tensorpipe::Descriptor d) {
      if (err) return;  // the client went away before saying who it is
      int32_t r = -1, w = -1;
      std::string refusal;
      std::istringstream in(d.metadata);
      std::string magic;
      in >> magic >> r >> w;
      if (magic != kHello || in.fail() || !d.tensors.empty() || !d.payloads.empty()) {
        refusal = "not an xsilo tensorpipe hello";
      } else if (w != world_size()) {
        refusal = "client says world size " + std::to_string(w) + ", server has " +
                  std::to_string(world_size());
      } else if (r < 1 || r >= world_size()) {
        refusal =
            "client rank " + std::to_string(r) + " outside 1.." + std::to_string(world_size() - 1);
      }
      Submission inner(this);
      if (!inner.ok()) return;
      if (!refusal.empty()) {
        Log("refused a client: " + refusal);
        Refuse(pipe, refusal);
        return;
      }
      pipe->read(tensorpipe::Allocation{}, [this, pipe, r](const tensorpipe::Error& rerr) mutable {
        if (rerr) return;
        Submission again(this);
        if (!again.ok()) return;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (!pipes_[r]) {
            // The welcome goes first on the pipe, before any user message.
            tensorpipe::Message welcome;
            welcome.metadata = std::string(kWelcome);
            pipe->write(std::move(welcome), [](const tensorpipe::Error&) {});
            pipes_[r] = pipe;
            ++connected_;
            cv_.notify_all();
          } else {
            r = -1;
          }
        }
        if (r < 0) {
          Log("refused a second connection for a connected rank");
          Refuse(pipe, "rank already connected");
          return;
        }
        ArmRead(r, pipe);
      });
    });
  }

  void Refuse(const std::shared_ptr<tensorpipe::Pipe>& pipe, const std::string& reason) {
    tensorpipe::Message m;
    m.metadata = std::string(kRefuse) + " " + reason;
    pipe->write(std::move(m), [pipe](const tensorpipe::Error&) { pipe->close(); });
  }

  // ---- client -------------------------------------------------------------

  Status StartClient() {
    const auto deadline = std::chrono::steady_clock::now() + options_.connect_timeout;
    auto backoff = 50ms;
    Status last = Unavailable("no attempt");
    while (true) {
      if (stopping_) return Cancelled("tensorpipe transport stopped during Start");
      auto pipe = ctx_->connect(tp_.url(), tensorpipe::PipeOptions().remoteName("xsilo-rank-0"));
      auto answer = std::make_shared<std::promise<Status>>();
      auto future = answer->get_future();
      tensorpipe::Message hello;
      hello.metadata =
          std::string(kHello) + " " + std::to_string(rank()) + " " + std::to_string(world_size());
      pipe->write(std::move(hello), [](const tensorpipe::Error&) {});
      pipe->readDescriptor([pipe, answer](const tensorpipe::Error& err, tensorpipe::Descriptor d) {
        if (err) {
          answer->set_value(Unavailable("tensorpipe connect: " + err.what()));
          return;
        }
        if (d.metadata.rfind(kRefuse, 0) == 0) {
          answer->set_value(FailedPrecondition("tensorpipe server refused this client:" +
                                               d.metadata.substr(kRefuse.size())));
          return;
        }
        if (d.metadata != kWelcome || !d.tensors.empty() || !d.payloads.empty()) {
          answer->set_value(Corrupt("tensorpipe server answered something other than welcome"));
          return;
        }
        pipe->read(tensorpipe::Allocation{}, [answer](const tensorpipe::Error& rerr) {
          answer->set_value(rerr ? Unavailable("tensorpipe connect: " + rerr.what())
                                 : Status::OK());
        });
      });
      if (future.wait_until(deadline) == std::future_status::ready) {
        last = future.get();
        if (last.ok()) {
          Submission submission(this);
          if (!submission.ok()) return Cancelled("tensorpipe transport stopped during Start");
          {
            std::lock_guard<std::mutex> lock(mu_);
            pipes_[0] = pipe;
          }
          ArmRead(0, pipe);
          return Status::OK();
        }
        if (last.code() == StatusCode::kFailedPrecondition) {
          pipe->close();
          return last;
        }
      } else {
        last = Timeout("no answer from the server");
      }
      pipe->close();
      if (std::chrono::steady_clock::now() + backoff >= deadline) {
        return Timeout("tensorpipe: server " + tp_.url() + " not reached within " +
                       std::to_string(options_.connect_timeout.count()) +
                       " ms; last: " + last.ToString());
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min<std::chrono::milliseconds>(backoff * 2, 1000ms);
    }
  }

  // ---- receiving ----------------------------------------------------------

  // Reads the next message from `pipe`. Re-armed by the delivery thread
  // after the previous message was delivered: a receiver whose queue is full
  // stops reading, and TCP pushes back on the sender.
  void ArmRead(int32_t peer, std::shared_ptr<tensorpipe::Pipe> pipe) {
    Submission submission(this);
    if (!submission.ok()) return;
    pipe->readDescriptor([this, peer, pipe](const tensorpipe::Error& err,
                                            tensorpipe::Descriptor d) {
      if (err) {
        PipeFailed(peer, pipe, err);
        return;
      }
      std::vector<uint64_t> lengths;
      lengths.reserve(d.tensors.size());
      for (const auto& t : d.tensors) lengths.push_back(t.length);
      Result<IncomingPlan> plan =
          d.payloads.empty() ? tplink::PlanIncoming(d.metadata, lengths, options_.max_message_bytes)
                             : Result<IncomingPlan>(Corrupt("tensorpipe message with payloads"));
      Submission inner(this);
      if (!inner.ok()) return;
      if (!plan.ok()) {
        // The pieces cannot be skipped without reading them: drop the
        // message and the connection it came on.
        Log("dropped a message from rank " + std::to_string(peer) + ": " +
            plan.status().ToString() + "; closing the connection");
        Forget(peer, pipe);
        pipe->close();
        return;
      }
      auto shared = std::make_shared<IncomingPlan>(std::move(plan).value());
      tensorpipe::Allocation allocation;
      allocation.tensors.reserve(shared->pieces.size());
      for (const auto& piece : shared->pieces) {
        tensorpipe::Allocation::Tensor t;
        t.buffer = tensorpipe::CpuBuffer{piece.data};
        allocation.tensors.push_back(std::move(t));
      }
      pipe->read(std::move(allocation), [this, peer, pipe, shared](const tensorpipe::Error& rerr) {
        if (rerr) {
          PipeFailed(peer, pipe, rerr);
          return;
        }
        std::lock_guard<std::mutex> lock(delivery_mu_);
        if (stopping_) return;
        deliveries_.push_back({peer, pipe, shared});
        delivery_cv_.notify_one();
      });
    });
  }

  void PipeFailed(int32_t peer, const std::shared_ptr<tensorpipe::Pipe>& pipe,
                  const tensorpipe::Error& err) {
    // EOF is the peer stopping cleanly (uv reports it as a UVError named
    // EOF); not worth a log line.
    const bool clean = err.isOfType<tensorpipe::PipeClosedError>() ||
                       err.isOfType<tensorpipe::EOFError>() || err.what().rfind("EOF:", 0) == 0;
    if (!stopping_ && !clean) {
      Log("connection to rank " + std::to_string(peer) + " lost: " + err.what());
    }
    Forget(peer, pipe);
  }

  void Forget(int32_t peer, const std::shared_ptr<tensorpipe::Pipe>& pipe) {
    std::lock_guard<std::mutex> lock(mu_);
    if (pipes_[peer] == pipe) pipes_[peer].reset();
  }

  void DeliveryLoop() {
    while (true) {
      Delivery d;
      {
        std::unique_lock<std::mutex> lock(delivery_mu_);
        delivery_cv_.wait(lock, [&] { return stopping_ || !deliveries_.empty(); });
        if (stopping_) return;
        d = std::move(deliveries_.front());
        deliveries_.pop_front();
      }
      Status verified = tp_.verify_checksum ? tplink::VerifyIncoming(*d.plan) : Status::OK();
      if (!verified.ok()) {
        Log("dropped a message from rank " + std::to_string(d.rank) + ": " + verified.ToString());
      } else {
        Message m = std::move(d.plan->message);
        m.sender = d.rank;  // the connection, not the header, says who sent it
        d.plan.reset();
        if (!Deliver(std::move(m), [this] { return stopping_.load(); }).ok()) return;
      }
      ArmRead(d.rank, std::move(d.pipe));
    }
  }

  const TensorPipeOptions tp_;
  std::shared_ptr<tensorpipe::Context> ctx_;
  std::shared_ptr<tensorpipe::Listener> listener_;

  std::mutex stop_mu_;
  bool stopped_ = false;  // guarded by stop_mu_
  std::atomic<bool> stopping_{false};
  std::atomic<bool> started_{false};
  std::atomic<int> submitting_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<tensorpipe::Pipe>> pipes_;  // by rank
  int connected_ = 0;

  std::mutex delivery_mu_;
  std::condition_variable delivery_cv_;
  std::deque<Delivery> deliveries_;
  std::thread delivery_thread_;
};

}  // namespace

Result<std::unique_ptr<Transport>> MakeTensorPipeTransport(const TransportOptions& options) {
  XSILO_ASSIGN_OR_RETURN(TensorPipeOptions tp, tplink::ParseTensorPipeOptions(options));
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgument("tensorpipe: rank " + std::to_string(options.rank) +
                           " outside world of " + std::to_string(options.world_size));
  }
  return std::unique_ptr<Transport>(new TensorPipeTransport(options, std::move(tp)));
}

TransportFactory TensorPipeTransportFactory() {
  TransportFactory f;
  f.name = "tensorpipe";
  f.description =
      "TensorPipe (PyTorch RPC's transport): uv TCP, optional shm; basic channel or mpt lanes; "
      "tensors straight from and into Buffers";
  f.viable = [] { return Status::OK(); };
  f.create = [](const TransportOptions& o) { return MakeTensorPipeTransport(o); };
  f.options = &TensorPipeOptionTable();
  return f;
}

}  // namespace xsilo
