#include <gtest/gtest.h>

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
