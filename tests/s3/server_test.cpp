// The embedded S3 server at the HTTP level: raw requests, signed by hand,
// malformed on purpose. Client-level behaviour is in client_test.cpp.
#include "xsilo/s3/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "s3/raw_http.h"
#include "transport/test_util.h"

namespace xsilo {
namespace {

using s3::testing::PresignedTarget;
using s3::testing::RawExchange;
using s3::testing::RawResponse;
using s3::testing::SignedRequest;

constexpr const char* kAk = "test-access";
constexpr const char* kSk = "test-secret";

class ServerTest : public ::testing::TestWithParam<bool> {  // param: directory storage
 protected:
  void SetUp() override {
    S3ServerOptions o;
    o.access_key = kAk;
    o.secret_key = kSk;
    o.buckets = {"bkt"};
    o.max_header_bytes = 8192;
    o.max_object_bytes = 1 << 20;
    if (GetParam()) {
      dir_ = std::filesystem::temp_directory_path() /
             ("xsilo-s3-server-test-" + std::to_string(::getpid()));
      o.directory = dir_.string();
    }
    auto s = S3Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    port_ = server_->port();
  }
  void TearDown() override {
    server_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  RawResponse Signed(const std::string& method, const std::string& path,
                     const std::string& query = "", const std::string& body = "",
                     const std::string& secret = kSk, const std::string& extra = "") {
    return RawExchange(port_, SignedRequest(port_, method, path, query, body, kAk, secret,
                                            "us-east-1", "UNSIGNED-PAYLOAD", extra));
  }
  bool StillServing() {
    RawResponse r = Signed("PUT", "/bkt/alive", "", "ok");
    if (r.status != 200) return false;
    return Signed("GET", "/bkt/alive").body == "ok";
  }

  std::filesystem::path dir_;
  std::unique_ptr<S3Server> server_;
  int port_ = 0;
};

TEST_P(ServerTest, ReportsEphemeralPort) {
  EXPECT_GT(port_, 0);
  EXPECT_EQ(server_->endpoint(), "http://127.0.0.1:" + std::to_string(port_));
}

TEST_P(ServerTest, PutGetHeadDeleteRange) {
  EXPECT_EQ(Signed("PUT", "/bkt/dir/a b.txt", "", "0123456789").status, 200);
  RawResponse g = Signed("GET", "/bkt/dir/a b.txt");
  EXPECT_EQ(g.status, 200);
  EXPECT_EQ(g.body, "0123456789");
  EXPECT_FALSE(g.Header("etag").empty());
  RawResponse r = Signed("GET", "/bkt/dir/a b.txt", "", "", kSk, "Range: bytes=2-4\r\n");
  EXPECT_EQ(r.status, 206);
  EXPECT_EQ(r.body, "234");
  EXPECT_EQ(r.Header("content-range"), "bytes 2-4/10");
  RawResponse tail = Signed("GET", "/bkt/dir/a b.txt", "", "", kSk, "Range: bytes=-3\r\n");
  EXPECT_EQ(tail.body, "789");
  RawResponse open = Signed("GET", "/bkt/dir/a b.txt", "", "", kSk, "Range: bytes=7-\r\n");
  EXPECT_EQ(open.body, "789");
  RawResponse bad = Signed("GET", "/bkt/dir/a b.txt", "", "", kSk, "Range: bytes=10-20\r\n");
  EXPECT_EQ(bad.status, 416);
  EXPECT_NE(bad.body.find("<Code>InvalidRange</Code>"), std::string::npos);
  EXPECT_EQ(bad.Header("content-range"), "bytes */10");
  RawResponse h = Signed("HEAD", "/bkt/dir/a b.txt");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.Header("content-length"), "10");
  EXPECT_TRUE(h.body.empty());
  EXPECT_EQ(Signed("DELETE", "/bkt/dir/a b.txt").status, 204);
  RawResponse gone = Signed("GET", "/bkt/dir/a b.txt");
  EXPECT_EQ(gone.status, 404);
  EXPECT_NE(gone.body.find("<Code>NoSuchKey</Code>"), std::string::npos);
}

TEST_P(ServerTest, EmptyObject) {
  EXPECT_EQ(Signed("PUT", "/bkt/empty").status, 200);
  RawResponse g = Signed("GET", "/bkt/empty");
  EXPECT_EQ(g.status, 200);
  EXPECT_EQ(g.Header("content-length"), "0");
  EXPECT_EQ(Signed("GET", "/bkt/empty", "", "", kSk, "Range: bytes=0-0\r\n").status, 416);
}

TEST_P(ServerTest, BucketLifecycle) {
  EXPECT_EQ(Signed("PUT", "/newbucket").status, 200);
  EXPECT_EQ(Signed("HEAD", "/newbucket").status, 200);
  RawResponse again = Signed("PUT", "/newbucket");
  EXPECT_EQ(again.status, 409);
  EXPECT_NE(again.body.find("BucketAlreadyOwnedByYou"), std::string::npos);
  EXPECT_EQ(Signed("PUT", "/newbucket/k", "", "x").status, 200);
  RawResponse notempty = Signed("DELETE", "/newbucket");
  EXPECT_EQ(notempty.status, 409);
  EXPECT_NE(notempty.body.find("BucketNotEmpty"), std::string::npos);
  EXPECT_EQ(Signed("DELETE", "/newbucket/k").status, 204);
  EXPECT_EQ(Signed("DELETE", "/newbucket").status, 204);
  RawResponse nb = Signed("GET", "/newbucket/k");
  EXPECT_EQ(nb.status, 404);
  EXPECT_NE(nb.body.find("<Code>NoSuchBucket</Code>"), std::string::npos);
  EXPECT_EQ(Signed("PUT", "/Bad_Name").status, 400);
  RawResponse list = Signed("GET", "/");
  EXPECT_EQ(list.status, 200);
  EXPECT_NE(list.body.find("<Name>bkt</Name>"), std::string::npos);
}

TEST_P(ServerTest, ListObjectsV2WithDelimiterAndPaging) {
  for (const char* k : {"a/1", "a/2", "b/1", "c", "d"}) {
    ASSERT_EQ(Signed("PUT", std::string("/bkt/") + k, "", "x").status, 200);
  }
  RawResponse r = Signed("GET", "/bkt", "delimiter=%2F&list-type=2");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("<CommonPrefixes><Prefix>a/</Prefix></CommonPrefixes>"), std::string::npos);
  EXPECT_NE(r.body.find("<CommonPrefixes><Prefix>b/</Prefix></CommonPrefixes>"), std::string::npos);
  EXPECT_NE(r.body.find("<Key>c</Key>"), std::string::npos);
  EXPECT_EQ(r.body.find("<Key>a/1</Key>"), std::string::npos);
  RawResponse p = Signed("GET", "/bkt", "list-type=2&max-keys=2");
  EXPECT_NE(p.body.find("<IsTruncated>true</IsTruncated>"), std::string::npos);
  EXPECT_NE(p.body.find("<Key>a/2</Key>"), std::string::npos);
  size_t t0 = p.body.find("<NextContinuationToken>") + 23;
  std::string token = p.body.substr(t0, p.body.find("</NextContinuationToken>") - t0);
  RawResponse p2 = Signed(
      "GET", "/bkt", "continuation-token=" + s3::UriEncode(token) + "&list-type=2&max-keys=10");
  EXPECT_EQ(p2.status, 200) << p2.body;
  EXPECT_NE(p2.body.find("<Key>b/1</Key>"), std::string::npos);
  EXPECT_EQ(p2.body.find("<Key>a/2</Key>"), std::string::npos);
  EXPECT_NE(p2.body.find("<KeyCount>3</KeyCount>"), std::string::npos);
}

TEST_P(ServerTest, WrongSecretIsSignatureDoesNotMatch) {
  RawResponse r = Signed("GET", "/bkt/x", "", "", "not-the-secret");
  EXPECT_EQ(r.status, 403);
  EXPECT_NE(r.body.find("<Code>SignatureDoesNotMatch</Code>"), std::string::npos);
}

TEST_P(ServerTest, UnknownAccessKeyAndUnsignedAreRejected) {
  RawResponse r =
      RawExchange(port_, SignedRequest(port_, "GET", "/bkt/x", "", "", "someone-else", kSk));
  EXPECT_EQ(r.status, 403);
  EXPECT_NE(r.body.find("InvalidAccessKeyId"), std::string::npos);
  RawResponse anon = RawExchange(port_, "GET /bkt/x HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(anon.status, 403);
  EXPECT_NE(anon.body.find("AccessDenied"), std::string::npos);
}

TEST_P(ServerTest, SkewedClockIsRejected) {
  RawResponse r =
      RawExchange(port_, SignedRequest(port_, "GET", "/bkt/x", "", "", kAk, kSk, "us-east-1",
                                       "UNSIGNED-PAYLOAD", "", std::time(nullptr) - 3600));
  EXPECT_EQ(r.status, 403);
  EXPECT_NE(r.body.find("RequestTimeTooSkewed"), std::string::npos);
}

TEST_P(ServerTest, PayloadSha256IsVerified) {
  std::string body = "Welcome to Amazon S3.";
  std::string good = "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072";
  RawResponse ok = RawExchange(
      port_, SignedRequest(port_, "PUT", "/bkt/w", "", body, kAk, kSk, "us-east-1", good));
  EXPECT_EQ(ok.status, 200);
  std::string bad = std::string(63, '0') + "1";
  RawResponse r = RawExchange(
      port_, SignedRequest(port_, "PUT", "/bkt/w2", "", body, kAk, kSk, "us-east-1", bad));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("XAmzContentSHA256Mismatch"), std::string::npos);
  EXPECT_EQ(Signed("GET", "/bkt/w2").status, 404);
}

TEST_P(ServerTest, ContentMd5AndChecksumAreVerified) {
  // MD5("hello") = 5d41402abc4b2a76b9719d911017c592
  RawResponse ok =
      Signed("PUT", "/bkt/m", "", "hello", kSk, "Content-MD5: XUFAKrxLKna5cZ2REBfFkg==\r\n");
  EXPECT_EQ(ok.status, 200);
  RawResponse bad =
      Signed("PUT", "/bkt/m2", "", "hellO", kSk, "Content-MD5: XUFAKrxLKna5cZ2REBfFkg==\r\n");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("BadDigest"), std::string::npos);
  // SHA-256("hello") in base64.
  std::string sha = "LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=";
  RawResponse ok2 =
      Signed("PUT", "/bkt/c", "", "hello", kSk, "x-amz-checksum-sha256: " + sha + "\r\n");
  EXPECT_EQ(ok2.status, 200);
  EXPECT_EQ(ok2.Header("x-amz-checksum-sha256"), sha);
  RawResponse bad2 =
      Signed("PUT", "/bkt/c2", "", "hellO", kSk, "x-amz-checksum-sha256: " + sha + "\r\n");
  EXPECT_EQ(bad2.status, 400);
  EXPECT_NE(bad2.body.find("BadDigest"), std::string::npos);
}

TEST_P(ServerTest, PresignedUrlWorksUntilItExpires) {
  ASSERT_EQ(Signed("PUT", "/bkt/p", "", "presigned!").status, 200);
  std::string fresh = PresignedTarget(port_, "GET", "/bkt/p", kAk, kSk, 60, std::time(nullptr));
  RawResponse ok = RawExchange(
      port_, "GET " + fresh + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port_) + "\r\n\r\n");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "presigned!");
  std::string old = PresignedTarget(port_, "GET", "/bkt/p", kAk, kSk, 60, std::time(nullptr) - 120);
  RawResponse expired = RawExchange(
      port_, "GET " + old + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port_) + "\r\n\r\n");
  EXPECT_EQ(expired.status, 403);
  EXPECT_NE(expired.body.find("<Code>AccessDenied</Code>"), std::string::npos);
  EXPECT_NE(expired.body.find("Request has expired"), std::string::npos);
  // Tampering with the query breaks the signature.
  std::string tampered = fresh;
  tampered.replace(tampered.find("X-Amz-Expires=60"), 16, "X-Amz-Expires=99");
  RawResponse t = RawExchange(port_, "GET " + tampered + " HTTP/1.1\r\nHost: 127.0.0.1:" +
                                         std::to_string(port_) + "\r\n\r\n");
  EXPECT_EQ(t.status, 403);
  EXPECT_NE(t.body.find("SignatureDoesNotMatch"), std::string::npos);
}

TEST_P(ServerTest, MalformedRequestsGet400AndServerKeepsServing) {
  const char* bad[] = {
      "GARBAGE\r\n\r\n",
      "GET\r\n\r\n",
      "GET /bkt/x HTTP/9.9\r\n\r\n",
      "GET bkt HTTP/1.1\r\n\r\n",
      "GET /bkt/x HTTP/1.1\r\nNoColonHeader\r\n\r\n",
      "PUT /bkt/x HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
      "PUT /bkt/x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
      "G(T /bkt/x HTTP/1.1\r\n\r\n",
      "GET /bkt/%zz HTTP/1.1\r\nHost: x\r\n\r\n",
  };
  for (const char* b : bad) {
    RawResponse r = RawExchange(port_, b);
    EXPECT_EQ(r.status, 400) << b;
  }
  // Oversized header section.
  std::string big = "GET /bkt/x HTTP/1.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n";
  EXPECT_EQ(RawExchange(port_, big).status, 431);
  // Truncated requests and early disconnects.
  EXPECT_EQ(RawExchange(port_, "GET /bkt/x HT", 300).status, 0);
  std::string cut = SignedRequest(port_, "PUT", "/bkt/cut", "", "0123456789", kAk, kSk);
  EXPECT_EQ(RawExchange(port_, cut.substr(0, cut.size() - 5), 300).status, 0);
  // Binary junk.
  std::string junk(4096, '\0');
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(i * 131 + 7);
  RawExchange(port_, junk + "\r\n\r\n", 1000);
  EXPECT_TRUE(StillServing());
}

TEST_P(ServerTest, ObjectSizeLimitIsEnforced) {
  std::string req = SignedRequest(port_, "PUT", "/bkt/huge", "", "", kAk, kSk);
  req.replace(req.find("Content-Length: 0"), 17, "Content-Length: 99999999");
  RawResponse r = RawExchange(port_, req);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("EntityTooLarge"), std::string::npos);
  EXPECT_TRUE(StillServing());
}

TEST_P(ServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  std::string two = SignedRequest(port_, "PUT", "/bkt/ka", "", "abc", kAk, kSk);
  two.replace(two.find("Connection: close"), 17, "Connection: keep-alive");
  two += SignedRequest(port_, "GET", "/bkt/ka", "", "", kAk, kSk);
  // Read until the server closes after the second (Connection: close) answer.
  RawResponse r = RawExchange(port_, two, 10000, /*until_close=*/true);
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("HTTP/1.1 200 OK"), std::string::npos);
  EXPECT_NE(r.body.find("abc"), std::string::npos);
}

// One kept-alive client connection, driven request by request.
class KeptAlive {
 public:
  explicit KeptAlive(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
  }
  ~KeptAlive() { ::close(fd_); }
  bool connected() const { return connected_; }
  // Sends one request and reads its response (headers + Content-Length
  // body); "" when nothing complete arrived within timeout_ms.
  std::string Exchange(std::string request, int timeout_ms = 10000) {
    auto pos = request.find("Connection: close");
    if (pos != std::string::npos) request.replace(pos, 17, "Connection: keep-alive");
    if (::send(fd_, request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
      return "";
    }
    std::string got;
    while (true) {
      auto end = got.find("\r\n\r\n");
      if (end != std::string::npos) {
        auto cl = got.find("Content-Length: ");
        size_t len = cl == std::string::npos ? 0 : std::stoul(got.substr(cl + 16));
        if (got.size() >= end + 4 + len) return got;
      }
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) return "";
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return "";
      got.append(buf, static_cast<size_t>(n));
    }
  }
  // True when the server closed the connection within timeout_ms.
  bool ClosedByPeer(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char c;
    return ::recv(fd_, &c, 1, 0) == 0;
  }

 private:
  int fd_;
  bool connected_ = false;
};

// Idle keep-alive connections wait in the acceptor's poll set, not in a
// worker: with one worker, a client that keeps its connection open must not
// lock out every other client until the idle limit.
TEST(ServerConnections, IdleKeepAliveConnectionsHoldNoWorker) {
  S3ServerOptions o;
  o.access_key = kAk;
  o.secret_key = kSk;
  o.buckets = {"bkt"};
  o.max_connections = 1;
  o.idle_timeout = std::chrono::seconds(120);
  auto s = S3Server::Start(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const int port = (*s)->port();
  std::vector<std::unique_ptr<KeptAlive>> conns;
  for (int i = 0; i < 6; ++i) {
    conns.push_back(std::make_unique<KeptAlive>(port));
    ASSERT_TRUE(conns.back()->connected());
    std::string key = "/bkt/k" + std::to_string(i);
    std::string r = conns.back()->Exchange(
        SignedRequest(port, "PUT", key, "", "v" + std::to_string(i), kAk, kSk));
    ASSERT_NE(r.find("HTTP/1.1 200"), std::string::npos) << "connection " << i << ": " << r;
  }
  // Every connection is still open and served again, in reverse order.
  for (int i = 5; i >= 0; --i) {
    std::string r = conns[i]->Exchange(
        SignedRequest(port, "GET", "/bkt/k" + std::to_string(i), "", "", kAk, kSk));
    ASSERT_NE(r.find("HTTP/1.1 200"), std::string::npos) << "connection " << i << ": " << r;
    EXPECT_EQ(r.substr(r.size() - 2), "v" + std::to_string(i));
  }
}

TEST(ServerConnections, IdleConnectionIsClosedAfterTheIdleLimit) {
  S3ServerOptions o;
  o.access_key = kAk;
  o.secret_key = kSk;
  o.buckets = {"bkt"};
  o.idle_timeout = std::chrono::milliseconds(200);
  auto s = S3Server::Start(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  KeptAlive c((*s)->port());
  ASSERT_TRUE(c.connected());
  std::string r = c.Exchange(SignedRequest((*s)->port(), "PUT", "/bkt/x", "", "1", kAk, kSk));
  ASSERT_NE(r.find("HTTP/1.1 200"), std::string::npos) << r;
  EXPECT_TRUE(c.ClosedByPeer(10000));
  // A connection that never sends a request is closed too.
  KeptAlive silent((*s)->port());
  ASSERT_TRUE(silent.connected());
  EXPECT_TRUE(silent.ClosedByPeer(10000));
}

// A server keeping bucket "bkt" in `dir`.
Result<std::unique_ptr<S3Server>> StartInDirectory(const std::filesystem::path& dir) {
  S3ServerOptions o;
  o.access_key = kAk;
  o.secret_key = kSk;
  o.buckets = {"bkt"};
  o.directory = dir.string();
  return S3Server::Start(o);
}

// The inode of this process's TCP socket (IPv4) bound to `local_port` and
// connected to `remote_port`, from /proc/net/tcp; 0 if there is none.
uint64_t SocketInode(int local_port, int remote_port) {
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // the header
  auto port_of = [](const std::string& address) {
    const size_t colon = address.find(':');
    return colon == std::string::npos ? -1 : std::stoi(address.substr(colon + 1), nullptr, 16);
  };
  while (std::getline(tcp, line)) {
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
    uint64_t inode = 0;
    if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode)) {
      continue;
    }
    if (port_of(local) == local_port && port_of(remote) == remote_port) return inode;
  }
  return 0;
}

// Whether a file descriptor of this process is the socket with `inode`.
bool ProcessHoldsSocket(uint64_t inode) {
  const std::string target = "socket:[" + std::to_string(inode) + "]";
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code link_ec;
    if (std::filesystem::read_symlink(fd.path(), link_ec) == target) return true;
  }
  return false;
}

// A client that hangs up in the middle of a body sent by sendfile(2)
// (which, unlike sendmsg, cannot be told MSG_NOSIGNAL) raises SIGPIPE in the
// server's worker: the worker blocks it, so the process lives on and
// serves the next request. (Run in this test's own process: a SIGPIPE
// that got through would end the test binary.)
TEST(ServerDirectory, AClientThatHangsUpMidSendfileDoesNotKillTheServer) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("xsilo-s3-hangup-" + std::to_string(::getpid()));
  auto s = StartInDirectory(dir);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  GatherList body;
  auto big = Buffer::Allocate(64ull << 20);
  ASSERT_TRUE(big.ok());
  std::memset(big->mutable_data(), 7, big->size());
  body.Append(*big);
  ASSERT_TRUE(PutObjectInDirectory(dir.string(), "bkt", "big", body).ok());
  GatherList small;
  small.Append(Buffer::CopyFrom("still here"));
  ASSERT_TRUE(PutObjectInDirectory(dir.string(), "bkt", "small", small).ok());
  const int port = (*s)->port();
  for (int i = 0; i < 3; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    sockaddr_in local{};
    socklen_t local_len = sizeof local;
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len), 0);
    const std::string req = SignedRequest(port, "GET", "/bkt/big", "", "", kAk, kSk);
    ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    char buf[1 << 16];
    ssize_t got = 0;
    while (got < (1 << 20)) {  // the body is flowing
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      ASSERT_GT(n, 0);
      got += n;
    }
    // Accepted by now (a socket waiting in the accept queue has no inode yet).
    const uint64_t server_end = SocketInode(port, ntohs(local.sin_port));
    ASSERT_NE(server_end, 0u) << "the server's end of connection " << i << " is not listed";
    // Unread bytes in the receive queue make close() send a reset.
    ::close(fd);
    // The worker closes its end only once its send has failed on the reset,
    // i.e. after any SIGPIPE it raised: from then on the process must live.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (ProcessHoldsSocket(server_end) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_FALSE(ProcessHoldsSocket(server_end))
        << "the server never closed connection " << i << " after the client hung up";
  }
  RawResponse r = RawExchange(port, SignedRequest(port, "GET", "/bkt/small", "", "", kAk, kSk));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "still here");
  s->reset();
  std::filesystem::remove_all(dir);
}

// A co-located party writes into a directory server's storage; the server
// serves the object at once, with an ETag, as if it had been PUT.
TEST(ServerDirectory, LocalPutIsServedAtOnceAndLocalGetMapsTheFile) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("xsilo-s3-local-put-" + std::to_string(::getpid()));
  auto s = StartInDirectory(dir);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  GatherList body;
  body.Append(Buffer::CopyFrom("hello, "));
  body.Append(Buffer());
  body.Append(Buffer::CopyFrom("world"));
  ASSERT_TRUE(PutObjectInDirectory(dir.string(), "bkt", "dir/k", body).ok());
  const int port = (*s)->port();
  RawResponse r = RawExchange(port, SignedRequest(port, "GET", "/bkt/dir/k", "", "", kAk, kSk));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "hello, world");
  EXPECT_EQ(r.Header("etag").size(), 34u);  // quoted 128-bit hex
  auto back = GetObjectFromDirectory(dir.string(), "bkt", "dir/k");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->view(), "hello, world");
  // Deleted through the server: gone for the next reader, still readable
  // through the mapping already taken.
  EXPECT_EQ(RawExchange(port, SignedRequest(port, "DELETE", "/bkt/dir/k", "", "", kAk, kSk)).status,
            204);
  EXPECT_EQ(GetObjectFromDirectory(dir.string(), "bkt", "dir/k").status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(back->view(), "hello, world");
  EXPECT_EQ(PutObjectInDirectory(dir.string(), "nobucket", "k", body).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(PutObjectInDirectory("", "bkt", "k", body).code(), StatusCode::kInvalidArgument);
  s->reset();
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Storage, ServerTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Directory" : "Memory"; });

// Out of descriptors, the server answers each connection it cannot take
// with 503 and closes it, instead of leaving it unanswered in the kernel's
// accept queue (where the client times out and the acceptor spins).
TEST(ServerLimits, AConnectionPastTheDescriptorLimitIsAnswered503) {
  S3ServerOptions o;
  o.allow_anonymous = true;
  o.buckets = {"bkt"};
  o.max_connections = 64;
  auto server = S3Server::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  constexpr int kClients = 16;
  std::vector<int> socks;
  for (int i = 0; i < kClients; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    timeval tv{20, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    socks.push_back(fd);
  }
  int open_fds = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++open_fds;
  }
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(open_fds + 3);  // room for about 3 connections
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>((*server)->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const std::string request = "GET /bkt/missing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  std::vector<std::string> replies;
  for (int fd : socks) {
    std::string reply;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(request.size())) {
      char buf[256];
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n > 0) reply.assign(buf, static_cast<size_t>(n));
    }
    replies.push_back(reply);
  }
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  int refused = 0;
  for (size_t i = 0; i < replies.size(); ++i) {
    EXPECT_EQ(replies[i].rfind("HTTP/1.1 ", 0), 0u) << "connection " << i << " got no answer";
    refused += replies[i].rfind("HTTP/1.1 503", 0) == 0;
  }
  EXPECT_GE(refused, 1) << "the limit was never reached";
  for (int fd : socks) ::close(fd);
  // With descriptors again, it serves.
  auto after = RawExchange((*server)->port(), request);
  EXPECT_NE(after.status, 503);
}

}  // namespace
}  // namespace xsilo
