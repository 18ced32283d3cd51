// The grpc transport's internals, shared by grpc_transport.cpp (the
// class, the server side, delivery) and grpc_client.cpp (the client side:
// channels, sessions). gRPC headers stay inside src/transport/grpc.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/grpc/link.h"
#include "transport/grpc/options.h"
#include "transport/grpc/wire.h"
#include "xsilo/core/log.h"
#include "xsilo/transport/transport.h"

namespace xsilo::grpc_detail {

inline constinit LogComponent kGrpcLog("grpc");

using grpclink::Arrival;
using grpclink::Clock;
using grpclink::Frame;
using grpclink::GrpcOptions;
using grpclink::Incoming;
using grpclink::OutFrame;
using grpclink::PeerLink;
using grpclink::StreamSlot;

// Connect streams carry raw ByteBuffers: chunk bytes go out as slices of
// the message's Buffers and come in as views of gRPC's receive slices
// (wire.h). The bytes on the wire are the protobuf Frames of link.proto.
using RawStream = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
using RawClientStream = grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
constexpr char kConnectMethod[] = "/xsilo.grpclink.Link/Connect";

// Largest chunk frame accepted on the wire: the largest chunk_bytes plus
// room for the other fields.
constexpr int kMaxChunkFrame = (64 << 20) + (64 << 10);

// HTTP/2 settings: gRPC's defaults (16 KiB frames, a window grown by BDP
// probes from 64 KiB) cost one wake-up per few KiB on a busy host. Our own
// credit window bounds memory, so let HTTP/2 run with the same window.
constexpr int kMaxHttp2Frame = (1 << 24) - 1;
// Least time gRPC gives one connection attempt (see StartClient).
constexpr int kMinConnectTimeoutMs = 20000;
int Http2Window(const GrpcOptions& g);
Result<std::string> ReadPem(const std::string& path);
StatusCode FromGrpc(grpc::StatusCode c);
grpc::StatusCode ToGrpc(StatusCode c);
Status FromGrpcStatus(const grpc::Status& s, const std::string& context);
bool Refusal(StatusCode c);

class GrpcTransport final : public Transport {
 public:
  GrpcTransport(const TransportOptions& options, GrpcOptions g)
      : Transport(options), g_(std::move(g)) {
    if (g_.recycle_bytes > 0)
      pool_ = std::make_shared<BufferPool>(g_.recycle_bytes, std::chrono::seconds(5));
    links_.resize(static_cast<size_t>(options_.world_size));
    for (int32_t p = 0; p < options_.world_size; ++p) {
      if (p == rank() || (rank() != 0 && p != 0)) continue;
      grpclink::LinkConfig c;
      c.peer = p;
      c.chunk_bytes = g_.chunk_bytes;
      c.window_bytes = g_.window_bytes;
      c.limits.max_message_bytes = options_.max_message_bytes;
      c.pool = pool_;
      c.sink = [this](Arrival a) { QueueArrival(std::move(a)); };
      links_[static_cast<size_t>(p)] = std::make_unique<PeerLink>(std::move(c));
    }
  }
  ~GrpcTransport() override { Stop(); }

  std::string_view name() const override { return "grpc"; }

  Status Start() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (started_) return FailedPrecondition("grpc transport already started");
      if (stopped_) return FailedPrecondition("grpc transport was stopped");
      started_ = true;
    }
    Status s = rank() == 0 ? StartServer() : StartClient();
    if (!s.ok()) Stop();
    return s;
  }

  void Stop() override {
    bool started;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
      started = started_;
    }
    // From here on new sends fail and arrivals are refused ("receiver
    // stopped"); what was already sent or received is settled by the drain.
    CloseInbox();
    if (started && g_.drain_ms > 0) Drain();
    stopping_.store(true);
    wake_.notify_all();
    arrivals_cv_.notify_all();
    for (auto& l : links_) {
      if (l) l->Close(Cancelled("transport stopped"));
    }
    if (session_thread_.joinable()) session_thread_.join();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (delivery_thread_.joinable()) delivery_thread_.join();
    if (janitor_thread_.joinable()) janitor_thread_.join();
    if (server_) server_->Wait();
    server_.reset();
  }

  void SendAsync(int32_t peer, Message message, SendCallback done) override {
    Status s = CheckPeer(peer);
    if (s.ok() && rank() != 0 && peer != 0)
      s = InvalidArgument("a grpc client reaches only rank 0, not peer " + std::to_string(peer));
    if (s.ok()) s = Usable();
    if (!s.ok()) {
      done(s);
      return;
    }
    message.sender = rank();
    const int stripe = TakeStripe(&message);
    links_[static_cast<size_t>(peer)]->Enqueue(
        grpclink::EncodeForLink(message, grpclink::kPrefixLastBytes), std::move(done), stripe);
  }

  // Encodes once; every peer's sends share the one frame (and through it
  // the message's tensor Buffers).
  void BroadcastAsync(std::vector<int32_t> peers, Message message, SendCallback done) override {
    Status s = Usable();
    for (int32_t p : peers) {
      if (!s.ok()) break;
      s = CheckPeer(p);
      if (s.ok() && rank() != 0 && p != 0)
        s = InvalidArgument("a grpc client reaches only rank 0, not peer " + std::to_string(p));
    }
    if (!s.ok() || peers.empty()) {
      done(s);
      return;
    }
    message.sender = rank();
    const int stripe = TakeStripe(&message);
    OutFrame frame = grpclink::EncodeForLink(message, grpclink::kPrefixLastBytes);
    message = Message();
    auto joined = JoinBroadcast(peers.size(), std::move(done));
    for (int32_t peer : peers) {
      links_[static_cast<size_t>(peer)]->Enqueue(frame, joined(peer), stripe);
    }
  }

  // gRPC service entry: one client stream, on a gRPC server thread.
  grpc::Status Serve(grpc::ServerContext* ctx, RawStream* rw);

 private:
  // The message's kStripeParam, removed (0: none, or not a positive int).
  static int TakeStripe(Message* m) {
    auto it = m->params.find(kStripeParam);
    if (it == m->params.end()) return 0;
    auto k = m->GetInt(kStripeParam);
    m->params.erase(it);
    return k.ok() && *k > 0 ? static_cast<int>(std::min<int64_t>(*k, 64)) : 0;
  }

  Status Usable() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) return FailedPrecondition("grpc transport not started");
    if (stopped_) return Cancelled("transport stopped");
    return Status::OK();
  }
  bool stopping() const { return stopping_.load(); }
  void Drain();

  Status StartServer();
  Status StartClient();
  // (Re)creates channels_ and connect_, one channel per stream.
  void MakeChannels();
  void StartWorkers();
  void SessionLoop();
  Status RunSession(bool* was_up);
  Status CheckHello(const grpclink::Hello& h) const;

  void QueueArrival(Arrival a) {
    {
      std::lock_guard<std::mutex> lock(arrivals_mu_);
      arrivals_.push_back(std::move(a));
    }
    arrivals_cv_.notify_one();
  }
  void DeliveryLoop();
  void JanitorLoop();
  // What the transport refuses, drops or loses, at warn.
  void Log(const std::string& what) const {
    XSILO_LOG(kGrpcLog, kWarn, "rank " << rank() << ": " << what);
  }

  const GrpcOptions g_;
  std::shared_ptr<BufferPool> pool_;              // receive buffers; null if recycle_bytes=0
  std::vector<std::unique_ptr<PeerLink>> links_;  // by rank; null for self / unreachable

  std::mutex mu_;
  std::condition_variable wake_;  // Start waiting for the first session, backoff sleeps
  bool started_ = false, stopped_ = false;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};  // Stop is draining: the client does not reconnect

  // Server.
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;

  // Client.
  std::shared_ptr<grpc::ChannelCredentials> creds_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;             // the session thread's
  std::vector<std::unique_ptr<grpc::internal::RpcMethod>> connect_;  // per channel
  std::thread session_thread_;
  bool first_session_up_ = false;  // guarded by mu_
  Status session_error_;           // last failure to establish a session; guarded by mu_
  bool refused_ = false;           // the server refused us; guarded by mu_

  std::mutex arrivals_mu_;
  std::condition_variable arrivals_cv_;
  std::deque<Arrival> arrivals_;
  std::thread delivery_thread_, janitor_thread_;
};

// The Link service's Connect method over raw ByteBuffers (what the
// generated Link::Service registers, with Frame in place of ByteBuffer).
class LinkService final : public grpc::Service {
 public:
  explicit LinkService(GrpcTransport* t) {
    AddMethod(new grpc::internal::RpcServiceMethod(
        kConnectMethod, grpc::internal::RpcMethod::BIDI_STREAMING,
        new grpc::internal::BidiStreamingHandler<GrpcTransport, grpc::ByteBuffer, grpc::ByteBuffer>(
            [](GrpcTransport* transport, grpc::ServerContext* ctx, RawStream* rw) {
              return transport->Serve(ctx, rw);
            },
            t)));
  }
};

// Both ends of a stream write the same way.
template <typename Stream>
void SetWriters(StreamSlot* slot, Stream* rw) {
  slot->write = [rw](const Frame& f) { return rw->Write(grpclink::FrameToByteBuffer(f)); };
  slot->write_chunk = [rw](const grpclink::ChunkOut& c) {
    return rw->Write(grpclink::ChunkToByteBuffer(c));
  };
}

// Reads frames into `link` until the stream ends; false on a protocol
// violation.
template <typename Stream>
bool ReadFrames(Stream* rw, PeerLink& link, StreamSlot* slot) {
  grpc::ByteBuffer bytes;
  Incoming in;
  while (rw->Read(&bytes)) {
    if (!grpclink::ParseIncoming(bytes, &in)) return false;
    bytes.Clear();
    if (!(in.is_chunk ? link.OnChunk(slot, in.chunk) : link.OnFrame(slot, in.frame))) return false;
  }
  return true;
}

// One frame, or false when the stream ended or it was not a Frame.
template <typename Stream>
bool ReadFrame(Stream* rw, Frame* frame) {
  grpc::ByteBuffer bytes;
  Incoming in;
  if (!rw->Read(&bytes) || !grpclink::ParseIncoming(bytes, &in) || in.is_chunk) return false;
  *frame = std::move(in.frame);
  return true;
}

}  // namespace xsilo::grpc_detail
