#include "transport/grpc/grpc_transport.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "transport/builtin.h"
#include "transport/grpc/link.h"
#include "transport/grpc/options.h"
#include "transport/grpc/unary_transport.h"
#include "transport/grpc/wire.h"

namespace xsilo {

namespace {

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

bool SameToken(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i % (b.empty() ? 1 : b.size())];
  return diff == 0 && !(b.empty() && !a.empty());
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
  void Log(const std::string& what) const {
    std::fprintf(stderr, "xsilo grpc rank %d: %s\n", rank(), what.c_str());
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
  if (!g_.token.empty() && !SameToken(h.token(), g_.token))
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

Status GrpcTransport::StartClient() {
  creds_ = grpc::InsecureChannelCredentials();
  if (g_.tls()) {
    grpc::SslCredentialsOptions so;
    XSILO_ASSIGN_OR_RETURN(so.pem_root_certs, ReadPem(g_.tls_ca));
    if (!g_.tls_cert.empty()) {
      XSILO_ASSIGN_OR_RETURN(so.pem_private_key, ReadPem(g_.tls_key));
      XSILO_ASSIGN_OR_RETURN(so.pem_cert_chain, ReadPem(g_.tls_cert));
    }
    creds_ = grpc::SslCredentials(so);
  }
  MakeChannels();
  StartWorkers();
  session_thread_ = std::thread([this] { SessionLoop(); });
  std::unique_lock<std::mutex> lock(mu_);
  bool done = wake_.wait_for(lock, options_.connect_timeout,
                             [&] { return first_session_up_ || refused_ || stopping(); });
  if (first_session_up_) return Status::OK();
  if (refused_) return session_error_;
  if (stopping()) return Cancelled("transport stopped during Start");
  (void)done;
  std::string why = session_error_.ok() ? "no answer" : session_error_.ToString();
  return Unavailable("could not connect to grpc server at " + options_.address + " within " +
                     std::to_string(options_.connect_timeout.count()) + " ms: " + why);
}

void GrpcTransport::MakeChannels() {
  channels_.clear();
  connect_.clear();
  for (int i = 0; i < g_.streams; ++i) {
    grpc::ChannelArguments args;
    // Distinct args and a local pool: each channel gets its own subchannel,
    // hence its own TCP connection.
    args.SetInt("xsilo.channel_index", i);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxReceiveMessageSize(g_.mode == "unary" ? -1 : kMaxChunkFrame);
    args.SetMaxSendMessageSize(-1);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, Http2Window(g_));
    args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxHttp2Frame);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(g_.keepalive_ms));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(g_.keepalive_ms));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(g_.initial_backoff_ms));
    // gRPC gives each connection attempt max(this, the backoff) to finish
    // (its MIN_CONNECT_TIMEOUT): set to initial_backoff_ms (100 ms), an
    // attempt over a 167 ms round trip (TCP and HTTP/2 handshakes, 2-3 round
    // trips) was cut every time until the backoff had grown past it, and a
    // client took 7 s to connect to ca-hk with one stream, and more than
    // 120 s with 16. gRPC's default, 20 s; RunSession's own attempt timeout
    // still abandons a stalled handshake sooner.
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kMinConnectTimeoutMs);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(g_.max_backoff_ms));
    if (!g_.tls_server_name.empty()) args.SetSslTargetNameOverride(g_.tls_server_name);
    auto ch = grpc::CreateCustomChannel(options_.address, creds_, args);
    channels_.push_back(ch);
    connect_.push_back(std::make_unique<grpc::internal::RpcMethod>(
        kConnectMethod, grpc::internal::RpcMethod::BIDI_STREAMING, ch));
  }
}

void GrpcTransport::SessionLoop() {
  std::mt19937_64 rng(std::random_device{}());
  int64_t backoff = g_.initial_backoff_ms;
  while (!stopping()) {
    bool was_up = false;
    Status s = RunSession(&was_up);
    if (stopping() || draining_.load()) break;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok()) session_error_ = s;
      if (!s.ok() && Refusal(s.code())) refused_ = true;
    }
    if (!s.ok() && Refusal(s.code())) {
      Log("server refused this client: " + s.ToString());
      wake_.notify_all();
      links_[0]->Close(s);
      return;
    }
    if (was_up) {
      backoff = g_.initial_backoff_ms;
      Log("connection to the server lost; reconnecting");
    }
    // Exponential backoff with +-20% jitter.
    std::uniform_real_distribution<double> jitter(0.8, 1.2);
    auto delay = std::chrono::milliseconds(static_cast<int64_t>(backoff * jitter(rng)));
    backoff = std::min(backoff * 2, g_.max_backoff_ms);
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, delay, [&] { return stopping(); });
    }
    // This loop's backoff decides when to try again, not the channels':
    // after two refused connects (a client started before its server
    // listened) a channel stayed in TRANSIENT_FAILURE for max_backoff_ms
    // (5 s), resetting its backoff did not reconnect it, and the jobs of
    // `xsilo bench e2e`, whose parties start together, lost up to 6 s in
    // their first round. Fresh channels connect at once.
    if (!was_up && !stopping()) MakeChannels();
  }
}

// One session: opens every stream, exchanges Hello/HelloAck, then runs
// readers and writers until the session ends. *was_up tells whether it got
// that far.
Status GrpcTransport::RunSession(bool* was_up) {
  PeerLink& link = *links_[0];
  const int n = g_.streams;
  uint64_t session = 0;
  {
    std::random_device rd;
    while (session == 0) session = (uint64_t{rd()} << 32) ^ rd();
  }
  struct ClientStream {
    StreamSlot slot;
    grpc::ClientContext ctx;
    std::unique_ptr<RawClientStream> rw;
    std::thread reader, writer;
  };
  std::vector<std::unique_ptr<ClientStream>> cs;
  for (int i = 0; i < n; ++i) cs.push_back(std::make_unique<ClientStream>());

  // One attempt's handshake gets a quarter of the connect timeout (2..15 s):
  // an attempt that stalls (a connection the server never answered) is
  // abandoned and retried instead of using up the whole connect timeout.
  const auto attempt_timeout = std::clamp<Clock::duration>(
      options_.connect_timeout / 4, std::chrono::seconds(2), std::chrono::seconds(15));
  std::mutex hs_mu;
  std::condition_variable hs_cv;
  bool hs_done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(hs_mu);
    auto deadline = Clock::now() + attempt_timeout;
    while (!hs_done && Clock::now() < deadline) {
      hs_cv.wait_for(lock, std::chrono::milliseconds(50));
      if (stopping()) break;
    }
    if (!hs_done) {
      for (auto& c : cs) c->ctx.TryCancel();
    }
  });
  // Every channel starts connecting now: the Hello loop below would
  // otherwise connect them one after another (16 streams to ca-hk: 5.5 s).
  for (auto& ch : channels_) (void)ch->GetState(/*try_to_connect=*/true);
  Status failure;
  for (int i = 0; i < n && failure.ok(); ++i) {
    ClientStream& c = *cs[static_cast<size_t>(i)];
    c.rw.reset(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channels_[static_cast<size_t>(i)].get(), *connect_[static_cast<size_t>(i)], &c.ctx));
    Frame hello;
    auto* h = hello.mutable_hello();
    h->set_rank(rank());
    h->set_world_size(world_size());
    h->set_session(session);
    h->set_stream_index(i);
    h->set_stream_count(n);
    h->set_token(g_.token);
    if (!c.rw->Write(grpclink::FrameToByteBuffer(hello)))
      failure = Unavailable("stream " + std::to_string(i) + " closed");
  }
  for (int i = 0; i < n && failure.ok(); ++i) {
    ClientStream& c = *cs[static_cast<size_t>(i)];
    Frame ack;
    if (!ReadFrame(c.rw.get(), &ack)) {
      failure = Unavailable("stream " + std::to_string(i) + " closed during the handshake");
    } else if (!ack.has_hello_ack()) {
      failure = Internal("server answered Hello with something else");
    } else if (ack.hello_ack().code() != 0) {
      int32_t code = ack.hello_ack().code();
      if (code < 0 || code > static_cast<int32_t>(StatusCode::kInternal))
        code = static_cast<int32_t>(StatusCode::kInternal);
      failure = Status(static_cast<StatusCode>(code), "server refused: " + ack.hello_ack().error());
    }
  }
  {
    std::lock_guard<std::mutex> lock(hs_mu);
    hs_done = true;
  }
  hs_cv.notify_all();
  watchdog.join();

  if (failure.ok()) {
    for (int i = 0; i < n && failure.ok(); ++i) {
      ClientStream& c = *cs[static_cast<size_t>(i)];
      c.slot.index = i;
      SetWriters(&c.slot, c.rw.get());
      c.slot.cancel = [&c] { c.ctx.TryCancel(); };
      failure = link.Attach(session, n, &c.slot);
    }
  }
  if (failure.ok()) {
    *was_up = true;
    for (auto& up : cs) {
      ClientStream* c = up.get();
      c->writer = std::thread([&link, c] { link.WriterLoop(&c->slot); });
      c->reader = std::thread([&link, c, session] {
        ReadFrames(c->rw.get(), link, &c->slot);
        link.Break(session,
                   Unavailable("connection to the server lost before delivery was confirmed"));
      });
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      first_session_up_ = true;
    }
    wake_.notify_all();
    while (!link.WaitEnded(session, std::chrono::milliseconds(200))) {
      if (stopping()) break;
    }
    link.Break(session, Cancelled("transport stopped"));
  }
  for (auto& c : cs) c->ctx.TryCancel();
  for (auto& c : cs) {
    if (c->writer.joinable()) c->writer.join();
    if (c->reader.joinable()) c->reader.join();
  }
  for (auto& c : cs) {
    link.Detach(&c->slot);
    if (c->rw) {
      grpc::Status st = c->rw->Finish();
      if (!failure.ok() && failure.code() == StatusCode::kUnavailable && !st.ok() &&
          st.error_code() != grpc::StatusCode::CANCELLED)
        failure = FromGrpcStatus(st, "grpc server " + options_.address);
    }
  }
  return failure;
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
    lock.lock();
  }
}

}  // namespace

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
  return f;
}

}  // namespace xsilo
