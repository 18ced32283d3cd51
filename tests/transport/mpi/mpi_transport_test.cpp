// The MPI transports: the multiprocess conformance suite for both, plus
// MPI-specific checks (rank validation, options, chunking, size limits).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "require.h"
#include "transport/multiprocess_conformance.h"
#include "transport/test_util.h"
#include "xsilo/core/codec.h"

// mpi-generic serializes once per broadcast: the tensor plus one flat copy.
XSILO_MULTIPROCESS_CONFORMANCE(MpiGeneric, {.backend = "mpi-generic", .broadcast_peak_limit = 2.2});
XSILO_MULTIPROCESS_CONFORMANCE(MpiBuffer, {.backend = "mpi-buffer"});

namespace xsilo::testing {
namespace {

using namespace std::chrono_literals;

int32_t EnvInt(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? -1 : std::atoi(v);
}

class MpiTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    rank_ = EnvInt("OMPI_COMM_WORLD_RANK");
    world_ = EnvInt("OMPI_COMM_WORLD_SIZE");
    XSILO_REQUIRE(world_ >= 3, "mpirun -np 3 (or more)");
  }
  TransportOptions Options() const {
    TransportOptions o;
    o.rank = rank_;
    o.world_size = world_;
    o.connect_timeout = 300s;
    return o;
  }
  std::unique_ptr<Transport> Start(const TransportOptions& o) {
    auto t = TransportRegistry::Global().Create(GetParam(), o);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return nullptr;
    Status s = (*t)->Start();
    EXPECT_TRUE(s.ok()) << s.ToString();
    return s.ok() ? std::move(t).value() : nullptr;
  }
  int32_t rank_ = -1, world_ = -1;
};

TEST_P(MpiTransportTest, ViableUnderMpirun) {
  EXPECT_TRUE(TransportRegistry::Global().Viable(GetParam()).ok());
}

TEST_P(MpiTransportTest, RankMustMatchMpiCommWorld) {
  TransportOptions o = Options();
  o.rank = (rank_ + 1) % world_;
  auto t = TransportRegistry::Global().Create(GetParam(), o);
  ASSERT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("MPI_COMM_WORLD"), std::string::npos);
  o = Options();
  o.world_size = world_ + 1;
  EXPECT_EQ(TransportRegistry::Global().Create(GetParam(), o).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_P(MpiTransportTest, RejectsBadOptions) {
  TransportOptions o = Options();
  o.backend["colour"] = "blue";
  EXPECT_EQ(TransportRegistry::Global().Create(GetParam(), o).status().code(),
            StatusCode::kInvalidArgument);
  o = Options();
  o.backend["chunk_bytes"] = std::to_string((uint64_t{1} << 30) + 1);  // above 1 GiB
  EXPECT_EQ(TransportRegistry::Global().Create(GetParam(), o).status().code(),
            StatusCode::kInvalidArgument);
  o.backend["chunk_bytes"] = "0";
  EXPECT_EQ(TransportRegistry::Global().Create(GetParam(), o).status().code(),
            StatusCode::kInvalidArgument);
}

// Small chunks: every tensor crosses as many MPI messages, two senders at
// once, tensors of odd sizes and an empty one.
TEST_P(MpiTransportTest, ChunkedTensorsFromTwoSendersArriveIntact) {
  TransportOptions o = Options();
  o.backend["chunk_bytes"] = "4096";
  auto t = Start(o);
  ASSERT_NE(t, nullptr);
  constexpr int kMessages = 5;
  if (rank_ == 0) {
    std::map<int32_t, int> count;
    for (int n = 0; n < 2 * kMessages; ++n) {
      auto r = t->Receive(120s);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(PatternIntact(*r));
      ASSERT_EQ(r->tensors.size(), 3u);
      EXPECT_EQ(r->tensors.at("empty").nbytes(), 0u);
      const Tensor& f = r->tensors.at("f");
      ASSERT_EQ(f.nbytes(), 4u * 3001);
      EXPECT_EQ(reinterpret_cast<const float*>(f.data.data())[3000], 3000.0f);
      EXPECT_EQ(r->round, count[r->sender]++);
    }
    EXPECT_EQ(count[1], kMessages);
    EXPECT_EQ(count[2], kMessages);
  } else if (rank_ <= 2) {
    for (int i = 0; i < kMessages; ++i) {
      Message m = PatternMessage((1 << 20) + 13 + i, rank_ * 100 + i, i);
      m.tensors.emplace("empty", std::move(Tensor::Zeros(DType::kU8, {0})).value());
      Tensor f = std::move(Tensor::Zeros(DType::kF32, {3001})).value();
      for (int k = 0; k < 3001; ++k) reinterpret_cast<float*>(f.data.mutable_data())[k] = k;
      m.tensors.emplace("f", std::move(f));
      ASSERT_TRUE(t->Send(0, std::move(m), 120s).ok());
    }
  }
}

// A message above the receiver's max_message_bytes is drained and dropped;
// the stream stays usable for the next one.
TEST_P(MpiTransportTest, OversizedMessageIsDroppedAndStreamContinues) {
  TransportOptions o = Options();
  if (rank_ == 1) o.max_message_bytes = 64 << 10;
  o.backend["chunk_bytes"] = "65536";
  auto t = Start(o);
  ASSERT_NE(t, nullptr);
  if (rank_ == 0) {
    ASSERT_TRUE(t->Send(1, PatternMessage(4 << 20, 1, 1), 120s).ok());
    ASSERT_TRUE(t->Send(1, PatternMessage(1000, 2, 2), 120s).ok());
  } else if (rank_ == 1) {
    auto r = t->Receive(120s);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->round, 2) << "the oversized message was delivered";
    EXPECT_TRUE(PatternIntact(*r));
    EXPECT_EQ(t->Receive(200ms).status().code(), StatusCode::kTimeout);
  }
}

INSTANTIATE_TEST_SUITE_P(Mpi, MpiTransportTest, ::testing::Values("mpi-generic", "mpi-buffer"),
                         [](const auto& info) {
                           return info.param == "mpi-buffer" ? "MpiBuffer" : "MpiGeneric";
                         });

}  // namespace
}  // namespace xsilo::testing
