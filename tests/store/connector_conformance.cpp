#include "store/connector_conformance.h"

#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "transport/test_util.h"
#include "xsilo/core/codec.h"

extern char** environ;

namespace xsilo::testing {

// A binary whose every connector lacks the property instantiates these
// suites with no configuration: that is not a mistake there.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ConnectorHugeConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ConnectorCrossProcessConformance);

namespace {

constexpr const char* kChildEnv = "XSILO_CONNECTOR_CHILD";

Buffer Pattern(uint64_t bytes, uint64_t seed) { return PatternTensor(bytes, seed).data; }

// The options of a config that hold secrets.
bool IsSecretOption(const std::string& name) {
  return name.find("secret") != std::string::npos || name.find("password") != std::string::npos ||
         name.find("token") != std::string::npos;
}

// Runs this binary as a child that fetches `key` through a connector rebuilt
// from `config` and compares the checksum; returns its exit status. The
// child has the credentials of `made_from` in its environment, as a
// receiving site has its own: `config` carries no secret.
int ResolveInChild(const ConnectorConfig& config, const ConnectorConfig& made_from, const Key& key,
                   uint64_t checksum) {
  std::string spec = config.ToJson() + "\n" + key.ToJson() + "\n" + std::to_string(checksum);
  const bool s3 = made_from.type == "s3" && made_from.options.count("secret_key");
  const bool redis = made_from.type == "redis" && made_from.options.count("password");
  std::vector<std::string> env = s3 ? EnvironWithS3Credentials(made_from.options.at("access_key"),
                                                               made_from.options.at("secret_key"))
                                 : redis
                                     ? EnvironWithRedisPassword(made_from.options.at("password"))
                                     : EnvironWithS3Credentials("", "");
  env.push_back(std::string(kChildEnv) + "=" + spec);
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  char* argv[] = {exe.data(), nullptr};
  pid_t pid;
  if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

bool RunConnectorChildIfRequested(int* exit_code) {
  const char* spec = std::getenv(kChildEnv);
  if (!spec) return false;
  std::string s(spec);
  auto a = s.find('\n'), b = s.find('\n', a + 1);
  auto config = ConnectorConfig::FromJson(s.substr(0, a));
  auto key = Key::FromJson(s.substr(a + 1, b - a - 1));
  uint64_t want = std::stoull(s.substr(b + 1));
  if (!config.ok() || !key.ok()) {
    *exit_code = 2;
    return true;
  }
  auto c = MakeConnector(*config);
  if (!c.ok()) {
    *exit_code = 3;
    return true;
  }
  auto got = (*c)->Get(*key);
  *exit_code = !got.ok() ? 4 : !got->has_value() ? 5 : Checksum((*got)->span()) == want ? 0 : 6;
  return true;
}

void PrintTo(const ConnectorParam& p, std::ostream* os) { *os << p.name; }

void ConnectorConformance::SetUp() {
  made_from_ = GetParam().config();
  auto c = MakeConnector(made_from_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  connector_ = std::move(c).value();
}

void ConnectorConformance::TearDown() {
  if (connector_) connector_->Close();
}

// This library is also linked for its helpers alone (proxy_test,
// multi_test), and a build that keeps these cases' registration there
// (the sanitizer builds, Debug, do) must not fail for the missing instantiation.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ConnectorConformance);

TEST_P(ConnectorConformance, RoundTripsSmallSizes) {
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{4097}}) {
    Buffer b = Pattern(size, size + 1);
    auto key = connector_->Put(b);
    ASSERT_TRUE(key.ok()) << key.status().ToString();
    EXPECT_EQ(key->size, size);
    auto got = connector_->Get(*key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(got->has_value()) << size;
    EXPECT_EQ((*got)->view(), b.view()) << size;
  }
}

TEST_P(ConnectorConformance, RoundTrips100MB) {
  Buffer b = Pattern(100'000'000, 7);
  auto key = connector_->Put(b);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto got = connector_->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(Checksum((*got)->span()), Checksum(b.span()));
  ASSERT_TRUE(connector_->Evict(*key).ok());
}

TEST_P(ConnectorHugeConformance, RoundTripsOver2GiB) {
  const uint64_t size = (uint64_t{9} << 28) + 5;  // 2.25 GiB + 5 B
  uint64_t want;
  Key key;
  {
    Buffer b = Pattern(size, 11);
    want = Checksum(b.span());
    auto k = connector_->Put(b);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    key = *k;
  }
  auto got = connector_->Get(key);
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->size(), size);
  EXPECT_EQ(Checksum((*got)->span()), want);
  got = {std::nullopt};
  ASSERT_TRUE(connector_->Evict(key).ok());
}

TEST_P(ConnectorConformance, GatherPutEqualsConcatenation) {
  GatherList g;
  g.Append(Buffer::CopyFrom("hello, "));
  g.Append(Pattern(3000, 1));
  g.Append(Buffer::CopyFrom("!"));
  auto key = connector_->Put(g);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto got = connector_->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->view(), g.Flatten()->view());
}

TEST_P(ConnectorConformance, MissingKeyIsNoneAndEvictIsIdempotent) {
  auto key = connector_->Put(Buffer::CopyFrom("x"));
  ASSERT_TRUE(key.ok());
  Key missing = *key;
  missing.id = RandomObjectId();
  auto got = connector_->Get(missing);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(got->has_value());
  EXPECT_FALSE(*connector_->Exists(missing));
  EXPECT_TRUE(*connector_->Exists(*key));
  ASSERT_TRUE(connector_->Evict(*key).ok());
  EXPECT_FALSE(*connector_->Exists(*key));
  EXPECT_FALSE(connector_->Get(*key)->has_value());
  EXPECT_TRUE(connector_->Evict(*key).ok());
}

TEST_P(ConnectorConformance, RejectsForeignKeys) {
  Key k{"no-such-connector", "abc", 0, {}};
  EXPECT_EQ(connector_->Get(k).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(ConnectorConformance, DeferredKeyIsSetLater) {
  auto key = connector_->NewKey();
  ASSERT_TRUE(key.ok());
  EXPECT_FALSE(connector_->Get(*key)->has_value());
  GatherList g;
  g.Append(Buffer::CopyFrom("later"));
  ASSERT_TRUE(connector_->Set(*key, g).ok());
  auto got = connector_->Get(*key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->view(), "later");
}

TEST_P(ConnectorConformance, BatchForms) {
  std::vector<Buffer> objects = {Buffer::CopyFrom("a"), Buffer::CopyFrom("bb"), Buffer()};
  auto keys = connector_->PutBatch(objects);
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  ASSERT_EQ(keys->size(), 3u);
  auto got = connector_->GetBatch(*keys);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[1]->view(), "bb");
  EXPECT_EQ((*got)[2]->size(), 0u);
  ASSERT_TRUE(connector_->EvictBatch(*keys).ok());
  EXPECT_FALSE((*connector_->GetBatch(*keys))[0].has_value());
}

TEST_P(ConnectorConformance, ConcurrentPutsAndGetsFrom8Threads) {
  constexpr int kThreads = 8, kEach = 25;
  std::atomic<int> failures{0};
  std::mutex mu;
  std::vector<std::string> what;  // each failure, for the report
  auto fail = [&](const std::string& why) {
    ++failures;
    std::lock_guard<std::mutex> lock(mu);
    what.push_back(why);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        Buffer b = Pattern(1000 + 37 * i + t, t * 1000 + i);
        auto key = connector_->Put(b);
        if (!key.ok()) {
          fail("put: " + key.status().ToString());
          continue;
        }
        auto got = connector_->Get(*key);
        if (!got.ok()) {
          fail("get: " + got.status().ToString());
        } else if (!got->has_value()) {
          fail("get: no object under " + key->ToJson());
        } else if ((*got)->view() != b.view()) {
          fail("get: " + std::to_string((*got)->size()) + " bytes differ from the " +
               std::to_string(b.size()) + " put");
        }
        if (i % 2 == 0) {
          Status evicted = connector_->Evict(*key);
          if (!evicted.ok()) fail("evict: " + evicted.ToString());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  std::string report;
  for (const auto& w : what) report += "\n  " + w;
  EXPECT_EQ(failures.load(), 0) << report;
}

// A config travels in every reference to the store: no secret the connector
// was made with may be in it (the receiving side has its own credentials).
TEST_P(ConnectorConformance, ConfigCarriesNoSecret) {
  const std::string json = connector_->config().ToJson();
  for (const auto& [name, value] : made_from_.options) {
    if (!IsSecretOption(name) || value.size() < 4 || name.ends_with("_file")) continue;
    // s3rver's fixed secret equals its (public) access key id.
    bool also_public = false;
    for (const auto& [other, v] : made_from_.options)
      also_public |= !IsSecretOption(other) && v == value;
    if (also_public) continue;
    EXPECT_EQ(json.find(value), std::string::npos) << "config() carries option " << name;
  }
}

TEST_P(ConnectorConformance, ConfigRebuildsAnEquivalentConnector) {
  ConnectorConfig config = connector_->config();
  auto parsed = ConnectorConfig::FromJson(config.ToJson());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->type, config.type);
  EXPECT_EQ(parsed->options, config.options);
  auto again = MakeConnector(*parsed);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto key = connector_->Put(Buffer::CopyFrom("shared"));
  ASSERT_TRUE(key.ok());
  auto k2 = Key::FromJson(key->ToJson());
  ASSERT_TRUE(k2.ok());
  EXPECT_EQ(*k2, *key);
  auto got = (*again)->Get(*k2);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->view(), "shared");
}

TEST_P(ConnectorCrossProcessConformance, ResolvesInAnotherProcess) {
  Buffer b = Pattern(3'000'000, 5);
  auto key = connector_->Put(b);
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(ResolveInChild(connector_->config(), made_from_, *key, Checksum(b.span())), 0);
  Key missing = *key;
  missing.id = RandomObjectId();
  EXPECT_EQ(ResolveInChild(connector_->config(), made_from_, missing, 0), 5)
      << "child should see no object";
}

}  // namespace xsilo::testing
