#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <tuple>
#include <vector>

#include "s3/s3rver.h"
#include "store/connector_conformance.h"
#include "store/redis_server.h"
#include "transport/test_util.h"
#include "xsilo/s3/server.h"

namespace xsilo::testing {
namespace {

std::atomic<int> g_counter{0};

// Directories made for file connectors, removed when the process exits.
struct TempDirs {
  std::mutex mu;
  std::vector<std::filesystem::path> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};

std::string FreshDir() {
  static TempDirs temp;
  auto dir =
      std::filesystem::temp_directory_path() /
      ("xsilo-file-connector-" + std::to_string(getpid()) + "-" + std::to_string(g_counter++));
  std::lock_guard<std::mutex> lock(temp.mu);
  temp.dirs.push_back(dir);
  return dir.string();
}

constexpr const char* kS3Ak = "conformance-access";
constexpr const char* kS3Sk = "conformance-secret";

// The embedded S3 server (memory storage), started on first use and kept
// for the life of the process; a child process resolving a key reaches it
// through the endpoint in config().
std::string EmbeddedS3Endpoint() {
  static const std::unique_ptr<S3Server> server = [] {
    S3ServerOptions o;
    o.access_key = kS3Ak;
    o.secret_key = kS3Sk;
    auto s = S3Server::Start(o);
    if (!s.ok()) {
      std::fprintf(stderr, "cannot start the embedded S3 server: %s\n",
                   s.status().ToString().c_str());
      std::abort();
    }
    ::testing::AddGlobalTestEnvironment(new StopAtEnd<S3Server>(s->get()));
    return std::move(s).value();
  }();
  return server->endpoint();
}

// A fresh prefix per test; the connector creates the bucket. Small parts so
// that multipart uploads (and many ranges) are exercised.
ConnectorConfig S3Config(const std::string& endpoint, const std::string& bucket,
                         const std::string& access_key, const std::string& secret_key,
                         uint64_t part_bytes) {
  return ConnectorConfig{"s3",
                         {{"endpoint", endpoint},
                          {"bucket", bucket},
                          {"access_key", access_key},
                          {"secret_key", secret_key},
                          {"addressing", "path"},
                          {"prefix", "t" + std::to_string(g_counter++) + "/"},
                          {"part_bytes", std::to_string(part_bytes)},
                          {"connections", "4"},
                          {"concurrency", "4"}}};
}

}  // namespace
}  // namespace xsilo::testing

XSILO_CONNECTOR_CONFORMANCE(
    Memory,
    {.name = "memory",
     .config =
         [] {
           return ::xsilo::ConnectorConfig{"memory", {{"name", "t" + std::to_string(g_counter++)}}};
         },
     .cross_process = false});

XSILO_CONNECTOR_CONFORMANCE(File, {.name = "file", .config = [] {
                                     return ::xsilo::ConnectorConfig{"file", {{"dir", FreshDir()}}};
                                   }});

// The faulty decorator with every rate 0 over a file connector (the inner
// connector's own large-object path is covered by File).
XSILO_CONNECTOR_CONFORMANCE(Faulty, {.name = "faulty",
                                     .config =
                                         [] {
                                           return ::xsilo::ConnectorConfig{
                                               "faulty",
                                               {{"inner", "file"},
                                                {"inner.dir", FreshDir()},
                                                {"fault.seed", "1"},
                                                {"fault.drop", "0"},
                                                {"fault.corrupt", "0"}}};
                                         },
                                     .huge_payloads = false});

// Small parts so that multi-part objects are exercised at every size.
XSILO_CONNECTOR_CONFORMANCE(Redis, {.name = "redis", .config = [] {
                                      return ::xsilo::ConnectorConfig{
                                          "redis",
                                          {{"port", std::to_string(RedisTestPort())},
                                           {"prefix", "t" + std::to_string(g_counter++)},
                                           {"part_bytes", std::to_string(64 << 20)}}};
                                    }});

// A server that wants AUTH: the password is an option, and config() (every
// reference) must not carry it; the cross-process child has it in
// REDISCLI_AUTH, as a receiving site keeps its own.
XSILO_CONNECTOR_CONFORMANCE(RedisAuth, {.name = "redis_auth",
                                        .config =
                                            [] {
                                              return ::xsilo::ConnectorConfig{
                                                  "redis",
                                                  {{"port", std::to_string(RedisAuthTestPort())},
                                                   {"password", kRedisTestPassword},
                                                   {"prefix", "a" + std::to_string(g_counter++)}}};
                                            },
                                        .huge_payloads = false});

XSILO_CONNECTOR_CONFORMANCE(S3, {.name = "s3", .config = [] {
                                   return S3Config(EmbeddedS3Endpoint(), "conformance", kS3Ak,
                                                   kS3Sk, 8 << 20);
                                 }});

// s3rver (npm, installed by scripts/install-deps.sh): one per test process.
// A missing s3rver fails the test with a message, it does not skip.
XSILO_CONNECTOR_CONFORMANCE(S3rver, {.name = "s3rver",
                                     .config =
                                         [] {
                                           Status up = StartSharedS3rver();
                                           if (!up.ok()) ADD_FAILURE() << up.ToString();
                                           return S3Config(SharedS3rverEndpoint(), "conformance",
                                                           S3rver::kAccessKey, S3rver::kSecretKey,
                                                           64 << 20);
                                         },
                                     .huge_payloads = false});

namespace xsilo {
namespace {

// A child forked from a thread that made ids already makes other ids than
// its parent (process pools fork workers from such threads; repeated ids
// made their objects overwrite and evict each other's).
TEST(RandomObjectId, AForkedChildDoesNotRepeatItsParent) {
  (void)RandomObjectId();  // this thread's generator is seeded
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string id = RandomObjectId();
    _exit(::write(fds[1], id.data(), id.size()) == static_cast<ssize_t>(id.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  const std::string parent = RandomObjectId();
  char buf[32];
  ASSERT_EQ(::read(fds[0], buf, sizeof(buf)), 32);
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_NE(std::string(buf, 32), parent);
}

// Ids are not predictable from ids already seen (the embedded store's
// credentials are minted by RandomObjectId too). The attack this checks
// for: a Mersenne Twister (std::mt19937_64, what ids came from before) is
// linear, so 312 of its outputs, untempered, are its whole state, and the
// next output follows. 156 ids are 312 outputs if an id is two of them in
// the old layout (16 hex digits each, least significant nibble first);
// the prediction must not match the next id.
uint64_t InvertShiftLeftXor(uint64_t y, int shift, uint64_t mask) {
  uint64_t x = y;
  for (int i = 0; i < 64 / shift + 1; ++i) x = y ^ ((x << shift) & mask);
  return x;
}
uint64_t InvertShiftRightXor(uint64_t y, int shift, uint64_t mask) {
  uint64_t x = y;
  for (int i = 0; i < 64 / shift + 1; ++i) x = y ^ ((x >> shift) & mask);
  return x;
}
uint64_t Untemper(uint64_t y) {
  y = InvertShiftRightXor(y, 43, ~0ULL);
  y = InvertShiftLeftXor(y, 37, 0xFFF7EEE000000000ULL);
  y = InvertShiftLeftXor(y, 17, 0x71D67FFFEDA60000ULL);
  return InvertShiftRightXor(y, 29, 0x5555555555555555ULL);
}
uint64_t Temper(uint64_t y) {
  y ^= (y >> 29) & 0x5555555555555555ULL;
  y ^= (y << 17) & 0x71D67FFFEDA60000ULL;
  y ^= (y << 37) & 0xFFF7EEE000000000ULL;
  return y ^ (y >> 43);
}
// The twist: word k+312 of the state sequence from words k, k+1 and k+156.
uint64_t NextWord(uint64_t xk, uint64_t xk1, uint64_t xkm) {
  const uint64_t y = (xk & 0xFFFFFFFF80000000ULL) | (xk1 & 0x7FFFFFFFULL);
  return xkm ^ (y >> 1) ^ ((y & 1) ? 0xB5026F5AA96619E9ULL : 0);
}
// The two generator outputs an id of the old layout was made of.
std::pair<uint64_t, uint64_t> OutputsOf(const std::string& id) {
  auto nibble = [](char c) -> uint64_t { return c <= '9' ? c - '0' : c - 'a' + 10; };
  uint64_t a = 0, b = 0;
  for (int i = 0; i < 16; ++i) {
    a |= nibble(id[i]) << (4 * i);
    b |= nibble(id[16 + i]) << (4 * i);
  }
  return {a, b};
}
std::string IdOf(uint64_t a, uint64_t b) {
  static const char* hex = "0123456789abcdef";
  std::string id(32, '0');
  for (int i = 0; i < 16; ++i) {
    id[i] = hex[(a >> (4 * i)) & 15];
    id[16 + i] = hex[(b >> (4 * i)) & 15];
  }
  return id;
}

TEST(RandomObjectId, TheNextIdCannotBePredictedFromTheIdsBeforeIt) {
  // The predictor works: on a real std::mt19937_64 it foretells the next id.
  auto predict = [](const std::vector<std::string>& ids) {
    std::vector<uint64_t> x;
    for (const auto& id : ids) {
      auto [a, b] = OutputsOf(id);
      x.push_back(Untemper(a));
      x.push_back(Untemper(b));
    }
    const uint64_t n0 = NextWord(x[0], x[1], x[156]);
    const uint64_t n1 = NextWord(x[1], x[2], x[157]);
    return IdOf(Temper(n0), Temper(n1));
  };
  std::mt19937_64 twister(12345);
  for (int i = 0; i < 1000; ++i) (void)twister();  // not at a block boundary
  std::vector<std::string> seen;
  for (int i = 0; i < 156; ++i) {
    const uint64_t a = twister(), b = twister();
    seen.push_back(IdOf(a, b));
  }
  const uint64_t a = twister(), b = twister();
  ASSERT_EQ(predict(seen), IdOf(a, b)) << "the predictor itself is wrong";

  seen.clear();
  for (int i = 0; i < 156; ++i) seen.push_back(RandomObjectId());
  EXPECT_NE(predict(seen), RandomObjectId());
}

TEST(ConnectorRegistry, UnknownTypeAndBadOptions) {
  EXPECT_EQ(MakeConnector({"tape", {}}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(MakeConnector({"file", {}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeConnector({"file", {{"dir", "/tmp/x"}, {"speed", "fast"}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeConnector({"redis", {{"part_bytes", "1000000000"}}}).status().code(),
            StatusCode::kInvalidArgument);
}

// Every connector type reads its options through its table
// (src/store/connector_options.cpp): a misspelt key is refused naming the
// nearest valid one, and a value out of range names the key and the range.
TEST(ConnectorRegistry, EachTypeRefusesAMisspeltKeyByTheNearestAndAValueByItsRange) {
  const std::string dir = ::testing::TempDir() + "xsilo-options-" + RandomObjectId();
  const std::vector<std::tuple<std::string, std::map<std::string, std::string>, std::string>>
      misspelt = {
          {"memory", {{"nme", "a"}}, "name"},
          {"file", {{"dir", dir}, {"fsyn", "1"}}, "fsync"},
          {"redis", {{"portt", "6379"}}, "port"},
          {"s3", {{"bucket", "b"}, {"buckett", "c"}}, "bucket"},
          {"endpoint", {{"address", "127.0.0.1:1"}, {"timeout", "5"}}, "timeout_ms"},
          {"zmq", {{"rol", "client"}}, "role"},
          {"multi", {{"connector", "[]"}}, "connectors"},
          {"faulty", {{"inner", "memory"}, {"fault.fial", "0.5"}}, "fault.fail"},
      };
  for (const auto& [type, options, nearest] : misspelt) {
    auto c = MakeConnector({type, options});
    ASSERT_EQ(c.status().code(), StatusCode::kInvalidArgument) << type;
    EXPECT_NE(c.status().message().find("'" + nearest + "'"), std::string::npos)
        << type << ": " << c.status().message();
  }
  const std::vector<std::tuple<std::string, std::map<std::string, std::string>, std::string>>
      out_of_range = {
          {"file", {{"dir", dir}, {"fsync", "yes"}}, "fsync='yes' must be 0 or 1"},
          {"redis", {{"pool", "0"}}, "pool='0' must be"},
          {"s3", {{"bucket", "b"}, {"part_bytes", "1024"}}, "part_bytes='1024' must be"},
          {"zmq", {{"role", "both"}}, "role='both' must be one of"},
          {"faulty", {{"inner", "memory"}, {"fault.fail", "2"}}, "fault.fail='2' must be"},
      };
  for (const auto& [type, options, says] : out_of_range) {
    auto c = MakeConnector({type, options});
    ASSERT_EQ(c.status().code(), StatusCode::kInvalidArgument) << type;
    EXPECT_NE(c.status().message().find(says), std::string::npos)
        << type << ": " << c.status().message();
  }
  std::filesystem::remove_all(dir);
}

TEST(ConnectorRegistry, UnreachableRedisIsUnavailable) {
  auto c = MakeConnector({"redis", {{"port", std::to_string(testing::FreeTcpPort())}}});
  ASSERT_TRUE(c.ok());
  auto k = (*c)->Put(Buffer::CopyFrom("x"));
  EXPECT_EQ(k.status().code(), StatusCode::kUnavailable);
}

TEST(Key, JsonRoundTripAndValidation) {
  Key k{"s3", "abc", 1ull << 40, {{"bucket", "b"}}};
  auto back = Key::FromJson(k.ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, k);
  EXPECT_FALSE(Key::FromJson("{\"c\":\"s3\"}").ok());
  EXPECT_FALSE(Key::FromJson("not json").ok());
  EXPECT_FALSE(Key::FromJson(R"({"c":"s3","id":"x","size":-1})").ok());
}

// A key id that names a path (relative climb, absolute, hidden, nested) is
// refused by every operation that takes a key, and nothing outside the
// directory is read, created or removed.
TEST(FileConnector, RejectsPathTraversalOnEveryOperation) {
  const std::filesystem::path outside = testing::FreshDir();
  const std::filesystem::path dir = outside / "store";
  std::filesystem::create_directories(dir);
  const std::filesystem::path victim = outside / "victim";
  { std::ofstream(victim) << "do not touch"; }
  auto c = MakeConnector({"file", {{"dir", dir.string()}}});
  ASSERT_TRUE(c.ok());
  const std::string ids[] = {"../victim",      "..",          "../store/../victim",
                             victim.string(),  "/etc/passwd", ".tmp-x",
                             "a/../../victim", "sub/x",       "",
                             "..%2Fvictim"};
  GatherList body;
  body.Append(Buffer::CopyFrom("evil"));
  for (const std::string& id : ids) {
    const Key key{"file", id, 4, {}};
    EXPECT_EQ((*c)->Get(key).status().code(), StatusCode::kInvalidArgument) << id;
    EXPECT_EQ((*c)->Exists(key).status().code(), StatusCode::kInvalidArgument) << id;
    EXPECT_EQ((*c)->Evict(key).code(), StatusCode::kInvalidArgument) << id;
    EXPECT_EQ((*c)->Set(key, body).code(), StatusCode::kInvalidArgument) << id;
  }
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "do not touch");
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(outside)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 2);  // store/ and victim: nothing written beside them
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

// A key from Put records its object's size; an object of another size
// under it (a server that acknowledged a PUT before its bytes were
// readable, another writer) is refused, not returned. A key of unknown
// size (0, from NewKey) takes what is there.
TEST(S3Connector, AnObjectOfAnotherSizeThanItsKeyIsRefused) {
  auto c = MakeConnector(testing::S3Config(testing::EmbeddedS3Endpoint(), "sizes", testing::kS3Ak,
                                           testing::kS3Sk, 8 << 20));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto key = (*c)->Put(Buffer::CopyFrom("abcdef"));
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_EQ(key->size, 6u);
  Key longer = *key;
  longer.size = 7;
  auto got = (*c)->Get(longer);
  ASSERT_EQ(got.status().code(), StatusCode::kCorrupt) << got.status().ToString();
  EXPECT_NE(got.status().message().find("holds 6 bytes, its key says 7"), std::string::npos)
      << got.status().ToString();
  Key unknown = *key;
  unknown.size = 0;
  got = (*c)->Get(unknown);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->view(), "abcdef");
}

// A config carries the access key and never the secret; where a connector
// made from it finds the secret (s3_connector.cpp's header).
TEST(S3Connector, ASecretIsFoundWhereTheReceivingSideKeepsIt) {
  const ConnectorConfig full = testing::S3Config(testing::EmbeddedS3Endpoint(), "secrets",
                                                 testing::kS3Ak, testing::kS3Sk, 8 << 20);
  auto made = MakeConnector(full);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const ConnectorConfig shared = (*made)->config();
  EXPECT_EQ(shared.options.count("secret_key"), 0u);
  EXPECT_EQ(shared.ToJson().find(testing::kS3Sk), std::string::npos);
  EXPECT_EQ(shared.options.at("access_key"), testing::kS3Ak);
  // In this process: the secret of the connector made above.
  auto again = MakeConnector(shared);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto key = (*again)->Put(Buffer::CopyFrom("kept"));
  ASSERT_TRUE(key.ok()) << key.status().ToString();

  // Another prefix with the same key (a crafted reference) gets nothing
  // from this process's connectors.
  ConnectorConfig other_prefix = shared;
  other_prefix.options["prefix"] = "someone-else/";
  EXPECT_EQ(MakeConnector(other_prefix).status().code(), StatusCode::kInvalidArgument);

  // Elsewhere (an endpoint this process made no connector for): nothing to
  // find is a clear error, not an unsigned request.
  ConnectorConfig elsewhere = shared;
  elsewhere.options["endpoint"] = "http://127.0.0.1:1";
  elsewhere.options["create_bucket"] = "0";
  auto refused = MakeConnector(elsewhere);
  ASSERT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("no secret for access key"), std::string::npos)
      << refused.status().ToString();

  // From a file the receiving side holds (its path travels, not its text).
  const auto dir = std::filesystem::temp_directory_path() / ("xsilo-secret-" + RandomObjectId());
  std::filesystem::create_directories(dir);
  const auto file = dir / "secret";
  std::ofstream(file) << testing::kS3Sk << "\n";
  std::filesystem::permissions(
      file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  ConnectorConfig from_file = shared;
  from_file.options["secret_key_file"] = file.string();
  from_file.options["endpoint"] = testing::EmbeddedS3Endpoint() + "/";  // not the known one
  auto by_file = MakeConnector(from_file);
  ASSERT_TRUE(by_file.ok()) << by_file.status().ToString();
  auto got = (*by_file)->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->view(), "kept");
  EXPECT_EQ((*by_file)->config().ToJson().find(testing::kS3Sk), std::string::npos);

  std::filesystem::permissions(file, std::filesystem::perms::group_read,
                               std::filesystem::perm_options::add);
  auto shared_file = MakeConnector(from_file);
  EXPECT_EQ(shared_file.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shared_file.status().message().find("chmod 600"), std::string::npos)
      << shared_file.status().ToString();
  std::filesystem::permissions(file, std::filesystem::perms::group_read,
                               std::filesystem::perm_options::remove);
  std::ofstream(file, std::ios::trunc) << "\n";
  auto empty = MakeConnector(from_file);
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("is empty"), std::string::npos);
  ConnectorConfig both = full;
  both.options["secret_key_file"] = file.string();
  EXPECT_EQ(MakeConnector(both).status().code(), StatusCode::kInvalidArgument);
  std::filesystem::remove_all(dir);
}

TEST(FileConnector, LeavesNoTemporaryFiles) {
  std::string dir = testing::FreshDir();
  auto c = MakeConnector({"file", {{"dir", dir}}});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Put(Buffer::CopyFrom("abc")).ok());
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path();
    ++files;
  }
  EXPECT_EQ(files, 1);
}

// A redis password travels in no config: the receiving side reads it from
// password_file, finds it among this process's connectors, or in
// REDISCLI_AUTH (the cross-process conformance child); without any of them
// the server's NOAUTH comes back saying where a password is found.
TEST(RedisConnector, APasswordIsFoundWhereTheReceivingSideKeepsIt) {
  const std::string port = std::to_string(testing::RedisAuthTestPort());
  const std::string dir = testing::FreshDir();
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/redis-password";
  { std::ofstream(file) << testing::kRedisTestPassword << "\n"; }
  std::filesystem::permissions(
      file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  ::unsetenv("REDISCLI_AUTH");
  // "localhost", which no other connector of this process names (they use
  // 127.0.0.1): nothing is known for it yet.
  auto bare = MakeConnector({"redis", {{"host", "localhost"}, {"port", port}}});
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  auto refused = (*bare)->Put(Buffer::CopyFrom("x"));
  ASSERT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("password_file"), std::string::npos)
      << refused.status().ToString();

  auto c =
      MakeConnector({"redis", {{"host", "localhost"}, {"port", port}, {"password_file", file}}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::string json = (*c)->config().ToJson();
  EXPECT_EQ(json.find(testing::kRedisTestPassword), std::string::npos) << json;
  EXPECT_NE(json.find(file), std::string::npos) << "the path is part of config(): " << json;
  auto key = (*c)->Put(Buffer::CopyFrom("behind a password"));
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  // Rebuilt here without the file: this process's own password is found.
  auto again = MakeConnector({"redis", {{"host", "localhost"}, {"port", port}}});
  ASSERT_TRUE(again.ok());
  auto got = (*again)->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->view(), "behind a password");

  auto both =
      MakeConnector({"redis", {{"port", port}, {"password", "x"}, {"password_file", file}}});
  EXPECT_EQ(both.status().code(), StatusCode::kInvalidArgument);
  std::filesystem::permissions(file, std::filesystem::perms::group_read,
                               std::filesystem::perm_options::add);
  auto shared = MakeConnector({"redis", {{"port", port}, {"password_file", file}}});
  EXPECT_EQ(shared.status().code(), StatusCode::kInvalidArgument) << "a group-readable file";
}

}  // namespace
}  // namespace xsilo
