// mode=unary: the paper's / FedML's gRPC baseline. Every rank runs a gRPC
// server (rank 0 at options.address, rank r at the same host, port + r) and
// each message is one unary Deliver call to the receiver's server carrying
// the whole serialized frame, flattened once per receiver. Kept for
// side-by-side benchmarks; the stream mode is the one to deploy.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <thread>

#include "transport/grpc/grpc_internal.h"
#include "transport/grpc/link.grpc.pb.h"
#include "transport/grpc/options.h"
#include "transport/grpc/unary_transport.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/secret.h"

namespace xsilo::grpclink {

namespace {

// Protobuf messages stop at 2 GiB; leave room for the other fields.
constexpr uint64_t kMaxUnaryFrame = (uint64_t{1} << 31) - (uint64_t{1} << 20);

Result<std::string> RankAddress(const std::string& address, int32_t rank) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos) return InvalidArgument("address '" + address + "' has no port");
  int port = 0;
  try {
    port = std::stoi(address.substr(colon + 1));
  } catch (...) {
    return InvalidArgument("address '" + address + "' has no numeric port");
  }
  if (port + rank > 65535)
    return InvalidArgument("port " + std::to_string(port + rank) + " too large");
  return address.substr(0, colon + 1) + std::to_string(port + rank);
}

struct Pending {
  Message message;
  SendCallback done;
};

class UnaryTransport;

class UnaryService final : public Link::Service {
 public:
  explicit UnaryService(UnaryTransport* t) : t_(t) {}
  grpc::Status Deliver(grpc::ServerContext* ctx, const UnaryRequest* req,
                       UnaryReply* reply) override;

 private:
  UnaryTransport* t_;
};

class UnaryTransport final : public Transport {
 public:
  UnaryTransport(const TransportOptions& options, GrpcOptions g)
      : Transport(options), g_(std::move(g)), peers_(static_cast<size_t>(options.world_size)) {}
  ~UnaryTransport() override { Stop(); }

  std::string_view name() const override { return "grpc"; }

  Status Start() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (started_ || stopped_) return FailedPrecondition("grpc transport already started");
      started_ = true;
    }
    XSILO_ASSIGN_OR_RETURN(std::string self, RankAddress(options_.address, rank()));
    service_ = std::make_unique<UnaryService>(this);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort(self, grpc::InsecureServerCredentials(), &port);
    b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a taken port fails, not shares
    b.RegisterService(service_.get());
    b.SetMaxReceiveMessageSize(-1);
    server_ = b.BuildAndStart();
    if (!server_ || port == 0) return Unavailable("grpc unary: cannot listen on '" + self + "'");
    for (int32_t p = 0; p < world_size(); ++p) {
      if (p == rank() || (rank() != 0 && p != 0)) continue;
      XSILO_ASSIGN_OR_RETURN(std::string addr, RankAddress(options_.address, p));
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(-1);
      args.SetMaxSendMessageSize(-1);
      auto& peer = peers_[static_cast<size_t>(p)];
      peer = std::make_unique<Peer>();
      peer->stub =
          Link::NewStub(grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args));
      Peer* raw = peer.get();
      peer->worker = std::thread([this, raw, p] { SendLoop(raw, p); });
    }
    return Status::OK();
  }

  void Stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    stopping_ = true;
    CloseInbox();
    for (auto& p : peers_) {
      if (!p) continue;
      std::lock_guard<std::mutex> lock(p->mu);
      if (p->active) p->active->TryCancel();
      p->cv.notify_all();
    }
    for (auto& p : peers_) {
      if (p && p->worker.joinable()) p->worker.join();
    }
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
      server_->Wait();
    }
    for (auto& p : peers_) {
      if (!p) continue;
      for (auto& q : p->queue) q.done(Cancelled("transport stopped"));
      p->queue.clear();
    }
  }

  void SendAsync(int32_t peer, Message message, SendCallback done) override {
    Status s = CheckPeer(peer);
    if (s.ok() && rank() != 0 && peer != 0)
      s = InvalidArgument("a grpc client reaches only rank 0, not peer " + std::to_string(peer));
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_) s = FailedPrecondition("grpc transport not started");
      if (stopped_) s = Cancelled("transport stopped");
    }
    if (!s.ok()) {
      done(s);
      return;
    }
    message.sender = rank();
    Peer& p = *peers_[static_cast<size_t>(peer)];
    {
      std::lock_guard<std::mutex> lock(p.mu);
      if (!stopping_) {
        p.queue.push_back({std::move(message), std::move(done)});
        p.cv.notify_all();
        return;
      }
    }
    done(Cancelled("transport stopped"));
  }

  Status Receive(const UnaryRequest& req) {
    if (!g_.token.empty() && !SecretEquals(req.token(), g_.token))
      return PermissionDenied("wrong or missing token from rank " + std::to_string(req.sender()));
    if (req.sender() < 0 || req.sender() >= world_size() || req.sender() == rank())
      return InvalidArgument("bad sender rank " + std::to_string(req.sender()));
    if (req.frame().size() > options_.max_message_bytes)
      return ResourceExhausted("message above max_message_bytes");
    // The baseline's receive-side copy: protobuf bytes -> aligned Buffer.
    Buffer frame = Buffer::CopyFrom(req.frame());
    DecodeLimits limits;
    limits.max_payload_bytes = options_.max_message_bytes;
    XSILO_ASSIGN_OR_RETURN(Message m, DecodeMessage(frame, limits));
    m.sender = req.sender();
    return Deliver(std::move(m), [this] { return stopping_.load(); });
  }

 private:
  struct Peer {
    std::unique_ptr<Link::Stub> stub;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Pending> queue;
    grpc::ClientContext* active = nullptr;
    std::thread worker;
  };

  // One call at a time per peer keeps per-peer order.
  void SendLoop(Peer* p, int32_t peer) {
    for (;;) {
      Pending next;
      {
        std::unique_lock<std::mutex> lock(p->mu);
        p->cv.wait(lock, [&] { return stopping_.load() || !p->queue.empty(); });
        if (stopping_) return;
        next = std::move(p->queue.front());
        p->queue.pop_front();
      }
      EncodedFrame frame = EncodeMessage(next.message);
      next.message = Message();
      if (frame.bytes.size > kMaxUnaryFrame) {
        next.done(ResourceExhausted("mode=unary carries at most 2 GiB per message; this one is " +
                                    std::to_string(frame.bytes.size) + " bytes"));
        continue;
      }
      UnaryRequest req;
      req.set_sender(rank());
      req.set_token(g_.token);
      // The whole message, copied once per receiver, as the baseline does.
      std::string* bytes = req.mutable_frame();
      bytes->resize(frame.bytes.size);
      frame.bytes.CopyRange(0, frame.bytes.size, reinterpret_cast<uint8_t*>(bytes->data()));
      grpc::ClientContext ctx;
      ctx.set_wait_for_ready(true);
      ctx.set_deadline(std::chrono::system_clock::now() + options_.connect_timeout +
                       std::chrono::seconds(1 + frame.bytes.size / (10u << 20)));
      {
        std::lock_guard<std::mutex> lock(p->mu);
        if (stopping_) {
          next.done(Cancelled("transport stopped"));
          return;
        }
        p->active = &ctx;
      }
      UnaryReply reply;
      grpc::Status st = p->stub->Deliver(&ctx, req, &reply);
      {
        std::lock_guard<std::mutex> lock(p->mu);
        p->active = nullptr;
      }
      Status result;
      if (!st.ok()) {
        result = Status(stopping_ ? StatusCode::kCancelled : StatusCode::kUnavailable,
                        "unary call to peer " + std::to_string(peer) + ": " + st.error_message());
      } else if (reply.code() != 0) {
        int32_t code = reply.code();
        if (code < 0 || code > static_cast<int32_t>(StatusCode::kInternal))
          code = static_cast<int32_t>(StatusCode::kInternal);
        result = Status(static_cast<StatusCode>(code), "peer: " + reply.error());
      }
      next.done(result);
    }
  }

  const GrpcOptions g_;
  std::mutex mu_;
  bool started_ = false, stopped_ = false;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<UnaryService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<Peer>> peers_;
};

grpc::Status UnaryService::Deliver(grpc::ServerContext*, const UnaryRequest* req,
                                   UnaryReply* reply) {
  Status s = t_->Receive(*req);
  reply->set_code(static_cast<int32_t>(s.code()));
  if (!s.ok()) reply->set_error(s.message());
  return grpc::Status::OK;
}

}  // namespace

std::unique_ptr<Transport> MakeUnaryTransport(const TransportOptions& options,
                                              const GrpcOptions& g) {
  return std::make_unique<UnaryTransport>(options, g);
}

}  // namespace xsilo::grpclink
