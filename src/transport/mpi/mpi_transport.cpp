#include "transport/mpi/mpi_transport.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "transport/builtin.h"
#include "transport/mpi/mpi_engine.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/log.h"

namespace xsilo {

namespace {

constinit LogComponent kLog("mpi");

struct MpiSettings {
  uint64_t chunk_bytes = mpi::kMaxChunkBytes;
  uint64_t inline_bytes = 16384;
  bool verify_checksum = true;
  int64_t poll_max_us = 1000;
};

}  // namespace

namespace {

Result<MpiSettings> ParseSettings(const TransportOptions& options) {
  const OptionTable& t = MpiOptionTable();
  const OptionMap& b = options.backend;
  XSILO_RETURN_IF_ERROR(t.CheckKeys(b));
  MpiSettings s;
  XSILO_ASSIGN_OR_RETURN(int64_t chunk, t.Int(b, "chunk_bytes"));
  s.chunk_bytes = static_cast<uint64_t>(chunk);
  XSILO_ASSIGN_OR_RETURN(int64_t inl, t.Int(b, "inline_bytes"));
  s.inline_bytes = static_cast<uint64_t>(inl);
  XSILO_ASSIGN_OR_RETURN(s.verify_checksum, t.Flag(b, "verify_checksum"));
  XSILO_ASSIGN_OR_RETURN(s.poll_max_us, t.Int(b, "poll_max_us"));
  return s;
}

// Rank and size announced by the launcher, or -1.
int32_t LauncherInt(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? -1 : std::atoi(v);
}

Status CheckRank(const TransportOptions& o, int32_t mpi_rank, int32_t mpi_size) {
  if (o.rank == mpi_rank && o.world_size == mpi_size) return Status::OK();
  return InvalidArgument("options say rank " + std::to_string(o.rank) + " of " +
                         std::to_string(o.world_size) + " but MPI_COMM_WORLD says rank " +
                         std::to_string(mpi_rank) + " of " + std::to_string(mpi_size) +
                         " (take them from OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE)");
}

struct SendJob {
  std::vector<int32_t> peers;
  Message message;
  SendCallback done;
};

class MpiTransport final : public Transport {
 public:
  MpiTransport(const TransportOptions& options, MpiSendMode mode, MpiSettings settings)
      : Transport(options), mode_(mode), settings_(settings) {}
  ~MpiTransport() override { Stop(); }

  std::string_view name() const override {
    return mode_ == MpiSendMode::kGather ? "mpi-buffer" : "mpi-generic";
  }

  Status Start() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (started_) return FailedPrecondition("MPI transport already started");
      if (stopped_) return FailedPrecondition("MPI transport was stopped");
    }
    XSILO_RETURN_IF_ERROR(mpi::MpiViable());
    XSILO_ASSIGN_OR_RETURN(mpi::Engine * engine, mpi::Engine::Get());
    XSILO_RETURN_IF_ERROR(CheckRank(options_, engine->world_rank(), engine->world_size()));
    mpi::LinkConfig config;
    config.rank = rank();
    config.world_size = world_size();
    // Headers travel inline for mpi-buffer but inside the data for
    // mpi-generic: allow them 1 MiB on top; the decoder checks exactly.
    config.max_data_bytes = options_.max_message_bytes + (uint64_t{1} << 20);
    config.ready_capacity = std::max<size_t>(1, options_.receive_queue_capacity);
    config.poll_max_us = settings_.poll_max_us;
    XSILO_ASSIGN_OR_RETURN(auto link, engine->Open(config, options_.connect_timeout));
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) {
      engine->Close(link);
      return Cancelled("transport stopped while starting");
    }
    engine_ = engine;
    link_ = std::move(link);
    started_ = true;
    sender_ = std::thread([this] { RunSender(); });
    receiver_ = std::thread([this] { RunReceiver(); });
    return Status::OK();
  }

  void Stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    stopping_.store(true, std::memory_order_release);
    jobs_cv_.notify_all();
    if (sender_.joinable()) sender_.join();
    std::deque<SendJob> leftover;
    {
      std::lock_guard<std::mutex> lock(mu_);
      leftover.swap(jobs_);
    }
    for (auto& j : leftover) j.done(Cancelled("transport stopped before the send started"));
    // Fails sends in flight; their callbacks have fired when Close returns.
    if (link_) {
      engine_->Close(link_);
      link_->CloseReady();  // also when the engine already shut down
    }
    CloseInbox();
    if (receiver_.joinable()) {
      if (receiver_.get_id() == std::this_thread::get_id()) {
        receiver_.detach();  // Stop called from our own handler
      } else {
        receiver_.join();
      }
    }
  }

  void SendAsync(int32_t peer, Message message, SendCallback done) override {
    Status s = CheckPeer(peer);
    if (!s.ok()) {
      done(s);
      return;
    }
    Enqueue({peer}, std::move(message), std::move(done));
  }

  void BroadcastAsync(std::vector<int32_t> peers, Message message, SendCallback done) override {
    if (peers.empty()) {
      done(Status::OK());
      return;
    }
    for (int32_t p : peers) {
      Status s = CheckPeer(p);
      if (!s.ok()) {
        done(s);
        return;
      }
    }
    Enqueue(std::move(peers), std::move(message), std::move(done));
  }

 private:
  void Enqueue(std::vector<int32_t> peers, Message message, SendCallback done) {
    Status s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_ || stopped_) {
        s = stopped_ ? Cancelled("transport stopped") : FailedPrecondition("transport not started");
      } else {
        message.sender = rank();
        jobs_.push_back({std::move(peers), std::move(message), std::move(done)});
      }
    }
    if (!s.ok()) {
      done(s);
      return;
    }
    jobs_cv_.notify_one();
  }

  // Encodes on its own thread (a checksum pass, plus the flatten copy for
  // mpi-generic) so neither callers nor the engine wait for it; one thread
  // keeps the send order.
  void RunSender() {
    for (;;) {
      SendJob job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        jobs_cv_.wait(lock, [&] { return stopped_ || !jobs_.empty(); });
        if (stopped_) return;  // Stop fails the rest
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      auto out = Prepare(job.message);
      if (!out.ok()) {
        job.done(out.status());
        continue;
      }
      engine_->Send(link_, std::move(job.peers), std::move(out).value(), std::move(job.done));
    }
  }

  Result<mpi::Outgoing> Prepare(const Message& message) const {
    EncodedFrame frame = EncodeMessage(message);
    mpi::Outgoing out;
    out.chunk_bytes = settings_.chunk_bytes;
    if (mode_ == MpiSendMode::kGather) {
      // The first segment is the header (prefix, message header, safetensors
      // header); the rest are the tensors' own Buffers.
      const Buffer head = frame.bytes.segments.front();
      out.segments.assign(frame.bytes.segments.begin() + 1, frame.bytes.segments.end());
      XSILO_ASSIGN_OR_RETURN(
          out.envelope,
          mpi::BuildMessageEnvelope(out.segments, out.chunk_bytes, head.size(),
                                    [&](uint8_t* d) { std::memcpy(d, head.data(), head.size()); }));
      return out;
    }
    if (frame.bytes.size <= settings_.inline_bytes) {
      // Small frame: flattened straight into the envelope, one MPI message.
      XSILO_ASSIGN_OR_RETURN(
          out.envelope,
          mpi::BuildMessageEnvelope({}, out.chunk_bytes, frame.bytes.size, [&](uint8_t* d) {
            frame.bytes.CopyRange(0, frame.bytes.size, d);
          }));
      return out;
    }
    XSILO_ASSIGN_OR_RETURN(Buffer flat, frame.bytes.Flatten());
    out.segments.push_back(std::move(flat));
    XSILO_ASSIGN_OR_RETURN(
        out.envelope, mpi::BuildMessageEnvelope(out.segments, out.chunk_bytes, 0, [](uint8_t*) {}));
    return out;
  }

  // Decodes received frames and hands them to the inbox (may block on a
  // full queue, which stops the engine from matching more).
  void RunReceiver() {
    DecodeLimits limits;
    limits.max_payload_bytes = options_.max_message_bytes;
    limits.verify_checksum = settings_.verify_checksum;
    for (;;) {
      auto r = link_->NextReceived();
      if (!r.ok()) return;
      auto m = DecodeMessage(r->frame, limits);
      if (!m.ok()) {
        XSILO_LOG(kLog, kWarn,
                  name() << ": dropping a message from rank " << r->source << ": "
                         << m.status().ToString());
        continue;
      }
      m->sender = r->source;
      if (!Deliver(std::move(m).value(), [this] { return stopping(); }).ok()) return;
    }
  }

  bool stopping() const { return stopping_.load(std::memory_order_acquire); }

  const MpiSendMode mode_;
  const MpiSettings settings_;
  std::mutex mu_;
  std::condition_variable jobs_cv_;
  std::deque<SendJob> jobs_;
  bool started_ = false;
  bool stopped_ = false;
  std::atomic<bool> stopping_{false};
  mpi::Engine* engine_ = nullptr;
  std::shared_ptr<mpi::Link> link_;
  std::thread sender_;
  std::thread receiver_;
};

TransportFactory MpiFactory(const std::string& name, MpiSendMode mode, std::string description) {
  TransportFactory f;
  f.name = name;
  f.description = std::move(description);
  f.viable = [] { return mpi::MpiViable(); };
  f.create = [mode](const TransportOptions& options) { return MakeMpiTransport(options, mode); };
  f.options = &MpiOptionTable();
  return f;
}

}  // namespace

Result<std::unique_ptr<Transport>> MakeMpiTransport(const TransportOptions& options,
                                                    MpiSendMode mode) {
  XSILO_ASSIGN_OR_RETURN(MpiSettings settings, ParseSettings(options));
  const int32_t env_rank = LauncherInt("OMPI_COMM_WORLD_RANK");
  const int32_t env_size = LauncherInt("OMPI_COMM_WORLD_SIZE");
  if (env_rank >= 0 && env_size > 0) XSILO_RETURN_IF_ERROR(CheckRank(options, env_rank, env_size));
  return std::unique_ptr<Transport>(std::make_unique<MpiTransport>(options, mode, settings));
}

TransportFactory MpiGenericTransportFactory() {
  return MpiFactory("mpi-generic", MpiSendMode::kFlatten,
                    "Open MPI, one rank per process (mpirun); each message serialized into one "
                    "contiguous buffer (mpi4py send)");
}

TransportFactory MpiBufferTransportFactory() {
  return MpiFactory("mpi-buffer", MpiSendMode::kGather,
                    "Open MPI, one rank per process (mpirun); tensors sent from their own "
                    "Buffers, no serialization copy (mpi4py Send)");
}

}  // namespace xsilo
