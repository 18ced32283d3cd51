// The grpc transport's client side: channels, the session loop and one
// session's handshake (grpc_internal.h).
#include <random>

#include "transport/grpc/grpc_internal.h"

namespace xsilo::grpc_detail {

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

}  // namespace xsilo::grpc_detail
