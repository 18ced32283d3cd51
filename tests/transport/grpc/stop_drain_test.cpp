// Stop drains (docs/transport-grpc.md, "Stop"): a message sent just before
// either party stops is confirmed, or fails with an error that says it was
// not delivered, never "not confirmed" for a message the peer got. The
// drain deadline in these tests is far above anything the exchange needs,
// so they assert outcomes only, not speed.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "transport/grpc/link.grpc.pb.h"
#include "transport/test_util.h"
#include "xsilo/core/codec.h"
#include "xsilo/transport/registry.h"

namespace xsilo::testing {
namespace {

using namespace std::chrono_literals;
namespace pb = xsilo::grpclink;

std::unique_ptr<Transport> Party(int rank, int world, int port,
                                 std::map<std::string, std::string> backend = {}) {
  TransportOptions o;
  o.rank = rank;
  o.world_size = world;
  o.address = "127.0.0.1:" + std::to_string(port);
  o.backend = std::move(backend);
  if (!o.backend.count("drain_ms")) o.backend["drain_ms"] = "120000";
  auto t = TransportRegistry::Global().Create("grpc", o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

// A server and world-1 started clients.
struct Star {
  std::unique_ptr<Transport> server;
  std::vector<std::unique_ptr<Transport>> clients;
};

Star StartStar(int world, const std::map<std::string, std::string>& backend = {}) {
  Star s;
  const int port = FreeTcpPort();
  s.server = Party(0, world, port, backend);
  EXPECT_TRUE(s.server->Start().ok());
  for (int r = 1; r < world; ++r) {
    s.clients.push_back(Party(r, world, port, backend));
    Status up = s.clients.back()->Start();
    EXPECT_TRUE(up.ok()) << up.ToString();
  }
  return s;
}

std::future<Status> SendAsync(Transport& t, int32_t peer, Message m) {
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  t.SendAsync(peer, std::move(m), [p](const Status& s) { p->set_value(s); });
  return f;
}

// The receiver stops as soon as it has the message: its confirmation is
// written before it says goodbye, so the sender sees OK. Before the drain
// this failed with "lost before delivery was confirmed" (the seven-process
// tests' "bye"). Repeated because the lost confirmation was a race.
TEST(GrpcStopDrain, ReceiverStoppingRightAfterAMessageStillConfirmsIt) {
  for (const char* streams : {"1", "4"}) {
    for (int i = 0; i < 10; ++i) {
      Star s = StartStar(2, {{"streams", streams}});
      auto sent = SendAsync(*s.server, 1, PatternMessage(64 << 10, i, i));
      auto got = s.clients[0]->Receive(60s);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      s.clients[0]->Stop();
      Status st = sent.get();
      EXPECT_TRUE(st.ok()) << "streams=" << streams << " run " << i << ": " << st.ToString();
      s.server->Stop();
    }
  }
}

// The sender stops right after a broadcast: Stop waits for every client's
// confirmation instead of cancelling the sends under them.
TEST(GrpcStopDrain, SenderStoppingRightAfterABroadcastGetsItConfirmed) {
  Star s = StartStar(4, {{"chunk_bytes", "65536"}});
  std::promise<Status> done;
  s.server->BroadcastAsync({1, 2, 3}, PatternMessage(4 << 20, 7, 7),
                           [&](const Status& st) { done.set_value(st); });
  s.server->Stop();
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(0s), std::future_status::ready) << "Stop returned before the callback";
  Status st = f.get();
  EXPECT_TRUE(st.ok()) << st.ToString();
  for (auto& c : s.clients) {
    auto got = c->Receive(60s);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(PatternIntact(*got));
  }
}

// Both parties stop while each has a message on its way to the other: each
// send's outcome agrees with the receiver's inbox (a stopped transport's
// inbox still hands out what it had received).
TEST(GrpcStopDrain, WhenBothStopAtOnceEveryOutcomeMatchesWhatWasDelivered) {
  int delivered = 0, refused = 0;
  for (int i = 0; i < 10; ++i) {
    Star s = StartStar(2, {{"chunk_bytes", "65536"}, {"window_bytes", "262144"}});
    Transport& server = *s.server;
    Transport& client = *s.clients[0];
    auto down = SendAsync(server, 1, PatternMessage(2 << 20, 1, i));
    auto up = SendAsync(client, 0, PatternMessage(2 << 20, 2, i));
    std::thread stop_client([&] { client.Stop(); });
    server.Stop();
    stop_client.join();
    for (auto [sent, receiver] : {std::pair{&down, &client}, std::pair{&up, &server}}) {
      Status st = sent->get();
      auto got = receiver->Receive(0ms);
      EXPECT_EQ(st.ok(), got.ok()) << "run " << i << ": send said " << st.ToString()
                                   << ", inbox said " << got.status().ToString();
      EXPECT_EQ(st.message().find("confirmed"), std::string::npos)
          << "an ambiguous outcome despite the drain: " << st.ToString();
      (st.ok() ? delivered : refused)++;
    }
  }
  std::printf("both stopping: %d messages delivered and confirmed, %d refused\n", delivered,
              refused);
}

// A peer that never answers holds Stop up only until drain_ms; its
// unconfirmed message then fails saying so.
TEST(GrpcStopDrain, AnUnresponsivePeerIsCutOffAtTheDeadline) {
  const int port = FreeTcpPort();
  auto server = Party(0, 2, port, {{"drain_ms", "200"}});
  ASSERT_TRUE(server->Start().ok());
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = pb::Link::NewStub(channel);
  grpc::ClientContext ctx;
  auto rw = stub->Connect(&ctx);
  pb::Frame f;
  f.mutable_hello()->set_rank(1);
  f.mutable_hello()->set_world_size(2);
  f.mutable_hello()->set_session(99);
  f.mutable_hello()->set_stream_count(1);
  ASSERT_TRUE(rw->Write(f));
  ASSERT_TRUE(rw->Read(&f) && f.has_hello_ack());
  ASSERT_EQ(f.hello_ack().code(), 0);
  auto sent = SendAsync(*server, 1, PatternMessage(1000, 1));
  ASSERT_TRUE(rw->Read(&f));  // the message arrived; no ack is ever sent
  ASSERT_TRUE(f.has_chunk());
  server->Stop();
  Status st = sent.get();
  EXPECT_EQ(st.code(), StatusCode::kCancelled) << st.ToString();
  EXPECT_NE(st.message().find("before peer 1 confirmed delivery"), std::string::npos)
      << st.ToString();
  ctx.TryCancel();
  (void)rw->Finish();
}

// The stopping party's last frame on a stream is Goodbye; a message whose
// chunks were still coming in is not delivered (refused, or left unacked
// before the goodbye, which says the same).
TEST(GrpcStopDrain, StoppingEndsTheStreamWithGoodbyeAndDeliversNoPartialMessage) {
  const int port = FreeTcpPort();
  auto server = Party(0, 2, port);
  ASSERT_TRUE(server->Start().ok());
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = pb::Link::NewStub(channel);
  grpc::ClientContext ctx;
  auto rw = stub->Connect(&ctx);
  pb::Frame f;
  f.mutable_hello()->set_rank(1);
  f.mutable_hello()->set_world_size(2);
  f.mutable_hello()->set_session(98);
  f.mutable_hello()->set_stream_count(1);
  ASSERT_TRUE(rw->Write(f));
  ASSERT_TRUE(rw->Read(&f) && f.has_hello_ack());
  Message m = PatternMessage(10000, 3);
  m.sender = 1;
  Buffer flat = std::move(EncodeMessage(m).bytes.Flatten()).value();
  const std::string frame(flat.view());
  auto chunk = [&](uint64_t offset, uint64_t len) {
    pb::Frame c;
    c.mutable_chunk()->set_message_id(1);
    c.mutable_chunk()->set_offset(offset);
    c.mutable_chunk()->set_total(frame.size());
    c.mutable_chunk()->set_data(frame.substr(offset, len));
    return rw->Write(c);
  };
  ASSERT_TRUE(chunk(0, 4096));
  std::thread stopper([&] { server->Stop(); });
  (void)chunk(4096, frame.size() - 4096);  // the rest, racing the Stop
  bool goodbye = false, confirmed = false;
  while (rw->Read(&f)) {
    ASSERT_FALSE(goodbye) << "a frame after the goodbye";
    if (f.has_goodbye()) goodbye = true;
    if (f.has_ack() && f.ack().message_id() == 1 && f.ack().code() == 0) confirmed = true;
    if (goodbye) break;
  }
  EXPECT_TRUE(goodbye);
  // The client ends the session, as a real client does on a goodbye.
  ctx.TryCancel();
  (void)rw->Finish();
  stopper.join();
  auto got = server->Receive(0ms);
  EXPECT_EQ(got.ok(), confirmed) << got.status().ToString();
}

}  // namespace
}  // namespace xsilo::testing
