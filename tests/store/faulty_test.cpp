// The faulty connector: each fault does what docs/store.md says, draws are
// reproducible from the seed (also in a connector rebuilt from config()),
// and with every rate 0 it is the inner connector (the conformance suite
// runs over it in connector_test.cpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <filesystem>

#include "store/faulty/faulty.h"
#include "xsilo/store/connector.h"

namespace xsilo {
namespace {

class FaultyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("xsilo-faulty-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Connector> Make(std::map<std::string, std::string> faults) {
    faults["inner"] = "file";
    faults["inner.dir"] = dir_.string();
    auto c = MakeConnector({"faulty", faults});
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  static Buffer Bytes(uint64_t n) {
    Buffer b = *Buffer::Allocate(n);
    for (uint64_t i = 0; i < n; ++i) b.mutable_data()[i] = static_cast<uint8_t>(i * 31 + 7);
    return b;
  }
  static int BitsDiffering(const Buffer& a, const Buffer& b) {
    int bits = 0;
    for (uint64_t i = 0; i < a.size(); ++i)
      bits += std::popcount<uint8_t>(a.data()[i] ^ b.data()[i]);
    return bits;
  }

  std::filesystem::path dir_;
};

TEST_F(FaultyTest, ConfigRoundTripsAndRebuildsTheSameConnector) {
  auto c = Make({{"fault.seed", "42"}, {"fault.corrupt", "0.25"}, {"inner.fsync", "1"}});
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->type(), "faulty");
  ConnectorConfig config = c->config();
  EXPECT_EQ(config.type, "faulty");
  EXPECT_EQ(config.options.at("inner"), "file");
  EXPECT_EQ(config.options.at("inner.dir"), dir_.string());
  EXPECT_EQ(config.options.at("inner.fsync"), "1");
  EXPECT_EQ(config.options.at("fault.seed"), "42");
  EXPECT_EQ(config.options.at("fault.corrupt"), "0.25");
  auto json = ConnectorConfig::FromJson(config.ToJson());
  ASSERT_TRUE(json.ok());
  auto again = MakeConnector(*json);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->config().options, config.options);
}

TEST_F(FaultyTest, BadOptionsAreRefused) {
  EXPECT_EQ(MakeConnector({"faulty", {{"inner.dir", "/tmp/x"}}}).status().code(),
            StatusCode::kInvalidArgument);
  for (const auto& [k, v] : std::map<std::string, std::string>{{"fault.drop", "1.5"},
                                                               {"fault.corrupt", "-0.1"},
                                                               {"fault.fail", "often"},
                                                               {"fault.seed", "-1"},
                                                               {"fault.delay_ms", "-5"},
                                                               {"fault.explode", "1"}}) {
    EXPECT_EQ(MakeConnector({"faulty", {{"inner", "memory"}, {k, v}}}).status().code(),
              StatusCode::kInvalidArgument)
        << k << "=" << v;
  }
  EXPECT_EQ(MakeConnector({"faulty", {{"inner", "tape"}}}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(MakeConnector({"faulty", {{"inner", "file"}}}).status().code(),
            StatusCode::kInvalidArgument);  // the file connector's own error: no dir
}

TEST_F(FaultyTest, EachFaultDoesWhatItSays) {
  const Buffer payload = Bytes(4096);
  auto clean = Make({});
  ASSERT_NE(clean, nullptr);
  auto stored = clean->Put(payload);
  ASSERT_TRUE(stored.ok());

  auto fail = Make({{"fault.fail", "1"}});
  EXPECT_EQ(fail->Put(payload).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(fail->Get(*stored).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(fail->Exists(*stored).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(fail->Evict(*stored).code(), StatusCode::kUnavailable);
  EXPECT_EQ(InjectedFaultsOf(*fail)->failures, 4u);
  EXPECT_TRUE(*clean->Exists(*stored)) << "a failed evict must not evict";

  auto drop = Make({{"fault.drop", "1"}});
  auto lost = drop->Put(payload);
  ASSERT_TRUE(lost.ok());
  EXPECT_EQ(lost->size, payload.size());
  EXPECT_FALSE(*clean->Exists(*lost)) << "a dropped put was stored";
  auto none = drop->Get(*stored);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ(InjectedFaultsOf(*drop)->drops, 2u);

  auto corrupt = Make({{"fault.corrupt", "1"}, {"fault.seed", "3"}});
  for (int i = 0; i < 20; ++i) {
    auto got = corrupt->Get(*stored);
    ASSERT_TRUE(got.ok() && got->has_value());
    ASSERT_EQ((*got)->size(), payload.size());
    EXPECT_EQ(BitsDiffering(**got, payload), 1);
  }
  auto untouched = clean->Get(*stored);
  EXPECT_EQ(BitsDiffering(**untouched, payload), 0) << "corruption reached the stored object";

  auto truncate = Make({{"fault.truncate", "1"}});
  for (int i = 0; i < 20; ++i) {
    auto got = truncate->Get(*stored);
    ASSERT_TRUE(got.ok() && got->has_value());
    ASSERT_LT((*got)->size(), payload.size());
    EXPECT_EQ((*got)->view(), payload.view().substr(0, (*got)->size()));
  }

  auto at_rest = Make({{"fault.corrupt_put", "1"}});
  auto bad = at_rest->Put(payload);
  ASSERT_TRUE(bad.ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(BitsDiffering(**clean->Get(*bad), payload), 1);
  EXPECT_EQ(InjectedFaultsOf(*clean)->corruptions, 0u);
  EXPECT_EQ(InjectedFaultsOf(*at_rest)->corruptions, 1u);
  auto memory = MakeConnector({"memory", {}});
  EXPECT_FALSE(InjectedFaultsOf(**memory).has_value());
}

// The pattern of faults is a function of the seed and the order of calls:
// the same in a connector rebuilt from config(), different for another seed.
TEST_F(FaultyTest, FaultsAreReproducibleFromTheSeed) {
  const Buffer payload = Bytes(256);
  auto clean = Make({});
  auto key = clean->Put(payload);
  ASSERT_TRUE(key.ok());
  auto pattern = [&](Connector& c) {
    std::string out;
    for (int i = 0; i < 200; ++i) {
      auto got = c.Get(*key);
      if (!got.ok()) {
        out += 'F';
      } else if (!got->has_value()) {
        out += 'D';
      } else if ((*got)->size() < payload.size()) {
        out += 'T';
      } else {
        out += BitsDiffering(**got, payload) ? 'C' : '.';
      }
    }
    return out;
  };
  const std::map<std::string, std::string> faults = {{"fault.seed", "7"},
                                                     {"fault.fail", "0.1"},
                                                     {"fault.drop", "0.1"},
                                                     {"fault.corrupt", "0.1"},
                                                     {"fault.truncate", "0.1"}};
  auto a = Make(faults);
  const std::string first = pattern(*a);
  auto b = MakeConnector(a->config());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pattern(**b), first);
  for (char kind : std::string("FDTC.")) {
    EXPECT_NE(first.find(kind), std::string::npos) << "no '" << kind << "' in " << first;
  }
  auto other_seed = faults;
  other_seed["fault.seed"] = "8";
  EXPECT_NE(pattern(*Make(other_seed)), first);
}

}  // namespace
}  // namespace xsilo
