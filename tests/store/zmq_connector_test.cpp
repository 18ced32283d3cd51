// The zmq connector: the conformance suite (objects on the putting
// process's server; the child process of ResolvesInAnotherProcess fetches
// over the network), plus the network paths one process can reach only
// through a server kept out of the process registry, the failure cases,
// and a fake server that sends malformed replies.
#include <zmq.h>

#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "store/builtin.h"
#include "store/connector_conformance.h"
#include "store/zmq/object_server.h"
#include "store/zmq/zmq_protocol.h"
#include "transport/test_util.h"
#include "xsilo/core/codec.h"

XSILO_CONNECTOR_CONFORMANCE(Zmq, {.name = "zmq", .config = [] {
                                    return xsilo::ConnectorConfig{"zmq", {}};
                                  }});
// Small frames, so that the cross-process Get arrives in many chunks.
XSILO_CONNECTOR_CONFORMANCE(ZmqSmallChunks,
                            {.name = "zmq_small_chunks", .config = [] {
                               return xsilo::ConnectorConfig{"zmq", {{"chunk_bytes", "65536"}}};
                             }});

extern char** environ;

namespace xsilo::testing {

// The child of SetFromAnotherProcess: fills a deferred key through a
// connector rebuilt from the parent's config. Exit 0 when Set succeeded.
constexpr const char* kSetChildEnv = "XSILO_ZMQ_SET_CHILD";

bool RunZmqSetChildIfRequested(int* exit_code) {
  const char* spec = std::getenv(kSetChildEnv);
  if (!spec) return false;
  std::istringstream in(spec);
  std::string config_json, key_json, size, seed;
  std::getline(in, config_json);
  std::getline(in, key_json);
  std::getline(in, size);
  std::getline(in, seed);
  auto config = ConnectorConfig::FromJson(config_json);
  auto key = Key::FromJson(key_json);
  if (!config.ok() || !key.ok()) {
    *exit_code = 2;
    return true;
  }
  auto c = MakeConnector(*config);
  if (!c.ok()) {
    *exit_code = 3;
    return true;
  }
  GatherList g;
  g.Append(PatternTensor(std::stoull(size), std::stoull(seed)).data);
  *exit_code = (*c)->Set(*key, g).ok() ? 0 : 4;
  return true;
}

namespace {

int SetInChild(const ConnectorConfig& config, const Key& key, uint64_t size, uint64_t seed) {
  std::string spec = config.ToJson() + "\n" + key.ToJson() + "\n" + std::to_string(size) + "\n" +
                     std::to_string(seed);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.push_back(std::string(kSetChildEnv) + "=" + spec);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  char* argv[] = {exe.data(), nullptr};
  pid_t pid;
  if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

using zmq_store::ObjectServer;
using zmq_store::ServerOptions;

std::unique_ptr<Connector> Make(ConnectorOptions options) {
  auto c = MakeConnector({"zmq", std::move(options)});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// A server this process reaches only over the network, as another process would.
std::shared_ptr<ObjectServer> UnregisteredServer(uint64_t max_bytes = 0,
                                                 uint64_t chunk_bytes = 1ull << 20) {
  ServerOptions o;
  o.max_bytes = max_bytes;
  o.chunk_bytes = chunk_bytes;
  o.register_in_process = false;
  auto s = ObjectServer::Start(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : nullptr;
}

Key KeyAt(const std::string& address, uint64_t size = 0) {
  return Key{"zmq", RandomObjectId(), size, {{"addr", address}}};
}

GatherList Gather(std::initializer_list<Buffer> parts) {
  GatherList g;
  for (const Buffer& b : parts) g.Append(b);
  return g;
}

TEST(ZmqConnector, RemoteSetGetExistsEvict) {
  auto server = UnregisteredServer(0, 1000);
  ASSERT_TRUE(server);
  auto client = Make({{"role", "client"}, {"chunk_bytes", "777"}});
  ASSERT_TRUE(client);
  EXPECT_EQ(ObjectServer::Find(server->address()), nullptr);

  Key key = KeyAt(server->address());
  EXPECT_FALSE(*client->Exists(key));
  auto none = client->Get(key);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());

  // Segments of odd sizes: chunks follow segment boundaries on the way in,
  // and the server's 1000-byte frames on the way out.
  GatherList g = Gather(
      {PatternTensor(5000, 1).data, Buffer::CopyFrom("x"), Buffer(), PatternTensor(3001, 2).data});
  ASSERT_TRUE(client->Set(key, g).ok());
  EXPECT_EQ(server->stored_bytes(), g.size);
  EXPECT_TRUE(*client->Exists(key));
  auto got = client->Get(key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->view(), g.Flatten()->view());

  Key empty = KeyAt(server->address());
  ASSERT_TRUE(client->Set(empty, GatherList{}).ok());
  auto got_empty = client->Get(empty);
  ASSERT_TRUE(got_empty.ok() && got_empty->has_value());
  EXPECT_EQ((*got_empty)->size(), 0u);

  ASSERT_TRUE(client->Evict(key).ok());
  EXPECT_FALSE(*client->Exists(key));
  EXPECT_TRUE(client->Evict(key).ok());
  EXPECT_EQ(server->stored_bytes(), 0u);
}

TEST(ZmqConnector, DeferredKeySetFromAnotherProcess) {
  // 64 KiB chunks: 3 MB is more chunks than the client keeps in flight.
  auto c = Make({{"chunk_bytes", "65536"}});
  ASSERT_TRUE(c);
  auto key = c->NewKey();
  ASSERT_TRUE(key.ok());
  EXPECT_FALSE(c->Get(*key)->has_value());
  const uint64_t size = 3'000'000;
  ASSERT_EQ(SetInChild(c->config(), *key, size, 17), 0);
  auto got = c->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->view(), PatternTensor(size, 17).data.view());
}

TEST(ZmqConnector, RemoteRoundTripOver2GiB) {
  auto server = UnregisteredServer();
  ASSERT_TRUE(server);
  auto client = Make({{"role", "client"}});
  ASSERT_TRUE(client);
  const uint64_t size = (uint64_t{9} << 28) + 5;  // 2.25 GiB + 5 B
  Key key = KeyAt(server->address());
  uint64_t want;
  {
    Buffer b = PatternTensor(size, 3).data;
    want = Checksum(b.span());
    ASSERT_TRUE(client->Set(key, Gather({b})).ok());
  }
  auto got = client->Get(key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->size(), size);
  EXPECT_EQ(Checksum((*got)->span()), want);
}

TEST(ZmqConnector, MaxBytesRefusesAndStoresNothing) {
  auto c = Make({{"max_bytes", "1000"}});
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->Put(Buffer::CopyFrom(std::string(600, 'a'))).ok());
  auto over = c->Put(Buffer::CopyFrom(std::string(600, 'b')));
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status().ToString();
  // The refused 600 bytes were not counted: 400 more still fit.
  EXPECT_TRUE(c->Put(Buffer::CopyFrom(std::string(400, 'c'))).ok());

  auto server = UnregisteredServer(1000);
  ASSERT_TRUE(server);
  auto client = Make({{"role", "client"}});
  Key key = KeyAt(server->address());
  Status s = client->Set(key, Gather({PatternTensor(2000, 4).data}));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_FALSE(*client->Exists(key));
  EXPECT_EQ(server->stored_bytes(), 0u);
  EXPECT_TRUE(client->Set(key, Gather({PatternTensor(1000, 4).data})).ok());
}

TEST(ZmqConnector, SecondConnectorFromConfigGetsAndServesItsOwnPuts) {
  auto a = Make({});
  ASSERT_TRUE(a);
  ConnectorConfig config = a->config();
  EXPECT_EQ(config.options.at("role"), "client");
  EXPECT_NE(config.options.at("port"), "0");
  auto key = a->Put(Buffer::CopyFrom("from a"));
  ASSERT_TRUE(key.ok());

  auto b = MakeConnector(config);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto got = (*b)->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->view(), "from a");

  // b never binds a's port: its own Puts go to its own server.
  auto kb = (*b)->Put(Buffer::CopyFrom("from b"));
  ASSERT_TRUE(kb.ok());
  EXPECT_NE(kb->attrs.at("addr"), key->attrs.at("addr"));
  EXPECT_NE((*b)->config().options.at("port"), config.options.at("port"));
  auto back = a->Get(*kb);
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ((*back)->view(), "from b");
}

TEST(ZmqConnector, ExplicitPortIsSharedInOneProcess) {
  auto a = Make({});
  ASSERT_TRUE(a);
  std::string port = a->config().options.at("port");
  auto b = Make({{"port", port}});
  ASSERT_TRUE(b);
  auto ka = a->Put(Buffer::CopyFrom("1"));
  auto kb = b->Put(Buffer::CopyFrom("2"));
  ASSERT_TRUE(ka.ok() && kb.ok());
  EXPECT_EQ(ka->attrs, kb->attrs);
  a->Close();  // b still holds the server
  auto got = b->Get(*ka);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->view(), "1");
}

TEST(ZmqConnector, ServerThatWentAwayIsUnavailable) {
  auto server = UnregisteredServer();
  ASSERT_TRUE(server);
  auto client = Make({{"role", "client"}, {"timeout_ms", "200"}});
  Key key = KeyAt(server->address());
  ASSERT_TRUE(client->Set(key, Gather({Buffer::CopyFrom("here")})).ok());
  server->Stop();

  auto start = std::chrono::steady_clock::now();
  auto got = client->Get(key);
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  EXPECT_EQ(client->Exists(key).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(client->Evict(key).code(), StatusCode::kUnavailable);
  EXPECT_EQ(client->Set(key, Gather({Buffer::CopyFrom("x")})).code(), StatusCode::kUnavailable);
  // Only a hang fails this bound; each call waits about timeout_ms.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

TEST(ZmqConnector, ClosedConnectorsObjectsAreGone) {
  auto a = Make({});
  ASSERT_TRUE(a);
  auto key = a->Put(Buffer::CopyFrom("gone"));
  ASSERT_TRUE(key.ok());
  auto b = Make({{"role", "client"}, {"timeout_ms", "200"}});
  a->Close();
  EXPECT_EQ(a->Put(Buffer::CopyFrom("x")).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(b->Get(*key).status().code(), StatusCode::kUnavailable);
}

TEST(ZmqConnector, RejectsBadOptionsAndKeys) {
  EXPECT_EQ(MakeConnector({"zmq", {{"bogus", "1"}}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeConnector({"zmq", {{"role", "peer"}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeConnector({"zmq", {{"chunk_bytes", "0"}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeConnector({"zmq", {{"port", "70000"}}}).status().code(),
            StatusCode::kInvalidArgument);
  auto c = Make({{"role", "client"}});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->Get(Key{"zmq", "abc", 0, {}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Get(Key{"zmq", "abc", 0, {{"addr", "udp://x"}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      c->Get(Key{"zmq", std::string(200, 'a'), 0, {{"addr", "tcp://127.0.0.1:1"}}}).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Get(Key{"redis", "abc", 0, {{"addr", "tcp://127.0.0.1:1"}}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ZmqConnector, AbandonedSetReleasesItsReservation) {
  ServerOptions o;
  o.max_bytes = 2000;
  o.timeout_ms = 100;
  o.register_in_process = false;
  auto server = ObjectServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  // A client that sends the first chunk of 2000 bytes and goes quiet.
  void* context = zmq_ctx_new();
  void* dealer = zmq_socket(context, ZMQ_DEALER);
  int zero = 0;
  zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero);
  ASSERT_EQ(zmq_connect(dealer, (*server)->address().c_str()), 0);
  std::string header = zmq_store::EncodeRequest({zmq_store::Op::kSet, 1, 2000, 0, "quiet"});
  zmq_send(dealer, header.data(), header.size(), ZMQ_SNDMORE);
  zmq_send(dealer, "0123456789", 10, 0);

  // The server gives up on the quiet Set after its 100 ms and releases the
  // 2000 bytes it held (the deadline only catches a Set never dropped).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((*server)->abandoned_sets() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*server)->abandoned_sets(), 1u);
  EXPECT_EQ((*server)->reserved_bytes(), 0u);
  auto client = Make({{"role", "client"}});
  Status s = client->Set(KeyAt((*server)->address()), Gather({PatternTensor(2000, 9).data}));
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ((*server)->stored_bytes(), 2000u);
  zmq_close(dealer);
  zmq_ctx_term(context);
}

// A ROUTER that answers the first request it receives with `frames`.
class FakeServer {
 public:
  explicit FakeServer(std::vector<std::string> frames) : frames_(std::move(frames)) {
    context_ = zmq_ctx_new();
    socket_ = zmq_socket(context_, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(socket_, ZMQ_LINGER, &zero, sizeof zero);
    EXPECT_EQ(zmq_bind(socket_, "tcp://127.0.0.1:*"), 0);
    char last[256] = {};
    size_t len = sizeof last;
    zmq_getsockopt(socket_, ZMQ_LAST_ENDPOINT, last, &len);
    address_ = last;
    thread_ = std::thread([this] { Answer(); });
  }
  ~FakeServer() {
    zmq_ctx_shutdown(context_);
    thread_.join();
    zmq_ctx_term(context_);
  }
  const std::string& address() const { return address_; }

 private:
  void Answer() {
    zmq_msg_t peer;
    zmq_msg_init(&peer);
    if (zmq_msg_recv(&peer, socket_, 0) >= 0) {
      std::string to(static_cast<const char*>(zmq_msg_data(&peer)), zmq_msg_size(&peer));
      int more = 1;
      size_t more_len = sizeof more;
      while (zmq_getsockopt(socket_, ZMQ_RCVMORE, &more, &more_len) == 0 && more) {
        zmq_msg_t rest;
        zmq_msg_init(&rest);
        zmq_msg_recv(&rest, socket_, 0);
        zmq_msg_close(&rest);
      }
      zmq_send(socket_, to.data(), to.size(), ZMQ_SNDMORE);
      for (size_t i = 0; i < frames_.size(); ++i) {
        zmq_send(socket_, frames_[i].data(), frames_[i].size(),
                 i + 1 < frames_.size() ? ZMQ_SNDMORE : 0);
      }
    }
    zmq_msg_close(&peer);
    zmq_close(socket_);
  }

  std::vector<std::string> frames_;
  void* context_;
  void* socket_;
  std::string address_;
  std::thread thread_;
};

// A reply header as the server encodes it (zmq_protocol.h).
std::string ReplyHeaderBytes(uint8_t kind, uint64_t request, uint64_t total, uint64_t offset) {
  std::string h(32, '\0');
  h.replace(0, 4, "XZR1");
  h[4] = static_cast<char>(kind);
  auto put = [&](size_t at, uint64_t v) {
    for (int i = 0; i < 8; ++i) h[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  put(8, request);
  put(16, total);
  put(24, offset);
  return h;
}

TEST(ZmqConnector, MalformedRepliesAreCorrupt) {
  // A fresh client numbers its first request 1.
  std::vector<std::vector<std::string>> replies = {
      {"garbage", ""},                                        // not a header
      {ReplyHeaderBytes(0, 1, 10, 0)},                        // one frame only
      {ReplyHeaderBytes(0, 1, 10, 0), "x", "y"},              // three frames
      {ReplyHeaderBytes(7, 1, 10, 0), ""},                    // unknown kind
      {ReplyHeaderBytes(0, 999999, 10, 0), "0123456789"},     // another request's reply
      {ReplyHeaderBytes(0, 1, 10, 0), std::string(20, 'z')},  // more bytes than the object
      {ReplyHeaderBytes(0, 1, 10, 5), "01234"},               // a chunk out of place
  };
  for (const auto& frames : replies) {
    FakeServer fake(frames);
    auto client = Make({{"role", "client"}, {"timeout_ms", "10000"}});
    auto got = client->Get(KeyAt(fake.address()));
    EXPECT_EQ(got.status().code(), StatusCode::kCorrupt) << got.status().ToString();
  }
}

}  // namespace
}  // namespace xsilo::testing
