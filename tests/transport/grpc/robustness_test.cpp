// The gRPC transport under bad input and broken connections: a raw client
// speaking the link protocol sends malformed chunks, and a TCP proxy cuts a
// real client's connection in the middle of a message.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/conformance.h"
#include "transport/grpc/link.grpc.pb.h"
#include "transport/tcp_proxy.h"
#include "transport/test_util.h"
#include "xsilo/core/codec.h"
#include "xsilo/transport/registry.h"

namespace xsilo::testing {
namespace {

using namespace std::chrono_literals;
namespace pb = xsilo::grpclink;

std::unique_ptr<Transport> StartServer(int port, int world, TransportOptions base = {}) {
  base.rank = 0;
  base.world_size = world;
  base.address = "127.0.0.1:" + std::to_string(port);
  auto t = TransportRegistry::Global().Create("grpc", base);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) return nullptr;
  Status s = (*t)->Start();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return std::move(t).value();
}

// A hand-driven client of the link protocol.
class RawClient {
 public:
  RawClient(int port, int32_t rank, int32_t world, const std::string& token = "",
            uint64_t session = 0x1234567, int stream_index = 0, int stream_count = 1) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    channel_ = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = pb::Link::NewStub(channel_);
    rw_ = stub_->Connect(&ctx_);
    pb::Frame f;
    auto* h = f.mutable_hello();
    h->set_rank(rank);
    h->set_world_size(world);
    h->set_session(session);
    h->set_stream_index(stream_index);
    h->set_stream_count(stream_count);
    h->set_token(token);
    rw_->Write(f);
  }
  ~RawClient() {
    ctx_.TryCancel();
    (void)rw_->Finish();
  }
  pb::HelloAck ReadHelloAck() {
    pb::Frame f;
    EXPECT_TRUE(rw_->Read(&f));
    EXPECT_TRUE(f.has_hello_ack());
    return f.hello_ack();
  }
  void SendChunk(uint64_t id, uint64_t offset, uint64_t total, std::string_view data) {
    pb::Frame f;
    auto* c = f.mutable_chunk();
    c->set_message_id(id);
    c->set_offset(offset);
    c->set_total(total);
    c->set_data(std::string(data));
    ASSERT_TRUE(rw_->Write(f));
  }
  // The next ack about a message (credit-only acks are skipped).
  pb::Ack NextOutcome() {
    pb::Frame f;
    while (rw_->Read(&f)) {
      if (f.has_ack() && f.ack().message_id() != 0) return f.ack();
    }
    ADD_FAILURE() << "stream ended before an outcome arrived";
    return {};
  }
  void Cancel() { ctx_.TryCancel(); }
  bool Read(pb::Frame* f) { return rw_->Read(f); }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Link::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::Frame, pb::Frame>> rw_;
};

std::string FrameString(uint64_t payload, uint64_t seed) {
  Message m = PatternMessage(payload, seed);
  m.sender = 1;
  Buffer flat = std::move(EncodeMessage(m).bytes.Flatten()).value();
  return std::string(flat.view());
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

// gRPC would share a port between two servers (SO_REUSEPORT) and split the
// clients between them; ours refuses a taken port.
TEST(GrpcServer, ASecondServerOnATakenPortFailsToStart) {
  const int port = FreeTcpPort();
  auto first = StartServer(port, 2);
  ASSERT_NE(first, nullptr);
  for (const char* mode : {"stream", "unary"}) {
    TransportOptions o;
    o.rank = 0;
    o.world_size = 2;
    o.address = "127.0.0.1:" + std::to_string(port);
    o.backend = {{"mode", mode}};
    auto second = TransportRegistry::Global().Create("grpc", o);
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    EXPECT_FALSE((*second)->Start().ok()) << mode << ": a second server bound a taken port";
    (*second)->Stop();
  }
  first->Stop();
}

TEST(GrpcBadInput, EachBadFrameDropsOnlyItsMessageWithAClearError) {
  const int port = FreeTcpPort();
  TransportOptions base;
  base.max_message_bytes = 1 << 20;
  auto server = StartServer(port, 2, base);
  ASSERT_NE(server, nullptr);
  RawClient c(port, 1, 2);
  ASSERT_EQ(c.ReadHelloAck().code(), 0);
  const std::string good = FrameString(10000, 1);
  const uint64_t total = good.size();

  // 1: a chunk reaching past the announced total.
  c.SendChunk(1, 0, total, std::string_view(good).substr(0, 4096));
  c.SendChunk(1, total - 100, total, std::string_view(good).substr(0, 4096));
  pb::Ack a = c.NextOutcome();
  EXPECT_EQ(a.message_id(), 1u);
  EXPECT_EQ(a.code(), static_cast<int>(StatusCode::kCorrupt));
  EXPECT_NE(a.error().find("exceeds the announced total"), std::string::npos) << a.error();

  // 2: a total above max_message_bytes, refused before any allocation.
  const uint64_t live = Buffer::LiveAllocatedBytes();
  c.SendChunk(2, 0, uint64_t{1} << 45, std::string_view(good).substr(0, 4096));
  a = c.NextOutcome();
  EXPECT_EQ(a.message_id(), 2u);
  EXPECT_EQ(a.code(), static_cast<int>(StatusCode::kResourceExhausted));
  EXPECT_NE(a.error().find("max_message_bytes"), std::string::npos) << a.error();
  EXPECT_LE(Buffer::LiveAllocatedBytes(), live + 4096);

  // 3: a chunk sent twice.
  c.SendChunk(3, 0, total, std::string_view(good).substr(0, 4096));
  c.SendChunk(3, 0, total, std::string_view(good).substr(0, 4096));
  a = c.NextOutcome();
  EXPECT_EQ(a.message_id(), 3u);
  EXPECT_EQ(a.code(), static_cast<int>(StatusCode::kCorrupt));
  EXPECT_NE(a.error().find("duplicate chunk"), std::string::npos) << a.error();

  // 4: a chunk missing; noticed when the stream moves on to message 5.
  c.SendChunk(4, 0, total, std::string_view(good).substr(0, 4096));
  c.SendChunk(4, 8192, total, std::string_view(good).substr(8192));
  c.SendChunk(5, 0, total, good);
  a = c.NextOutcome();
  EXPECT_EQ(a.message_id(), 4u);
  EXPECT_EQ(a.code(), static_cast<int>(StatusCode::kCorrupt));
  EXPECT_NE(a.error().find("missing chunk"), std::string::npos) << a.error();
  a = c.NextOutcome();
  EXPECT_EQ(a.message_id(), 5u);
  EXPECT_EQ(a.code(), 0) << a.error();

  // 6: a frame whose payload checksum is wrong: dropped at decode.
  std::string bad = good;
  bad[bad.size() - 1] ^= 0x5a;
  c.SendChunk(6, 0, total, bad);
  a = c.NextOutcome();
  EXPECT_EQ(a.message_id(), 6u);
  EXPECT_EQ(a.code(), static_cast<int>(StatusCode::kCorrupt));

  // Only message 5 reached the user; the server still works.
  auto got = server->Receive(10s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(PatternIntact(*got));
  EXPECT_EQ(got->sender, 1);
  EXPECT_EQ(server->Receive(100ms).status().code(), StatusCode::kTimeout);
  c.SendChunk(7, 0, total, good);
  a = c.NextOutcome();
  EXPECT_EQ(a.code(), 0) << a.error();
  EXPECT_TRUE(server->Receive(10s).ok());
}

// A chunk announcing a message of 2^62 bytes (or 2^64-1, or merely more
// than max_message_bytes) is refused before the receiver allocates for it,
// with the default limit and with a small one; the next message arrives.
TEST(GrpcBadInput, AHugeClaimIsRefusedBeforeAllocation) {
  for (uint64_t limit : {uint64_t{0}, uint64_t{1} << 20}) {
    SCOPED_TRACE(limit);
    const int port = FreeTcpPort();
    TransportOptions base;
    if (limit != 0) base.max_message_bytes = limit;
    auto server = StartServer(port, 2, base);
    ASSERT_NE(server, nullptr);
    RawClient c(port, 1, 2);
    ASSERT_EQ(c.ReadHelloAck().code(), 0);
    const std::string good = FrameString(10000, 1);
    std::vector<uint64_t> claims = {uint64_t{1} << 62, ~uint64_t{0}};
    if (limit != 0) claims.push_back(uint64_t{64} << 20);
    const uint64_t live = Buffer::LiveAllocatedBytes();
    Buffer::ResetPeakAllocatedBytes();
    uint64_t id = 0;
    for (uint64_t claim : claims) {
      c.SendChunk(++id, 0, claim, std::string_view(good).substr(0, 4096));
      pb::Ack a = c.NextOutcome();
      EXPECT_EQ(a.message_id(), id);
      EXPECT_EQ(a.code(), static_cast<int>(StatusCode::kResourceExhausted)) << a.error();
      EXPECT_NE(a.error().find("max_message_bytes"), std::string::npos) << a.error();
    }
    EXPECT_LT(Buffer::PeakAllocatedBytes(), live + (1 << 20));
    c.SendChunk(++id, 0, good.size(), good);
    pb::Ack a = c.NextOutcome();
    EXPECT_EQ(a.code(), 0) << a.error();
    auto got = server->Receive(10s);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(PatternIntact(*got));
  }
}

TEST(GrpcBadInput, HelloWithBadRankOrWorldIsRefused) {
  const int port = FreeTcpPort();
  auto server = StartServer(port, 3);
  ASSERT_NE(server, nullptr);
  {
    RawClient c(port, 7, 3);
    pb::HelloAck h = c.ReadHelloAck();
    EXPECT_EQ(h.code(), static_cast<int>(StatusCode::kInvalidArgument));
    EXPECT_NE(h.error().find("rank 7"), std::string::npos) << h.error();
  }
  {
    RawClient c(port, 1, 5);
    EXPECT_EQ(c.ReadHelloAck().code(), static_cast<int>(StatusCode::kInvalidArgument));
  }
  RawClient ok(port, 1, 3);
  EXPECT_EQ(ok.ReadHelloAck().code(), 0);
}

TEST(GrpcBadInput, ClientVanishingMidMessageFreesThePartialBuffer) {
  const int port = FreeTcpPort();
  auto server = StartServer(port, 2);
  ASSERT_NE(server, nullptr);
  const std::string good = FrameString(100000, 2);
  const uint64_t total = uint64_t{512} << 20;  // announced, never sent in full
  const uint64_t live = Buffer::LiveAllocatedBytes();
  Buffer::ResetPeakAllocatedBytes();
  {
    RawClient c(port, 1, 2);
    ASSERT_EQ(c.ReadHelloAck().code(), 0);
    // A valid prefix is not needed for the reassembler to allocate, but
    // use the real frame's bytes past the prefix so nothing is rejected.
    c.SendChunk(1, 1 << 20, total, std::string_view(good).substr(0, 65536));
    ASSERT_TRUE(WaitFor([&] { return Buffer::PeakAllocatedBytes() >= live + total; }, 10s))
        << "the server never allocated the message";
    c.Cancel();
  }
  EXPECT_TRUE(WaitFor([&] { return Buffer::LiveAllocatedBytes() <= live + 4096; }, 10s))
      << "partial buffer still alive: " << Buffer::LiveAllocatedBytes() - live << " bytes";
  // The same rank reconnects and is served.
  RawClient again(port, 1, 2, "", 0x7654321);  // a new connection, a new session
  ASSERT_EQ(again.ReadHelloAck().code(), 0);
  again.SendChunk(1, 0, good.size(), good);
  EXPECT_EQ(again.NextOutcome().code(), 0);
  EXPECT_TRUE(server->Receive(10s).ok());
}

TEST(GrpcReconnect, CutMidMessageFailsThatSendThenTheExchangeGoesOn) {
  const int port = FreeTcpPort();
  auto server = StartServer(port, 3);
  ASSERT_NE(server, nullptr);
  TcpProxy proxy(port);
  TransportOptions o;
  o.world_size = 3;
  o.backend = {{"initial_backoff_ms", "20"}, {"max_backoff_ms", "200"}, {"chunk_bytes", "1048576"}};
  o.rank = 1;
  o.address = "127.0.0.1:" + std::to_string(proxy.port());
  auto flaky = std::move(TransportRegistry::Global().Create("grpc", o)).value();
  o.rank = 2;
  o.address = "127.0.0.1:" + std::to_string(port);
  auto steady = std::move(TransportRegistry::Global().Create("grpc", o)).value();
  ASSERT_TRUE(flaky->Start().ok());
  ASSERT_TRUE(steady->Start().ok());

  ASSERT_TRUE(flaky->Send(0, PatternMessage(1000, 1, 1), 30s).ok());
  ASSERT_TRUE(server->Receive(30s).ok());

  const uint64_t big = uint64_t{96} << 20;
  Message m = PatternMessage(big, 2, 2);
  const uint64_t live = Buffer::LiveAllocatedBytes();
  Buffer::ResetPeakAllocatedBytes();
  proxy.CutAfter(big / 3);
  std::promise<Status> sent;
  flaky->SendAsync(0, m, [&](const Status& s) { sent.set_value(s); });
  auto f = sent.get_future();
  ASSERT_EQ(f.wait_for(120s), std::future_status::ready);
  Status s = f.get();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_EQ(proxy.cuts(), 1);
  EXPECT_GE(Buffer::PeakAllocatedBytes(), live + big) << "the server never started the message";
  EXPECT_TRUE(WaitFor([&] { return Buffer::LiveAllocatedBytes() <= live + (1 << 20); }, 30s))
      << "partial buffer still alive";

  // The other client never noticed.
  ASSERT_TRUE(steady->Send(0, PatternMessage(5000, 3, 3), 30s).ok());
  auto r = server->Receive(30s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->sender, 2);

  // The cut client reconnects by itself; both directions work again.
  ASSERT_TRUE(flaky->Send(0, PatternMessage(3 << 20, 4, 4), 60s).ok());
  r = server->Receive(30s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->sender, 1);
  EXPECT_EQ(r->round, 4);
  EXPECT_TRUE(PatternIntact(*r));
  ASSERT_TRUE(server->Send(1, PatternMessage(2 << 20, 5, 5), 60s).ok());
  r = flaky->Receive(30s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(PatternIntact(*r));
  EXPECT_EQ(server->Receive(100ms).status().code(), StatusCode::kTimeout);
  flaky->Stop();
  steady->Stop();
  server->Stop();
}

// A client started before its server listened: after two refused
// connects gRPC's channel stayed in TRANSIENT_FAILURE until max_backoff_ms
// had passed (resetting its backoff did not wake it), so with the default
// 5 s the parties of a job started together lost ~6 s. The client runs in
// its own process (a server in the same process woke the channel, which
// hid the stall); max_backoff_ms is 60 s, and the client must be up long
// before that.
TEST(GrpcReconnect, AClientStartedBeforeItsServerConnectsOnItsOwnBackoff) {
  const int port = FreeTcpPort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  ConformanceParam p{"grpc", {{"initial_backoff_ms", "100"}, {"max_backoff_ms", "60000"}}};
  const pid_t child = SpawnReceiver(p, 1, 2, address);
  ASSERT_GT(child, 0);
  // Long enough for its first refused connects (100 + 200 + 400 ms).
  std::this_thread::sleep_for(1s);
  auto server = StartServer(port, 2);
  ASSERT_NE(server, nullptr);
  // Queued until the client's session is up. The client's own loop tries
  // again within 1.6 s of the server's start (100, 200, 400, 800, 1600 ms
  // +-20%), about 0.5 s here; waiting for the channel took 12 s (and 5 s
  // with max_backoff_ms at its default, the stall bench e2e showed).
  std::promise<Status> sent;
  server->SendAsync(1, PatternMessage(1000, 1, 1), [&](const Status& s) { sent.set_value(s); });
  auto ack = server->Receive(8s);
  EXPECT_TRUE(ack.ok()) << "no ack within 8 s (the client waited out gRPC's channel backoff?): "
                        << ack.status().ToString();
  int status = 0;
  if (!ack.ok()) kill(child, SIGKILL);
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_TRUE(sent.get_future().get().ok());
  server->Stop();
}

// A message's kStripeParam confines its chunks to the first K streams of a
// striped link (the auto backend's inline and striped sends); without it
// the chunks may go on any stream. Seen from a raw client's four streams.
TEST(GrpcStripe, AMessageGoesOnlyOnTheStreamsItsStripeNames) {
  const int port = FreeTcpPort();
  auto server = StartServer(port, 2);
  ASSERT_NE(server, nullptr);
  constexpr int kStreams = 4;
  std::vector<std::unique_ptr<RawClient>> streams;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_unique<RawClient>(port, 1, 2, "", 0x5151, i, kStreams));
  }
  for (auto& c : streams) ASSERT_EQ(c->ReadHelloAck().code(), 0);
  struct Seen {
    uint64_t total = 0;
    std::vector<uint64_t> per_stream = std::vector<uint64_t>(kStreams, 0);
  };
  std::mutex mu;
  std::map<uint64_t, Seen> seen;  // by message id
  std::vector<std::thread> readers;
  for (int i = 0; i < kStreams; ++i) {
    readers.emplace_back([&, i] {
      pb::Frame f;
      while (streams[static_cast<size_t>(i)]->Read(&f)) {
        if (!f.has_chunk()) continue;
        std::lock_guard<std::mutex> lock(mu);
        Seen& m = seen[f.chunk().message_id()];
        m.total = f.chunk().total();
        m.per_stream[static_cast<size_t>(i)] += f.chunk().data().size();
      }
    });
  }
  const std::vector<int> stripes = {1, 2, 0};  // 0: no param
  for (int stripe : stripes) {
    Message m = PatternMessage(8 << 20, static_cast<uint64_t>(stripe));
    if (stripe > 0) m.params[kStripeParam] = int64_t{stripe};
    server->SendAsync(1, std::move(m), [](const Status&) {});
  }
  auto complete = [&](uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = seen.find(id);
    if (it == seen.end()) return false;
    uint64_t sum = 0;
    for (uint64_t b : it->second.per_stream) sum += b;
    return it->second.total > 0 && sum == it->second.total;
  };
  ASSERT_TRUE(WaitFor([&] { return complete(1) && complete(2) && complete(3); }, 30s))
      << "the three messages did not arrive whole";
  for (size_t k = 0; k < stripes.size(); ++k) {
    const int used = stripes[k] > 0 ? stripes[k] : kStreams;
    std::lock_guard<std::mutex> lock(mu);
    const Seen& m = seen[k + 1];
    // Which of the allowed streams carry a chunk is up to whichever writer
    // is free first (link.cpp, WriterLoop): a stream still busy with the
    // earlier messages may carry none of this one (it happened once, for
    // stream 0 of the unconfined message, in a clean-clone make test). What
    // the param promises is that no chunk goes past the stripe.
    for (int i = used; i < kStreams; ++i) {
      EXPECT_EQ(m.per_stream[static_cast<size_t>(i)], 0u)
          << "stripe " << stripes[k] << " stream " << i;
    }
  }
  for (auto& c : streams) c->Cancel();
  for (auto& t : readers) t.join();
  server->Stop();
}

// Between two grpc transports with four streams, a striped message arrives
// whole and without the param.
TEST(GrpcStripe, TheParamIsTakenOffAndTheMessageArrivesWhole) {
  const int port = FreeTcpPort();
  auto server = StartServer(port, 2);
  ASSERT_NE(server, nullptr);
  TransportOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.address = "127.0.0.1:" + std::to_string(port);
  o.backend = {{"streams", "4"}};
  auto client = std::move(TransportRegistry::Global().Create("grpc", o)).value();
  ASSERT_TRUE(client->Start().ok());
  for (int64_t stripe : {1, 3, 4, 64}) {
    Message m = PatternMessage(6 << 20, static_cast<uint64_t>(stripe), stripe);
    m.params[kStripeParam] = stripe;
    ASSERT_TRUE(client->Send(0, std::move(m), 30s).ok());
    auto r = server->Receive(30s);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->round, stripe);
    EXPECT_TRUE(PatternIntact(*r));
    EXPECT_EQ(r->params.count(kStripeParam), 0u);
  }
  client->Stop();
  server->Stop();
}

}  // namespace
}  // namespace xsilo::testing
