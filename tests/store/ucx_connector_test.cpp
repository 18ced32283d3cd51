// The ucx connector: the conformance suite, plus what is particular to a
// connector whose objects live in the putting process's server.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include <array>
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "store/connector_conformance.h"
#include "transport/test_util.h"
#include "xsilo/core/codec.h"

XSILO_CONNECTOR_CONFORMANCE(Ucx, {.name = "ucx", .config = [] {
                                    return xsilo::ConnectorConfig{"ucx", {}};
                                  }});

namespace xsilo {
namespace {

std::unique_ptr<Connector> MakeUcx(std::map<std::string, std::string> options = {}) {
  auto c = MakeConnector({"ucx", std::move(options)});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

std::unique_ptr<Connector> Rebuild(const ConnectorConfig& config,
                                   std::map<std::string, std::string> overrides = {}) {
  ConnectorConfig c = config;
  for (auto& [k, v] : overrides) c.options[k] = v;
  auto r = MakeConnector(c);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

GatherList Gather(std::string_view s) {
  GatherList g;
  g.Append(Buffer::CopyFrom(s));
  return g;
}

// A UCX server that answers the first request of its first client with 24
// bytes that are no reply header.
class GarbageServer {
 public:
  GarbageServer() {
    std::future<int> port = port_.get_future();
    thread_ = std::thread([this] { Run(); });
    bound_ = port.get();
  }
  ~GarbageServer() {
    stop_ = true;
    thread_.join();
  }
  int port() const { return bound_; }

 private:
  static void OnConn(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<GarbageServer*>(arg);
    if (self->ep_) return;
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.conn_request = request;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = [](void*, ucp_ep_h, ucs_status_t) {};
    if (ucp_ep_create(self->worker_, &p, &self->ep_) != UCS_OK) self->ep_ = nullptr;
  }

  void Run() {
    ucp_config_t* config = nullptr;
    ucp_config_read(nullptr, nullptr, &config);
    ucp_config_modify(config, "TLS", "tcp");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_STREAM;
    ucp_context_h context = nullptr;
    if (ucp_init(&params, config, &context) != UCS_OK) return port_.set_value(0);
    ucp_config_release(config);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucp_worker_create(context, &wp, &worker_);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    lp.sockaddr.addrlen = sizeof(addr);
    lp.conn_handler.cb = &GarbageServer::OnConn;
    lp.conn_handler.arg = this;
    ucp_listener_h listener = nullptr;
    ucp_listener_create(worker_, &lp, &listener);
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    ucp_listener_query(listener, &attr);
    port_.set_value(ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port));

    std::array<uint8_t, 48> request{};
    std::array<uint8_t, 24> garbage;
    garbage.fill(0xee);
    void* recv = nullptr;
    void* send = nullptr;
    bool received = false, answered = false;
    while (!stop_) {
      ucp_worker_progress(worker_);
      if (ep_ && !recv && !received) {
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_STREAM_RECV_FLAG_WAITALL;
        size_t length = 0;
        recv = ucp_stream_recv_nbx(ep_, request.data(), request.size(), &length, &p);
        if (recv == nullptr) received = true;
      }
      size_t length = 0;
      if (recv && !UCS_PTR_IS_ERR(recv) &&
          ucp_stream_recv_request_test(recv, &length) != UCS_INPROGRESS) {
        ucp_request_free(recv);
        recv = nullptr;
        received = true;
      }
      if (received && !answered) {
        ucp_request_param_t p{};
        send = ucp_stream_send_nbx(ep_, garbage.data(), garbage.size(), &p);
        answered = true;
      }
      if (send && !UCS_PTR_IS_ERR(send) && ucp_request_check_status(send) != UCS_INPROGRESS) {
        ucp_request_free(send);
        send = nullptr;
      }
    }
    if (ep_) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* close = ucp_ep_close_nbx(ep_, &p);
      while (close && !UCS_PTR_IS_ERR(close) && ucp_request_check_status(close) == UCS_INPROGRESS) {
        ucp_worker_progress(worker_);
      }
      if (close && !UCS_PTR_IS_ERR(close)) ucp_request_free(close);
    }
    ucp_listener_destroy(listener);
    ucp_worker_destroy(worker_);
    ucp_cleanup(context);
  }

  std::promise<int> port_;
  int bound_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
};

TEST(UcxConnector, IsRegistered) {
  auto types = ConnectorTypes();
  EXPECT_NE(std::find(types.begin(), types.end(), "ucx"), types.end());
}

TEST(UcxConnector, RejectsUnknownAndBadOptions) {
  EXPECT_EQ(MakeConnector({"ucx", {{"colour", "red"}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeConnector({"ucx", {{"port", "70000"}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeConnector({"ucx", {{"serve", "sometimes"}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeConnector({"ucx", {{"chunk_bytes", "10"}}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(UcxConnector, APortInUseIsUnavailable) {
  auto first = MakeUcx();
  ASSERT_TRUE(first);
  auto second = MakeConnector({"ucx", {{"port", first->config().options.at("port")}}});
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable) << second.status().ToString();
}

TEST(UcxConnector, ConfigRecordsTheBoundPortAndKeysNameTheServer) {
  auto c = MakeUcx();
  ASSERT_TRUE(c);
  ConnectorConfig config = c->config();
  EXPECT_NE(config.options.at("port"), "0");
  EXPECT_EQ(config.options.at("serve"), "on_put");
  auto key = c->Put(Buffer::CopyFrom("x"));
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(key->attrs.at("address"), "127.0.0.1:" + config.options.at("port"));
}

TEST(UcxConnector, SecondConnectorInTheProcessHoldingOnlyTheConfigReachesTheObjects) {
  auto server = MakeUcx();
  ASSERT_TRUE(server);
  auto client = Rebuild(server->config());
  ASSERT_TRUE(client);
  auto key = server->Put(Buffer::CopyFrom("held by the first connector"));
  ASSERT_TRUE(key.ok());
  auto got = client->Get(*key);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->view(), "held by the first connector");
  EXPECT_TRUE(*client->Exists(*key));
  // Evict and Set act on the first connector's server.
  ASSERT_TRUE(client->Evict(*key).ok());
  EXPECT_FALSE(*server->Exists(*key));
  auto deferred = server->NewKey();
  ASSERT_TRUE(deferred.ok());
  ASSERT_TRUE(client->Set(*deferred, Gather("set remotely")).ok());
  auto set = server->Get(*deferred);
  ASSERT_TRUE(set.ok() && set->has_value());
  EXPECT_EQ((*set)->view(), "set remotely");
}

TEST(UcxConnector, RebuiltConnectorServesWhatItPutsOnItsOwnPort) {
  auto first = MakeUcx();
  ASSERT_TRUE(first);
  auto second = Rebuild(first->config());
  ASSERT_TRUE(second);
  auto key = second->Put(Buffer::CopyFrom("from the second"));
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_NE(key->attrs.at("address"), "127.0.0.1:" + first->config().options.at("port"));
  auto got = first->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->view(), "from the second");
}

TEST(UcxConnector, MaxBytesRefusesAPutPastTheBoundAndStoresNothing) {
  auto c = MakeUcx({{"max_bytes", "1000"}});
  ASSERT_TRUE(c);
  auto a = c->Put(Buffer::CopyFrom(std::string(600, 'a')));
  ASSERT_TRUE(a.ok());
  auto b = c->Put(Buffer::CopyFrom(std::string(600, 'b')));
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted) << b.status().ToString();
  // The refused object took no room: after an eviction the same put fits.
  ASSERT_TRUE(c->Evict(*a).ok());
  auto again = c->Put(Buffer::CopyFrom(std::string(600, 'b')));
  ASSERT_TRUE(again.ok()) << again.status().ToString();

  // A remote Set past the bound is refused too, and the server stays usable.
  auto client = Rebuild(c->config());
  ASSERT_TRUE(client);
  auto deferred = c->NewKey();
  ASSERT_TRUE(deferred.ok());
  Status s = client->Set(*deferred, Gather(std::string(600, 'c')));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_FALSE(*client->Exists(*deferred));
  ASSERT_TRUE(client->Set(*deferred, Gather(std::string(300, 'c'))).ok());
  EXPECT_EQ((*client->Get(*deferred))->size(), 300u);
}

TEST(UcxConnector, ServerThatWentAwayIsUnavailable) {
  auto server = MakeUcx();
  ASSERT_TRUE(server);
  auto key = server->Put(Buffer::CopyFrom("soon gone"));
  ASSERT_TRUE(key.ok());
  auto client = Rebuild(server->config(), {{"timeout_ms", "5000"}});
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->Get(*key).ok());  // an idle endpoint to the server now exists
  server->Close();
  server.reset();
  auto got = client->Get(*key);
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  EXPECT_EQ(client->Exists(*key).status().code(), StatusCode::kUnavailable);
  // A fresh client, with no endpoint yet, too.
  auto fresh = Rebuild(client->config(), {{"timeout_ms", "5000"}});
  ASSERT_TRUE(fresh);
  EXPECT_EQ(fresh->Get(*key).status().code(), StatusCode::kUnavailable);
}

TEST(UcxConnector, SilentPeerTimesOutAsUnavailable) {
  // A TCP port that accepts connections and never speaks UCX.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  auto client = MakeUcx({{"serve", "on_put"}, {"timeout_ms", "500"}});
  ASSERT_TRUE(client);
  Key key{"ucx", RandomObjectId(), 1, {{"address", address}}};
  auto start = std::chrono::steady_clock::now();
  auto got = client->Get(key);
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  EXPECT_GE(waited, std::chrono::milliseconds(500));
  client->Close();
  close(fd);
}

TEST(UcxConnector, RejectsKeysWithoutAnAddressAndOfOtherConnectors) {
  auto c = MakeUcx({{"serve", "on_put"}});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->Get(Key{"redis", RandomObjectId(), 0, {}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Get(Key{"ucx", RandomObjectId(), 0, {}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Exists(Key{"ucx", "short", 0, {{"address", "127.0.0.1:1"}}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(UcxConnector, CloseIsIdempotentAndLaterRemoteCallsAreUnavailable) {
  auto server = MakeUcx();
  ASSERT_TRUE(server);
  auto key = server->Put(Buffer::CopyFrom("x"));
  ASSERT_TRUE(key.ok());
  auto client = Rebuild(server->config());
  ASSERT_TRUE(client);
  client->Close();
  client->Close();
  EXPECT_EQ(client->Get(*key).status().code(), StatusCode::kUnavailable);
  server->Close();
}

TEST(UcxConnector, SmallChunksReassembleIntoOneBuffer) {
  auto server = MakeUcx({{"chunk_bytes", "4096"}});
  ASSERT_TRUE(server);
  std::string bytes(1'000'003, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 + 7);
  GatherList g;
  g.Append(Buffer::CopyFrom(bytes.substr(0, 5000)));
  g.Append(Buffer::CopyFrom(bytes.substr(5000)));
  auto key = server->Put(g);
  ASSERT_TRUE(key.ok());
  auto client = Rebuild(server->config());
  ASSERT_TRUE(client);
  auto got = client->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->view(), bytes);
}

TEST(UcxConnector, ConcurrentRemoteCallsFrom8Threads) {
  auto server = MakeUcx();
  ASSERT_TRUE(server);
  auto client = Rebuild(server->config());
  ASSERT_TRUE(client);
  constexpr int kThreads = 8, kEach = 20;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        std::string bytes(1000 + 4099 * i + t, static_cast<char>('a' + t));
        auto key = server->NewKey();
        if (!key.ok() || !client->Set(*key, Gather(bytes)).ok()) {
          ++failures;
          continue;
        }
        auto got = client->Get(*key);
        if (!got.ok() || !got->has_value() || (*got)->view() != bytes) ++failures;
        if (!client->Evict(*key).ok() || *client->Exists(*key)) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(UcxConnector, MalformedReplyIsCorrupt) {
  GarbageServer garbage;
  ASSERT_NE(garbage.port(), 0);
  auto client = MakeUcx({{"serve", "on_put"}, {"timeout_ms", "20000"}});
  ASSERT_TRUE(client);
  Key key{"ucx", RandomObjectId(), 1, {{"address", "127.0.0.1:" + std::to_string(garbage.port())}}};
  auto got = client->Get(key);
  EXPECT_EQ(got.status().code(), StatusCode::kCorrupt) << got.status().ToString();
  client->Close();
}

// The conformance suite's 2.25 GiB object stays in one process; this one
// crosses the network in chunks and arrives as one Buffer.
TEST(UcxConnector, RemoteGetOver2GiBArrivesInOneBuffer) {
  auto server = MakeUcx();
  ASSERT_TRUE(server);
  const uint64_t size = (uint64_t{9} << 28) + 5;
  uint64_t want;
  Key key;
  {
    Buffer b = testing::PatternTensor(size, 13).data;
    want = Checksum(b.span());
    auto k = server->Put(b);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    key = *k;
  }
  auto client = Rebuild(server->config());
  ASSERT_TRUE(client);
  auto got = client->Get(key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->size(), size);
  EXPECT_EQ(Checksum((*got)->span()), want);
  got = {std::nullopt};
  ASSERT_TRUE(client->Evict(key).ok());
  EXPECT_FALSE(*server->Exists(key));
}

}  // namespace
}  // namespace xsilo
