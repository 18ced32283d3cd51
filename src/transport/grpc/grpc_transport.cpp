#include "transport/grpc/grpc_transport.h"

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "transport/builtin.h"
#include "transport/grpc/grpc_internal.h"
#include "transport/grpc/unary_transport.h"
#include "xsilo/core/secret.h"

namespace xsilo {
namespace grpc_detail {

int Http2Window(const GrpcOptions& g) {
  return static_cast<int>(std::clamp<uint64_t>(g.window_bytes, 1 << 20, 1 << 30));
}

Result<std::string> ReadPem(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read PEM file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

StatusCode FromGrpc(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK:
      return StatusCode::kOk;
    case grpc::StatusCode::CANCELLED:
      return StatusCode::kCancelled;
    case grpc::StatusCode::INVALID_ARGUMENT:
      return StatusCode::kInvalidArgument;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return StatusCode::kTimeout;
    case grpc::StatusCode::NOT_FOUND:
      return StatusCode::kNotFound;
    case grpc::StatusCode::PERMISSION_DENIED:
      return StatusCode::kPermissionDenied;
    case grpc::StatusCode::UNAUTHENTICATED:
      return StatusCode::kUnauthenticated;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return StatusCode::kResourceExhausted;
    case grpc::StatusCode::FAILED_PRECONDITION:
      return StatusCode::kFailedPrecondition;
    case grpc::StatusCode::OUT_OF_RANGE:
      return StatusCode::kOutOfRange;
    case grpc::StatusCode::UNIMPLEMENTED:
      return StatusCode::kUnimplemented;
    case grpc::StatusCode::UNAVAILABLE:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kInternal;
  }
}

grpc::StatusCode ToGrpc(StatusCode c) {
  switch (c) {
    case StatusCode::kOk:
      return grpc::StatusCode::OK;
    case StatusCode::kPermissionDenied:
      return grpc::StatusCode::PERMISSION_DENIED;
    case StatusCode::kUnauthenticated:
      return grpc::StatusCode::UNAUTHENTICATED;
    case StatusCode::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case StatusCode::kCancelled:
      return grpc::StatusCode::CANCELLED;
    case StatusCode::kAlreadyExists:
      return grpc::StatusCode::ALREADY_EXISTS;
    case StatusCode::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case StatusCode::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    default:
      return grpc::StatusCode::INTERNAL;
  }
}

Status FromGrpcStatus(const grpc::Status& s, const std::string& context) {
  if (s.ok()) return Status::OK();
  std::string msg = context + ": " + s.error_message();
  if (!s.error_details().empty()) msg += " (" + s.error_details() + ")";
  return Status(FromGrpc(s.error_code()), msg);
}

bool Refusal(StatusCode c) {
  return c == StatusCode::kPermissionDenied || c == StatusCode::kUnauthenticated ||
         c == StatusCode::kInvalidArgument;
}

// Clean stop (docs/transport-grpc.md, "Stop"): every link refuses the
// peer's chunks from now on, waits for the outcomes of our messages and
// writes the outcomes we owe, says Goodbye on each stream, and waits for
// the peer to end the session. All links share one deadline.
void GrpcTransport::Drain() {
  const auto deadline = Clock::now() + std::chrono::milliseconds(g_.drain_ms);
  draining_.store(true);
  for (auto& l : links_) {
    if (l) l->BeginDrain();
  }
  std::vector<PeerLink*> said_goodbye;
  for (auto& l : links_) {
    if (l && l->Drain(deadline)) said_goodbye.push_back(l.get());
  }
  for (PeerLink* l : said_goodbye) l->WaitBroken(deadline);
}

void GrpcTransport::StartWorkers() {
  delivery_thread_ = std::thread([this] { DeliveryLoop(); });
  janitor_thread_ = std::thread([this] { JanitorLoop(); });
}

Status GrpcTransport::StartServer() {
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (g_.tls()) {
    grpc::SslServerCredentialsOptions so(
        g_.tls_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    if (!g_.tls_ca.empty()) {
      XSILO_ASSIGN_OR_RETURN(so.pem_root_certs, ReadPem(g_.tls_ca));
    }
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    XSILO_ASSIGN_OR_RETURN(pair.private_key, ReadPem(g_.tls_key));
    XSILO_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(g_.tls_cert));
    so.pem_key_cert_pairs.push_back(std::move(pair));
    creds = grpc::SslServerCredentials(so);
  }
  service_ = std::make_unique<LinkService>(this);
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(options_.address, creds, &port);
  b.RegisterService(service_.get());
  b.SetMaxReceiveMessageSize(g_.mode == "unary" ? -1 : kMaxChunkFrame);
  b.SetMaxSendMessageSize(-1);
  // gRPC sets SO_REUSEPORT by default: a second server on the same port
  // would then bind too and the kernel would split our clients between the
  // two. One port, one server: binding a taken port fails.
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  b.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  b.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, Http2Window(g_));
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxHttp2Frame);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(g_.keepalive_ms));
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(g_.keepalive_ms));
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                       static_cast<int>(std::min<int64_t>(g_.keepalive_ms / 2, 5000)));
  server_ = b.BuildAndStart();
  if (!server_ || port == 0) {
    server_.reset();
    return Unavailable("grpc server cannot listen on '" + options_.address + "'");
  }
  StartWorkers();
  return Status::OK();
}

Status GrpcTransport::CheckHello(const grpclink::Hello& h) const {
  if (!g_.token.empty() && !SecretEquals(h.token(), g_.token))
    return PermissionDenied("client rank " + std::to_string(h.rank()) +
                            " presented a wrong or missing token");
  if (h.world_size() != world_size())
    return InvalidArgument("client says world size " + std::to_string(h.world_size()) +
                           ", server has " + std::to_string(world_size()));
  if (h.rank() <= 0 || h.rank() >= world_size())
    return InvalidArgument("client rank " + std::to_string(h.rank()) + " outside 1.." +
                           std::to_string(world_size() - 1));
  if (h.stream_count() < 1 || h.stream_count() > 64 || h.stream_index() < 0 ||
      h.stream_index() >= h.stream_count())
    return InvalidArgument("bad stream " + std::to_string(h.stream_index()) + " of " +
                           std::to_string(h.stream_count()));
  return Status::OK();
}

grpc::Status GrpcTransport::Serve(grpc::ServerContext* ctx, RawStream* rw) {
  Frame in;
  if (!ReadFrame(rw, &in) || !in.has_hello())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "expected a Hello frame first");
  const grpclink::Hello hello = in.hello();
  Status ok = CheckHello(hello);
  PeerLink* link = ok.ok() ? links_[static_cast<size_t>(hello.rank())].get() : nullptr;
  StreamSlot slot;
  slot.index = hello.stream_index();
  SetWriters(&slot, rw);
  slot.cancel = [ctx] { ctx->TryCancel(); };
  if (ok.ok()) ok = link->Attach(hello.session(), hello.stream_count(), &slot);
  Frame ack;
  ack.mutable_hello_ack()->set_code(static_cast<int32_t>(ok.code()));
  if (!ok.ok()) {
    ack.mutable_hello_ack()->set_error(ok.message());
    rw->Write(grpclink::FrameToByteBuffer(ack));
    if (!stopping()) Log("refused a client stream from " + ctx->peer() + ": " + ok.ToString());
    return grpc::Status(ToGrpc(ok.code()), ok.message());
  }
  if (!rw->Write(grpclink::FrameToByteBuffer(ack))) {
    link->Break(slot.session, Unavailable("client went away during the handshake"));
    link->Detach(&slot);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "handshake write failed");
  }
  std::thread writer([link, &slot] { link->WriterLoop(&slot); });
  const bool violation = !ReadFrames(rw, *link, &slot) && !stopping();
  if (violation) Log("protocol violation from peer " + std::to_string(hello.rank()));
  link->Break(slot.session, Unavailable("connection to peer " + std::to_string(hello.rank()) +
                                        " lost before delivery was confirmed"));
  ctx->TryCancel();
  writer.join();
  link->Detach(&slot);
  return grpc::Status::OK;
}

void GrpcTransport::DeliveryLoop() {
  DecodeLimits limits;
  limits.max_payload_bytes = options_.max_message_bytes;
  for (;;) {
    Arrival a;
    {
      std::unique_lock<std::mutex> lock(arrivals_mu_);
      arrivals_cv_.wait(lock, [&] { return stopping() || !arrivals_.empty(); });
      if (stopping()) return;
      a = std::move(arrivals_.front());
      arrivals_.pop_front();
    }
    Status s = a.message.status;
    if (s.ok()) {
      limits.payload_checksum = a.message.payload_checksum;
      auto m = DecodeMessage(a.message.frame, limits);
      a.message.frame = Buffer();
      if (!m.ok()) {
        s = m.status();
      } else if (!a.link->Current(a.session)) {
        s = Unavailable("connection lost before delivery");
      } else {
        m->sender = a.link->peer();
        s = Deliver(std::move(m).value(), [this] { return stopping(); });
      }
    }
    if (!s.ok() && !stopping()) {
      Log("dropped message " + std::to_string(a.message.message_id) + " from peer " +
          std::to_string(a.link->peer()) + ": " + s.ToString());
    }
    a.link->OnDelivered(a.session, a.message.message_id, s);
  }
}

void GrpcTransport::JanitorLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping()) {
    wake_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping(); });
    lock.unlock();
    for (auto& l : links_) {
      if (l) l->ExpireQueued(options_.connect_timeout);
    }
    if (pool_) pool_->Trim();
    Buffer::TrimIdleCache();
    lock.lock();
  }
}

}  // namespace grpc_detail

using grpc_detail::GrpcOptions;
using grpc_detail::GrpcTransport;

Result<std::unique_ptr<Transport>> MakeGrpcTransport(const TransportOptions& options) {
  XSILO_ASSIGN_OR_RETURN(GrpcOptions g, grpclink::ParseGrpcOptions(options));
  if (g.mode == "unary") {
    if (g.tls()) return Unimplemented("grpc mode=unary has no TLS; it is a plaintext baseline");
    return grpclink::MakeUnaryTransport(options, g);
  }
  return std::unique_ptr<Transport>(std::make_unique<GrpcTransport>(options, std::move(g)));
}

TransportFactory GrpcTransportFactory() {
  TransportFactory f;
  f.name = "grpc";
  f.description =
      "gRPC: clients dial out, chunked frames over bidi streams, flow control, striping, TLS";
  f.viable = [] { return Status::OK(); };
  f.create = [](const TransportOptions& options) { return MakeGrpcTransport(options); };
  f.options = &GrpcOptionTable();
  return f;
}

}  // namespace xsilo
