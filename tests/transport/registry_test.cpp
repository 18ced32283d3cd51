#include <gtest/gtest.h>

#include <string>

#include "xsilo/transport/registry.h"

namespace xsilo {
namespace {

TEST(TransportRegistry, ListsInproc) {
  auto names = TransportRegistry::Global().Names();
  EXPECT_NE(std::find(names.begin(), names.end(), "inproc"), names.end());
  EXPECT_TRUE(TransportRegistry::Global().Viable("inproc").ok());
}

TEST(TransportRegistry, UnknownNameIsNotFound) {
  auto r = TransportRegistry::Global().Create("carrier-pigeon", {});
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("inproc"), std::string::npos) << "lists what exists";
}

TEST(TransportRegistry, RejectsBadRankAndUnknownOption) {
  TransportOptions o;
  o.rank = 3;
  o.world_size = 2;
  EXPECT_EQ(TransportRegistry::Global().Create("inproc", o).status().code(),
            StatusCode::kInvalidArgument);
  o.rank = 0;
  o.backend["colour"] = "blue";
  auto r = TransportRegistry::Global().Create("inproc", o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("colour"), std::string::npos);
}

// A misspelt key names the valid key nearest to it, at every layer that
// checks its keys (the base transport, the fault injector, compression);
// a key like no valid one names none.
TEST(TransportRegistry, AnUnknownKeyNamesTheNearestValidKey) {
  struct Case {
    std::string backend, key, nearest;
  };
  for (const Case& c :
       {Case{"inproc", "serialise", "serialize"}, Case{"grpc", "chunk_byte", "chunk_bytes"},
        Case{"faulty(inproc)", "fault.fial", "fault.fail"}, Case{"inproc", "colour", ""}}) {
    SCOPED_TRACE(c.backend + " " + c.key);
    TransportOptions o;
    o.world_size = 2;
    o.address = c.backend == "grpc" ? "127.0.0.1:1" : "nearest-key";
    o.backend[c.key] = "1";
    auto r = TransportRegistry::Global().Create(c.backend, o);
    ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    const std::string& m = r.status().message();
    EXPECT_NE(m.find("unknown backend option '" + c.key + "'"), std::string::npos) << m;
    if (c.nearest.empty()) {
      EXPECT_EQ(m.find("did you mean"), std::string::npos) << m;
    } else {
      EXPECT_NE(m.find("did you mean '" + c.nearest + "'?"), std::string::npos) << m;
    }
  }
}

TEST(TransportRegistry, NonViableBackendSaysWhy) {
  TransportRegistry reg;
  TransportFactory f;
  f.name = "never";
  f.viable = [] { return Unavailable("needs a launcher"); };
  f.create = [](const TransportOptions&) -> Result<std::unique_ptr<Transport>> {
    return Internal("unreachable");
  };
  ASSERT_TRUE(reg.Register(f).ok());
  EXPECT_EQ(reg.Register(f).code(), StatusCode::kAlreadyExists);
  auto r = reg.Create("never", {});
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("needs a launcher"), std::string::npos);
}

}  // namespace
}  // namespace xsilo
