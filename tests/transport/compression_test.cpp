// The compressing transport (xsilo/transport/compression.h): options, the
// per-message choice, round trips, deltas against a held reference, and
// frames that cannot be decoded. Conformance runs in inproc_test.cpp.
#include "xsilo/transport/compression.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <future>
#include <optional>
#include <random>
#include <thread>

#include "transport/compress/chooser.h"
#include "transport/conformance.h"
#include "xsilo/core/encode_stream.h"
#include "xsilo/transport/forwarding.h"
#include "xsilo/transport/registry.h"

XSILO_TRANSPORT_CONFORMANCE(InprocCompressed,
                            {.backend = "inproc",
                             .backend_options = {{"compression", "lossless"},
                                                 {"compression.when", "always"},
                                                 {"compression.min_tensor_bytes", "1"}},
                             .label = "inproc_compressed",
                             // Each receiver decodes into its own Buffer, in
                             // the sender's process.
                             .measure_broadcast_memory = false});

namespace xsilo {
namespace {

using namespace std::chrono_literals;

std::vector<float> Weights(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, 0.05f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

Tensor F32(const std::vector<float>& v) {
  return *Tensor::Make(DType::kF32, {static_cast<int64_t>(v.size())},
                       Buffer::CopyFrom(v.data(), v.size() * 4));
}

std::vector<float> Floats(const Tensor& t) {
  std::vector<float> v(t.nbytes() / 4);
  std::memcpy(v.data(), t.data.data(), t.nbytes());
  return v;
}

// A world of `n` inproc ranks with the same backend options, but where
// `per_rank` says otherwise.
std::vector<std::unique_ptr<Transport>> World(
    int n, const std::string& fabric, std::map<std::string, std::string> backend,
    const std::map<int, std::map<std::string, std::string>>& per_rank = {}) {
  std::vector<std::unique_ptr<Transport>> world;
  for (int r = 0; r < n; ++r) {
    TransportOptions o;
    o.rank = r;
    o.world_size = n;
    o.address = fabric;
    o.backend = backend;
    if (auto it = per_rank.find(r); it != per_rank.end()) {
      for (const auto& [k, v] : it->second) o.backend[k] = v;
    }
    auto t = TransportRegistry::Global().Create("inproc", o);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return {};
    world.push_back(std::move(t).value());
  }
  std::vector<std::future<Status>> starts;
  for (auto& t : world) {
    starts.push_back(std::async(std::launch::async, [p = t.get()] { return p->Start(); }));
  }
  for (auto& f : starts) EXPECT_TRUE(f.get().ok());
  return world;
}

// Sends `w` from rank `from` to rank `to` as the model of reference `key`
// and returns what the receiver holds (empty, with a failure, if it did
// not arrive).
std::vector<float> SendReference(const std::vector<std::unique_ptr<Transport>>& world, int from,
                                 int to, int64_t key, const std::vector<float>& w) {
  Message model;
  model.params[kDeltaRefParam] = key;
  model.tensors["w"] = F32(w);
  Status sent = world[from]->Send(to, model, std::chrono::seconds(30));
  EXPECT_TRUE(sent.ok()) << sent.ToString();
  if (!sent.ok()) return {};
  auto held = world[to]->Receive(std::chrono::seconds(30));
  EXPECT_TRUE(held.ok()) << held.status().ToString();
  return held.ok() ? Floats(held->tensors.at("w")) : std::vector<float>{};
}

// Sends `values` from rank `from` to rank `to` as an update against
// reference `base` and returns what `to` received.
Result<Message> SendUpdate(const std::vector<std::unique_ptr<Transport>>& world, int from, int to,
                           int64_t base, const std::vector<float>& values) {
  Message u;
  u.params[kDeltaBaseParam] = base;
  u.tensors["w"] = F32(values);
  XSILO_RETURN_IF_ERROR(world[from]->Send(to, u, std::chrono::seconds(30)));
  return world[to]->Receive(std::chrono::seconds(30));
}

CodecCandidate Candidate(Quant q, double ratio, double enc_MBps, double dec_MBps, uint64_t bytes) {
  CodecCandidate c;
  c.estimate.recipe.quant = q;
  c.estimate.ratio = ratio;
  c.estimate.encode_Bps = enc_MBps * 1e6;
  c.estimate.decode_Bps = dec_MBps * 1e6;
  c.eligible_bytes = bytes;
  return c;
}

TEST(CompressionChoice, CompressesOnASlowLinkAndNeverOnAFastOne) {
  const uint64_t big = 253u << 20;
  // zstd on trained float weights: about 0.84 at 340 MB/s a thread.
  const std::vector<CodecCandidate> lossless = {Candidate(Quant::kNone, 0.84, 340, 900, big)};
  auto hk = ChooseCompression(big, 16.3e6, 2, lossless, 0.05);  // ca-hk, one stream
  EXPECT_TRUE(hk.compress) << hk.reason;
  EXPECT_LT(hk.predicted_s, hk.uncompressed_s * 0.95);
  EXPECT_NE(hk.reason.find("lossless"), std::string::npos) << hk.reason;
  auto lan = ChooseCompression(big, 1.2e9, 2, lossless, 0.05);
  EXPECT_FALSE(lan.compress) << lan.reason;
  EXPECT_EQ(lan.predicted_s, lan.uncompressed_s);
  auto unknown = ChooseCompression(big, 0, 2, lossless, 0.05);
  EXPECT_FALSE(unknown.compress);
  // A gain inside the margin is no gain: 0.97 of the bytes, free codec.
  auto marginal =
      ChooseCompression(big, 16e6, 2, {Candidate(Quant::kNone, 0.97, 1e6, 1e6, big)}, 0.05);
  EXPECT_FALSE(marginal.compress) << marginal.reason;
}

TEST(CompressionChoice, TakesTheFastestCandidateAndCountsOnlyEligibleBytes) {
  const uint64_t big = 100u << 20;
  const std::vector<CodecCandidate> c = {Candidate(Quant::kNone, 0.84, 340, 900, big),
                                         Candidate(Quant::kBF16, 0.5, 3000, 3000, big),
                                         Candidate(Quant::kInt8, 0.25, 1000, 1000, big)};
  auto hk = ChooseCompression(big, 16e6, 2, c, 0.05);
  ASSERT_TRUE(hk.compress);
  EXPECT_EQ(hk.recipe.quant, Quant::kInt8);
  // On a LAN the cheap cast is the only one that still pays.
  auto lan = ChooseCompression(big, 1.2e9, 2, c, 0.05);
  ASSERT_TRUE(lan.compress) << lan.reason;
  EXPECT_EQ(lan.recipe.quant, Quant::kBF16);
  // Only 1% of the message is eligible: not worth a codec.
  auto few =
      ChooseCompression(big, 16e6, 2, {Candidate(Quant::kInt8, 0.25, 1000, 1000, big / 100)}, 0.05);
  EXPECT_FALSE(few.compress) << few.reason;
}

TEST(CompressionOptions, ParseAndRefuseClearly) {
  CompressionPolicy p;
  TransportOptions rest, o;
  o.backend = {{"threshold", "1024"}};
  EXPECT_FALSE(*ParseCompressionOptions(o, &p, &rest));
  EXPECT_EQ(rest.backend.size(), 1u);
  o.backend = {{"compression", "none"}, {"threshold", "1024"}};
  EXPECT_FALSE(*ParseCompressionOptions(o, &p, &rest));
  EXPECT_EQ(rest.backend, (std::map<std::string, std::string>{{"threshold", "1024"}}));
  o.backend = {{"compression", "int8"},          {"compression.level", "3"},
               {"compression.int8_block", "64"}, {"compression.link_MBps", "16.3"},
               {"compression.when", "always"},   {"threshold", "1024"}};
  ASSERT_TRUE(*ParseCompressionOptions(o, &p, &rest));
  EXPECT_EQ(p.allowed, Quant::kInt8);
  EXPECT_EQ(p.codec.zstd_level, 3);
  EXPECT_EQ(p.codec.int8_block, 64u);
  EXPECT_DOUBLE_EQ(p.link_Bps_prior, 16.3e6);
  EXPECT_DOUBLE_EQ(p.long_link_Bps, 600e6) << "the default ceiling";
  EXPECT_TRUE(p.always);
  EXPECT_EQ(rest.backend.size(), 1u);
  EXPECT_EQ(p.topk, 0);
  o.backend = {{"compression", "int8+topk"}, {"compression.topk_fraction", "0.05"}};
  ASSERT_TRUE(*ParseCompressionOptions(o, &p, &rest));
  EXPECT_EQ(p.allowed, Quant::kInt8);
  EXPECT_DOUBLE_EQ(p.topk, 0.05);
  o.backend = {{"compression", "topk"}};
  ASSERT_TRUE(*ParseCompressionOptions(o, &p, &rest));
  EXPECT_EQ(p.allowed, Quant::kNone);
  EXPECT_DOUBLE_EQ(p.topk, 0.01);
  o.backend = {{"compression", "bf16"}, {"compression.long_link_MBps", "0"}};
  ASSERT_TRUE(*ParseCompressionOptions(o, &p, &rest));
  EXPECT_EQ(p.long_link_Bps, 0) << "no ceiling";

  for (const auto& bad : std::vector<std::map<std::string, std::string>>{
           {{"compression", "gzip"}},
           {{"compression.level", "3"}},
           {{"compression", "lossless"}, {"compression.level", "30"}},
           {{"compression", "lossless"}, {"compression.level", "x"}},
           {{"compression", "int8"}, {"compression.int8_block", "100"}},
           {{"compression", "lossless"}, {"compression.when", "sometimes"}},
           {{"compression", "lossless"}, {"compression.link_MBps", "-1"}},
           {{"compression", "lossless"}, {"compression.long_link_MBps", "nan"}},
           {{"compression", "lossless"}, {"compression.long_link_MBps", "inf"}},
           {{"compression", "lossless"}, {"compression.speed", "1"}},
           {{"compression", "lossless"}, {"compression.stream", "yes"}},
           {{"compression", "lossless+topk"}},
           {{"compression", "topk"}, {"compression.topk_fraction", "0"}},
           {{"compression", "topk"}, {"compression.topk_fraction", "1.5"}},
           {{"compression", "int8"}, {"compression.topk_fraction", "0.1"}}}) {
    o.backend = bad;
    auto r = ParseCompressionOptions(o, &p, &rest);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad.begin()->first;
    o.rank = 0;
    o.world_size = 1;
    o.address = "compression-bad-options";
    EXPECT_EQ(TransportRegistry::Global().Create("inproc", o).status().code(),
              StatusCode::kInvalidArgument);
  }
}

TEST(CompressingTransport, LosslessRoundTripsBitForBitAndSendsFewerBytes) {
  auto world = World(2, "compression-lossless",
                     {{"compression", "lossless"}, {"compression.when", "always"}});
  ASSERT_EQ(world.size(), 2u);
  // Weights of a few magnitudes compress; the small tensor travels as it is.
  auto w = Weights(1 << 20, 1);
  Message m;
  m.type = "model";
  m.params["note"] = std::string("kept");
  m.tensors["w"] = F32(w);
  m.tensors["b"] = F32(Weights(10, 2));
  ASSERT_TRUE(world[0]->Send(1, m, 30s).ok());
  auto got = world[1]->Receive(30s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->params.count(kCodecParam), 0u);
  EXPECT_EQ(*got->GetString("note"), "kept");
  ASSERT_EQ(got->tensors.at("w").dtype, DType::kF32);
  EXPECT_EQ(got->tensors.at("w").shape, m.tensors.at("w").shape);
  EXPECT_EQ(std::memcmp(got->tensors.at("w").data.data(), w.data(), w.size() * 4), 0);
  EXPECT_EQ(got->tensors.at("b").nbytes(), 40u);
  auto sent = CompressionSummaryOf(*world[0]);
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->messages_compressed, 1u);
  EXPECT_EQ(sent->raw_bytes, w.size() * 4);
  EXPECT_LT(sent->encoded_bytes, sent->raw_bytes * 0.95);
  EXPECT_GT(CompressionSummaryOf(*world[1])->decode_seconds, 0);
}

TEST(CompressingTransport, Bf16StaysWithinItsBoundAndComesOutAsF32) {
  auto world =
      World(2, "compression-bf16", {{"compression", "bf16"}, {"compression.when", "always"}});
  ASSERT_EQ(world.size(), 2u);
  auto w = Weights(300000, 3);
  Message m;
  m.tensors["w"] = F32(w);
  ASSERT_TRUE(world[0]->Send(1, m, 30s).ok());
  auto got = world[1]->Receive(30s);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->tensors.at("w").dtype, DType::kF32);
  auto v = Floats(got->tensors.at("w"));
  ASSERT_EQ(v.size(), w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_LE(std::fabs(double(v[i]) - double(w[i])), QuantErrorBound(Quant::kBF16, w[i], 0)) << i;
  }
  EXPECT_LT(CompressionSummaryOf(*world[0])->encoded_bytes, w.size() * 4 / 2 + 4096);
}

// The FL pattern: the server broadcasts the model as reference 5, clients
// send their updates against it.
TEST(CompressingTransport, UpdatesTravelAsDeltasAgainstTheBroadcastModel) {
  for (const std::string codec : {"lossless", "int8"}) {
    SCOPED_TRACE(codec);
    auto world = World(3, "compression-delta-" + codec,
                       {{"compression", codec}, {"compression.when", "always"}});
    ASSERT_EQ(world.size(), 3u);
    auto global = Weights(1 << 19, 4);
    Message model;
    model.params[kDeltaRefParam] = int64_t{5};
    model.tensors["w"] = F32(global);
    ASSERT_TRUE(world[0]->Broadcast({1, 2}, model, 30s).ok());
    std::vector<float> held[3];
    for (int c : {1, 2}) {
      auto got = world[c]->Receive(30s);
      ASSERT_TRUE(got.ok());
      held[c] = Floats(got->tensors.at("w"));
      // The receiver may change what it was given: its reference is its own.
      std::memset(got->tensors.at("w").data.mutable_data(), 0, 64);
    }
    // Local training moves every weight a little.
    auto step = Weights(global.size(), 5);
    std::vector<float> update(global.size());
    for (size_t i = 0; i < update.size(); ++i) update[i] = held[1][i] + step[i] * 0.01f;
    for (int c : {1, 2}) {
      Message u;
      if (c == 1) u.params[kDeltaBaseParam] = int64_t{5};  // rank 2 sends it whole
      u.tensors["w"] = F32(update);
      ASSERT_TRUE(world[c]->Send(0, u, 30s).ok());
    }
    double max_error[3] = {0, 0, 0};
    for (int k = 0; k < 2; ++k) {
      auto got = world[0]->Receive(30s);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      // The base stays on the message (the receiver corrects by it).
      EXPECT_EQ(got->params.count(kDeltaBaseParam), got->sender == 1 ? 1u : 0u);
      auto v = Floats(got->tensors.at("w"));
      ASSERT_EQ(v.size(), update.size());
      if (codec == "lossless") {
        EXPECT_EQ(std::memcmp(v.data(), update.data(), v.size() * 4), 0);
      } else {
        // Rank 1 trained from the int8 cast of the model: rank 0 gets its
        // own model plus rank 1's change, update + (global - cast).
        std::vector<float> want = update;
        if (got->sender == 1) {
          for (size_t i = 0; i < want.size(); ++i) want[i] = update[i] + (global[i] - held[1][i]);
        }
        // int8 of the difference (block absmax), plus half an ulp of the sum.
        const size_t block = 256;
        for (size_t b = 0; b < v.size(); b += block) {
          float absmax = 0;
          for (size_t i = b; i < b + block; ++i) {
            const float x = got->sender == 1 ? update[i] - held[1][i] : update[i];
            absmax = std::max(absmax, std::fabs(x));
          }
          for (size_t i = b; i < b + block; ++i) {
            const float x = got->sender == 1 ? update[i] - held[1][i] : update[i];
            const double bound =
                QuantErrorBound(Quant::kInt8, x, absmax) +
                (std::fabs(double(update[i])) + std::fabs(double(want[i]))) * 0x1p-23;
            const double e = std::fabs(double(v[i]) - double(want[i]));
            ASSERT_LE(e, bound) << i;
            max_error[got->sender] = std::max(max_error[got->sender], e);
          }
        }
      }
    }
    auto one = CompressionSummaryOf(*world[1]), two = CompressionSummaryOf(*world[2]);
    if (codec == "lossless") {
      // The XOR delta zeroes the bits the update kept: fewer bytes (0.80
      // of the whole update's when written, for steps of 1% of a weight).
      EXPECT_LT(one->encoded_bytes * 1.15, two->encoded_bytes)
          << one->encoded_bytes << " vs " << two->encoded_bytes;
    } else {
      // int8 of the small difference: far smaller errors than of the values.
      EXPECT_LT(max_error[1] * 10, max_error[2]) << max_error[1] << " vs " << max_error[2];
    }
  }
}

// A FedAvg server's next model names the last one as its base: it goes
// as a delta from what the clients hold of the last one (for a lossy
// cast, the cast), once every receiver said it holds it by sending an
// update against it; to a peer that did not, it goes whole. An int8 one
// is quantized on the values' scale: within a whole cast's bound, in far
// fewer bytes.
TEST(CompressingTransport, ANextModelGoesAsADeltaToPeersThatSaidTheyHoldTheLastOne) {
  auto world = World(3, "compression-model-delta",
                     {{"compression", "int8"}, {"compression.when", "always"}});
  ASSERT_EQ(world.size(), 3u);
  const size_t n = 1 << 18;
  std::vector<float> global = Weights(n, 21);
  // A round's change is heavy-tailed, as SGD's: a few weights move, most
  // barely.
  auto step = Weights(n, 22);
  for (size_t i = 0; i < n; ++i) step[i] *= i % 64 == 0 ? 1.0f : 0.01f;
  std::vector<float> held[3];  // what ranks 1 and 2 hold of the last model
  auto broadcast = [&](int64_t key, std::optional<int64_t> base) {
    Message m;
    m.params[kDeltaRefParam] = key;
    if (base) m.params[kDeltaBaseParam] = *base;
    m.tensors["w"] = F32(global);
    EXPECT_TRUE(world[0]->Broadcast({1, 2}, m, 30s).ok());
    for (int c : {1, 2}) {
      auto got = world[c]->Receive(30s);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      held[c] = Floats(got->tensors.at("w"));
    }
    EXPECT_EQ(held[1], held[2]);
  };
  // Rank c trains from what it holds and sends its update against `key`.
  auto update = [&](int c, int64_t key) {
    std::vector<float> u = held[c];
    for (size_t i = 0; i < n; ++i) u[i] += step[i] * 0.01f;
    auto got = SendUpdate(world, c, 0, key, u);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->params.count("xsilo.delta_held"), 0u) << "the decorator's own param";
  };
  // The largest error of what the clients hold against `global`, and
  // whether each value is within int8's bound on its block of `sent` (the
  // values the sender quantized).
  auto check = [&](const std::vector<float>& sent) {
    double worst = 0;
    const size_t block = 256;
    for (size_t b = 0; b < n; b += block) {
      float absmax = 0;
      for (size_t i = b; i < b + block; ++i) absmax = std::max(absmax, std::fabs(sent[i]));
      for (size_t i = b; i < b + block; ++i) {
        const double e = std::fabs(double(held[1][i]) - double(global[i]));
        const double bound =
            QuantErrorBound(Quant::kInt8, sent[i], absmax) + std::fabs(double(global[i])) * 0x1p-22;
        EXPECT_LE(e, bound) << i;
        if (e > bound) return worst;
        worst = std::max(worst, e);
      }
    }
    return worst;
  };
  auto encoded = [&] { return CompressionSummaryOf(*world[0])->encoded_bytes; };

  broadcast(1, std::nullopt);
  const double whole_error = check(global);
  const uint64_t whole_bytes = encoded();
  std::string why = CompressionSummaryOf(*world[0])->last_choice;
  EXPECT_EQ(why.find("delta"), std::string::npos) << why;
  for (int c : {1, 2}) update(c, 1);

  // Model 2 against model 1: both said they hold it.
  std::vector<float> before = held[1];
  for (size_t i = 0; i < n; ++i) global[i] += step[i] * 0.01f;
  uint64_t before_bytes = encoded();
  broadcast(2, 1);
  why = CompressionSummaryOf(*world[0])->last_choice;
  EXPECT_NE(why.find("delta on the values' scale"), std::string::npos) << why;
  // The values' bound, as a whole cast's; most values kept their code.
  const double delta_error = check(global);
  EXPECT_LE(delta_error, whole_error * 1.01) << delta_error << " vs " << whole_error;
  EXPECT_LT((encoded() - before_bytes) * 2, whole_bytes)
      << encoded() - before_bytes << " vs " << whole_bytes;
  size_t moved = 0;
  for (size_t i = 0; i < n; ++i) moved += held[1][i] != before[i];
  EXPECT_GT(moved, n / 128) << "the changes reached the clients";

  // Model 3 against model 2, which the sender must hold as the clients
  // decoded it: else the clients' values would stray past the bound by
  // model 2's own cast error.
  for (int c : {1, 2}) update(c, 2);
  before = held[1];
  for (size_t i = 0; i < n; ++i) global[i] -= step[i] * 0.02f;
  before_bytes = encoded();
  broadcast(3, 2);
  why = CompressionSummaryOf(*world[0])->last_choice;
  EXPECT_NE(why.find("delta"), std::string::npos) << why;
  check(global);
  EXPECT_LT((encoded() - before_bytes) * 2, whole_bytes)
      << encoded() - before_bytes << " vs " << whole_bytes;

  // Rank 2 sends nothing against model 3: model 4 goes whole.
  update(1, 3);
  for (size_t i = 0; i < n; ++i) global[i] += step[i] * 0.01f;
  broadcast(4, 3);
  why = CompressionSummaryOf(*world[0])->last_choice;
  EXPECT_EQ(why.find("delta"), std::string::npos) << why;
  check(global);
}

// The reference a send establishes is copied after the message went to
// the inner transport (not before: that delayed every broadcast); the
// sender's Buffers, reused once the send is done, are never read after.
TEST(CompressingTransport, TheSenderMayReuseItsBuffersOnceTheSendIsDone) {
  auto world =
      World(2, "compression-reuse", {{"compression", "lossless"}, {"compression.when", "always"}});
  ASSERT_EQ(world.size(), 2u);
  auto global = Weights(1 << 18, 7);
  Message model;
  model.params[kDeltaRefParam] = int64_t{9};
  model.tensors["w"] = F32(global);
  ASSERT_TRUE(world[0]->Broadcast({1}, model, 30s).ok());
  // The FedAvg server writes the next model into the old one's Buffers.
  std::memset(model.tensors.at("w").data.mutable_data(), 0x7f, global.size() * 4);
  auto got = world[1]->Receive(30s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(Floats(got->tensors.at("w")), global);
  auto update = global;
  for (size_t i = 0; i < update.size(); i += 3) update[i] += 0.001f;
  auto back = SendUpdate(world, 1, 0, 9, update);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  // Bit for bit: decoded against our copy, not the reused Buffers (an
  // XOR delta against 0x7f7f7f7f garbage would not give it back).
  EXPECT_EQ(Floats(back->tensors.at("w")), update);
  EXPECT_EQ(CompressionSummaryOf(*world[1])->messages_compressed, 1u);
}

// A lossy cast of an update's values would bury its change under the
// cast's error: an update goes lossy only as a delta, and losslessly when
// its base is not held.
TEST(CompressingTransport, LossyCodecsGoOnlyOnTheDeltaOfAnUpdate) {
  // 200 KB messages: under the 256 KiB a send needs to be timed, so the
  // link stays at its 1 MB/s prior, where every codec pays.
  auto world = World(2, "compression-update-lossy",
                     {{"compression", "int8"},
                      {"compression.link_MBps", "1"},
                      {"compression.min_message_bytes", "1"}});
  ASSERT_EQ(world.size(), 2u);
  const auto w = Weights(50000, 8);
  // No model with key 3 was ever sent: lossless (the sample is of normal
  // weights: zstd keeps ~0.84, and at 1 MB/s that pays), bit for bit.
  Message u;
  u.params[kDeltaBaseParam] = int64_t{3};
  u.tensors["w"] = F32(w);
  ASSERT_TRUE(world[1]->Send(0, u, 30s).ok());
  auto got = world[0]->Receive(30s);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(std::memcmp(got->tensors.at("w").data.data(), w.data(), w.size() * 4), 0);
  std::string why = CompressionSummaryOf(*world[1])->last_choice;
  EXPECT_EQ(why.find("int8"), std::string::npos) << why;
  // The same message without a base is any tensor: int8 is allowed.
  Message plain;
  plain.tensors["w"] = F32(w);
  ASSERT_TRUE(world[1]->Send(0, plain, 30s).ok());
  ASSERT_TRUE(world[0]->Receive(30s).ok());
  why = CompressionSummaryOf(*world[1])->last_choice;
  EXPECT_EQ(why.rfind("int8", 0), 0u) << why;
  // With the model of key 3 held on both sides, the update's int8 is of
  // its delta.
  std::vector<float> trained = SendReference(world, 0, 1, 3, w);
  ASSERT_FALSE(trained.empty());
  for (auto& x : trained) x += 1e-4f;
  u.tensors["w"] = F32(trained);
  ASSERT_TRUE(world[1]->Send(0, u, 30s).ok());
  ASSERT_TRUE(world[0]->Receive(30s).ok());
  why = CompressionSummaryOf(*world[1])->last_choice;
  EXPECT_NE(why.find("int8"), std::string::npos) << why;
  EXPECT_NE(why.substr(0, why.find(" at ")).find("delta"), std::string::npos) << why;
}

// Top-k through the decorator: an update keeps about the fraction asked
// of its changes, and the error feedback is kept per destination: the
// same change sent again goes out mostly on the values the first one
// dropped (they now carry two rounds of change), where without feedback
// it would keep the same values again.
TEST(CompressingTransport, TopKUpdatesCarryWhatTheLastOneDropped) {
  auto world = World(2, "compression-topk",
                     {{"compression", "topk"},
                      {"compression.when", "always"},
                      {"compression.topk_fraction", "0.1"}});
  ASSERT_EQ(world.size(), 2u);
  const auto w = Weights(1 << 17, 71);
  std::vector<float> trained = SendReference(world, 0, 1, 1, w);
  ASSERT_FALSE(trained.empty());
  std::mt19937 rng(73);
  std::normal_distribution<float> step(0, 1e-3f);
  for (auto& x : trained) x += step(rng);
  std::vector<std::vector<bool>> kept;
  for (int round = 0; round < 2; ++round) {
    Message u;
    u.params[kDeltaBaseParam] = int64_t{1};
    u.tensors["w"] = F32(trained);
    ASSERT_TRUE(world[1]->Send(0, u, 30s).ok());
    auto got = world[0]->Receive(30s);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const std::string why = CompressionSummaryOf(*world[1])->last_choice;
    EXPECT_NE(why.find("top-0.1000 delta"), std::string::npos) << why;
    const auto y = Floats(got->tensors.at("w"));
    std::vector<bool> k(y.size());
    size_t n = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      k[i] = y[i] != w[i];
      if (k[i]) {
        // A kept value is the reference plus the change (and, in round 2,
        // plus what round 1 left of it): the trained value or further.
        EXPECT_GE(std::fabs(double(y[i]) - w[i]), std::fabs(double(trained[i]) - w[i]) * 0.999)
            << i;
        ++n;
      }
    }
    EXPECT_GT(n, y.size() * 8 / 100) << round;
    EXPECT_LT(n, y.size() * 12 / 100) << round;
    kept.push_back(std::move(k));
  }
  size_t both = 0, second = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    second += kept[1][i];
    both += kept[0][i] && kept[1][i];
  }
  // Round 2 ranks the dropped values' doubled change above the kept
  // values' single one: few values are kept twice.
  EXPECT_LT(both, second / 4) << both << " of " << second;
}

// A lossy model under a key older than the two kept is dropped at once on
// both sides; an update naming it then goes losslessly and arrives as it
// was sent (no reference to encode against, none to correct by).
TEST(CompressingTransport, AModelUnderAnOldKeyIsNotKeptAndItsUpdateArrivesAsSent) {
  auto world =
      World(2, "compression-old-key", {{"compression", "int8"}, {"compression.when", "always"}});
  ASSERT_EQ(world.size(), 2u);
  const auto w = Weights(1 << 16, 9);
  for (int64_t key : {5, 6, 3}) ASSERT_FALSE(SendReference(world, 0, 1, key, w).empty());
  Message u;
  u.params[kDeltaBaseParam] = int64_t{3};
  u.tensors["w"] = F32(w);
  ASSERT_TRUE(world[1]->Send(0, u, 30s).ok());
  auto got = world[0]->Receive(30s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  // Base 3 is not held: lossless, bit for bit.
  EXPECT_EQ(std::memcmp(got->tensors.at("w").data.data(), w.data(), w.size() * 4), 0);
}

TEST(CompressingTransport, AReferenceThePeerDoesNotHoldIsNotUsed) {
  auto world = World(2, "compression-no-reference",
                     {{"compression", "lossless"}, {"compression.when", "always"}});
  ASSERT_EQ(world.size(), 2u);
  auto w = Weights(1 << 18, 6);
  Message u;
  u.params[kDeltaBaseParam] = int64_t{9};  // never established
  u.tensors["w"] = F32(w);
  ASSERT_TRUE(world[1]->Send(0, u, 30s).ok());
  auto got = world[0]->Receive(30s);
  ASSERT_TRUE(got.ok()) << "the message must arrive, whole, without a delta";
  EXPECT_EQ(std::memcmp(got->tensors.at("w").data.data(), w.data(), w.size() * 4), 0);
}

TEST(CompressingTransport, AutoFollowsTheLinkItIsTold) {
  // Weights on a coarse grid compress to a fraction: worth it on a slow
  // link whatever this machine's speed, never on a terabyte-per-second one.
  std::vector<float> w(1 << 20);
  std::mt19937 rng(7);
  for (auto& x : w) x = static_cast<float>(static_cast<int>(rng() % 16) - 8) * 0.125f;
  for (const auto& [mbps, expect] : {std::pair<const char*, bool>{"1", true}, {"1000000", false}}) {
    auto world = World(2, std::string("compression-auto-") + mbps,
                       {{"compression", "lossless"}, {"compression.link_MBps", mbps}});
    ASSERT_EQ(world.size(), 2u);
    Message m;
    m.tensors["w"] = F32(w);
    ASSERT_TRUE(world[0]->Send(1, m, 30s).ok());
    auto got = world[1]->Receive(30s);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(std::memcmp(got->tensors.at("w").data.data(), w.data(), w.size() * 4), 0);
    auto s = CompressionSummaryOf(*world[0]);
    EXPECT_EQ(s->messages_compressed, expect ? 1u : 0u) << s->last_choice;
    EXPECT_NE(s->last_choice.find(expect ? "lossless" : "none"), std::string::npos)
        << s->last_choice;
  }
  // Unmeasured and no prior: sent as it is.
  auto world = World(2, "compression-auto-unmeasured", {{"compression", "auto"}});
  Message m;
  m.tensors["w"] = F32(w);
  ASSERT_TRUE(world[0]->Send(1, m, 30s).ok());
  ASSERT_TRUE(world[1]->Receive(30s).ok());
  EXPECT_EQ(CompressionSummaryOf(*world[0])->messages_compressed, 0u);
}

// A receiver keeps a model as a delta reference (a copy of it) only while
// a delta to its sender could pay: once the link is known and the delta
// codecs' speeds sampled here say none can beat it, the next model is not
// copied, and the update after it goes whole.
TEST(CompressingTransport, AReferenceIsKeptOnlyWhileADeltaCouldPay) {
  // Under 256 KiB a send is not timed (kMinMeasuredBytes), so the link is
  // the prior: an inproc send's time, which would replace it, depends on
  // the machine (35 MB/s under ASan, where a delta did not pay).
  auto model = Weights((1 << 16) - 1024, 11);
  for (const auto& [mbps, pays] : {std::pair<const char*, bool>{"1", true}, {"1000000", false}}) {
    SCOPED_TRACE(mbps);
    auto world = World(2, std::string("compression-keep-") + mbps,
                       {{"compression", "lossless"},
                        {"compression.link_MBps", mbps},
                        {"compression.min_message_bytes", "65536"}});
    ASSERT_EQ(world.size(), 2u);
    for (int64_t key : {1, 2}) {
      std::vector<float> held = SendReference(world, 0, 1, key, model);
      ASSERT_EQ(held, model);
      std::vector<float> update = held;
      for (size_t i = 0; i < update.size(); i += 2) update[i] += 0.01f;
      auto back = SendUpdate(world, 1, 0, key, update);
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      EXPECT_EQ(Floats(back->tensors.at("w")), update);
      auto sender = CompressionSummaryOf(*world[0]);
      auto receiver = CompressionSummaryOf(*world[1]);
      // Each model is kept only where a delta pays: else the sender keeps
      // it not and sends no key, so the receiver keeps none either and the
      // update goes whole. The first one too, before any delta codec was
      // sampled: the same codecs on whole values bound them.
      EXPECT_EQ(receiver->references_kept, pays ? uint64_t(key) : 0u);
      EXPECT_EQ(receiver->references_skipped, 0u);
      EXPECT_EQ(sender->references_skipped, pays ? 0u : uint64_t(key));
      EXPECT_EQ(receiver->last_choice.find("delta") != std::string::npos, pays)
          << receiver->last_choice;
    }
  }
}

// A sender whose link is slow keeps its model and sends the key; the
// receiver judges by its own figures (here a link no delta beats) and
// keeps nothing, without a delta codec sampled: the whole-value codecs,
// sampled on the model it received, bound them.
TEST(CompressingTransport, AReceiverKeepsNoReferenceThatNoDeltaToItsSenderCouldPay) {
  auto model = Weights((1 << 16) - 1024, 12);
  const std::map<std::string, std::string> options = {{"compression", "lossless"},
                                                      {"compression.link_MBps", "1000000"},
                                                      {"compression.min_message_bytes", "65536"}};
  auto world =
      World(3, "compression-keep-receiver", options, {{2, {{"compression.link_MBps", "1"}}}});
  ASSERT_EQ(world.size(), 3u);
  std::vector<float> update = model;
  for (size_t i = 0; i < update.size(); i += 2) update[i] += 0.01f;
  ASSERT_EQ(SendReference(world, 2, 1, 2, model), model);
  EXPECT_EQ(CompressionSummaryOf(*world[2])->references_skipped, 0u);
  auto receiver = CompressionSummaryOf(*world[1]);
  EXPECT_EQ(receiver->references_kept, 0u);
  EXPECT_EQ(receiver->references_skipped, 1u);
  auto back = SendUpdate(world, 1, 2, 2, update);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(Floats(back->tensors.at("w")), update);
  const std::string why = CompressionSummaryOf(*world[1])->last_choice;
  EXPECT_EQ(why.find("delta"), std::string::npos) << why;
}

TEST(CompressionChoice, ARecipeThatCannotPayEvenAtRatioZeroIsKnownWithoutSampling) {
  const uint64_t mb = 1000000;
  // 100 MB at 1 GB/s: 0.1 s as it is. zstd at 300/600 MB/s on 2 threads
  // costs 0.25 s before a byte is sent: it cannot pay on this link...
  EXPECT_TRUE(CompressionCannotPay(100 * mb, 100 * mb, 1e9, 2, 300e6, 600e6, 0, 0.05));
  // ... and can on a 100 MB/s one (1 s as it is).
  EXPECT_FALSE(CompressionCannotPay(100 * mb, 100 * mb, 100e6, 2, 300e6, 600e6, 0, 0.05));
  // A bare int8 cast keeps a quarter of its bytes: at 4 GB/s each way on 2
  // threads, 25 ms of codec. At 1 GB/s, + 25 ms of wire against 100 ms: it
  // may pay; at 5 GB/s, + 5 ms against 20 ms: it cannot.
  EXPECT_FALSE(CompressionCannotPay(100 * mb, 100 * mb, 1e9, 2, 4e9, 4e9, 0.25, 0.05));
  EXPECT_TRUE(CompressionCannotPay(100 * mb, 100 * mb, 5e9, 2, 4e9, 4e9, 0.25, 0.05));
  // Unknown figures never rule a codec out.
  EXPECT_FALSE(CompressionCannotPay(100 * mb, 100 * mb, 0, 2, 300e6, 600e6, 0, 0.05));
  EXPECT_FALSE(CompressionCannotPay(100 * mb, 100 * mb, 1e9, 2, 0, 600e6, 0, 0.05));
}

// Under a ceiling (a long link not measured yet), the option with the
// least slowdown at worst, over every speed up to the ceiling, wins.
TEST(CompressionChoice, UnderACeilingTheLeastWorstCaseWins) {
  const uint64_t big = 253u << 20;
  // Lossless zstd at 0.84 costs 0.54 s of codec against 0.44 s of send at
  // the ceiling (2.05x there); sending as it is loses at most 1/0.84.
  const std::vector<CodecCandidate> lossless = {Candidate(Quant::kNone, 0.84, 340, 900, big)};
  auto z = ChooseCompressionUnderCeiling(big, 600e6, 2, lossless, 0.05);
  EXPECT_FALSE(z.compress) << z.reason;
  EXPECT_NE(z.reason.find("at worst 1.19x"), std::string::npos) << z.reason;
  // ...whereas at 16 MB/s, a point figure, it pays.
  EXPECT_TRUE(ChooseCompression(big, 16e6, 2, lossless, 0.05).compress);
  // A quarter of the bytes for 0.27 s of codec: faster at the ceiling
  // already, and sending as it is would be up to 4x slower.
  auto q = ChooseCompressionUnderCeiling(
      big, 600e6, 2, {lossless[0], Candidate(Quant::kInt8, 0.25, 1000, 1000, big)}, 0.05);
  ASSERT_TRUE(q.compress) << q.reason;
  EXPECT_EQ(q.recipe.quant, Quant::kInt8);
  EXPECT_NEAR(q.uncompressed_s, static_cast<double>(big) / 600e6, 1e-9);
  EXPECT_LT(q.predicted_s, q.uncompressed_s);
  // A bare cast (half the bytes, 0.09 s) is fastest at the ceiling; the
  // cast with zstd (0.34 of the bytes, 0.18 s) is 1.06x slower there but
  // the bare cast is 1.47x slower on a slow link: zstd wins here, the bare
  // cast with a point figure at the ceiling.
  CodecCandidate bare = Candidate(Quant::kBF16, 0.5, 3000, 3000, big);
  bare.estimate.recipe.zstd = false;
  CodecCandidate zstd = Candidate(Quant::kBF16, 0.341, 1000, 3000, big);
  zstd.estimate.recipe.zstd = true;
  auto worst = ChooseCompressionUnderCeiling(big, 600e6, 2, {bare, zstd}, 0.05);
  ASSERT_TRUE(worst.compress) << worst.reason;
  EXPECT_TRUE(worst.recipe.zstd) << worst.reason;
  auto point = ChooseCompression(big, 600e6, 2, {bare, zstd}, 0.05);
  ASSERT_TRUE(point.compress) << point.reason;
  EXPECT_FALSE(point.recipe.zstd) << point.reason;
  // A ceiling as high as a LAN's: the codec's own time dominates there.
  EXPECT_FALSE(ChooseCompressionUnderCeiling(big, 1e12, 2,
                                             {Candidate(Quant::kInt8, 0.25, 1000, 1000, big)}, 0.05)
                   .compress);
  EXPECT_FALSE(ChooseCompressionUnderCeiling(big, 0, 2, {bare}, 0.05).compress);
}

// An inner transport that reports given round trips, as auto+<connector>
// does from its echoes, and counts LearnLink.
class KnownRtt final : public ForwardingTransport, public LinkObserver {
 public:
  KnownRtt(std::unique_ptr<Transport> inner, std::map<int32_t, double> rtt)
      : ForwardingTransport(std::move(inner)), rtt_(std::move(rtt)) {}
  ~KnownRtt() override { Stop(); }
  LinkObserver* link_observer() override { return this; }
  double MeasuredGoodputBps(int32_t) override { return 0; }
  std::string RouteReason() const override { return {}; }
  double MeasuredRttS(int32_t peer) override {
    auto it = rtt_.find(peer);
    return it == rtt_.end() ? -1 : it->second;
  }
  void LearnLink(const std::vector<int32_t>& peers, uint64_t bytes) override {
    ++learned;
    if (LinkObserver* inner_observer = inner().link_observer()) {
      inner_observer->LearnLink(peers, bytes);
    }
  }
  std::atomic<int> learned{0};

 private:
  const std::map<int32_t, double> rtt_;
};

// An unmeasured link with a long round trip is bounded by
// compression.long_link_MBps (here 1 MB/s, so that the choice does not
// depend on this machine's codec speed); a short one stays unknown, and
// so does a long one with the ceiling off. A broadcast needs only one
// such receiver: the slowest one is no faster than it.
TEST(CompressingTransport, AnUnmeasuredLongLinkIsBoundedByItsCeiling) {
  std::vector<float> w(1 << 20);
  std::mt19937 rng(7);
  for (auto& x : w) x = static_cast<float>(static_cast<int>(rng() % 16) - 8) * 0.125f;
  struct Case {
    std::string name;
    std::map<int32_t, double> rtt;
    std::string ceiling;
    bool compressed;
  };
  for (const Case& c : {Case{"long", {{1, 0.150}, {2, 0.150}}, "1", true},
                        Case{"one-long", {{1, 0.001}, {2, 0.150}}, "1", true},
                        Case{"one-unknown", {{2, 0.150}}, "1", true},
                        Case{"short", {{1, 0.001}, {2, 0.019}}, "1", false},
                        Case{"off", {{1, 0.150}, {2, 0.150}}, "0", false}}) {
    SCOPED_TRACE(c.name);
    std::map<std::string, std::string> backend = {{"compression", "lossless"},
                                                  {"compression.long_link_MBps", c.ceiling}};
    CompressionPolicy policy;
    TransportOptions o, rest;
    o.backend = backend;
    ASSERT_TRUE(*ParseCompressionOptions(o, &policy, &rest));
    std::vector<std::unique_ptr<Transport>> world;
    KnownRtt* known = nullptr;
    for (int r = 0; r < 3; ++r) {
      TransportOptions t;
      t.rank = r;
      t.world_size = 3;
      t.address = "compression-ceiling-" + c.name;
      auto inner = TransportRegistry::Global().Create("inproc", t);
      ASSERT_TRUE(inner.ok()) << inner.status().ToString();
      std::unique_ptr<Transport> wrapped = std::move(inner).value();
      if (r == 0) {
        auto k = std::make_unique<KnownRtt>(std::move(wrapped), c.rtt);
        known = k.get();
        wrapped = std::move(k);
      }
      world.push_back(MakeCompressingTransport(std::move(wrapped), policy));
    }
    std::vector<std::future<Status>> starts;
    for (auto& t : world) {
      starts.push_back(std::async(std::launch::async, [p = t.get()] { return p->Start(); }));
    }
    for (auto& f : starts) ASSERT_TRUE(f.get().ok());
    Message m;
    m.tensors["w"] = F32(w);
    ASSERT_TRUE(world[0]->Broadcast({1, 2}, m, 30s).ok());
    for (int r : {1, 2}) {
      auto got = world[r]->Receive(30s);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(std::memcmp(got->tensors.at("w").data.data(), w.data(), w.size() * 4), 0);
    }
    auto s = CompressionSummaryOf(*world[0]);
    EXPECT_EQ(s->messages_compressed, c.compressed ? 1u : 0u) << s->last_choice;
    if (c.compressed) {
      EXPECT_NE(
          s->last_choice.find("long and unmeasured, round trip up to 150.0 ms: at most 1.0 MB/s"),
          std::string::npos)
          << s->last_choice;
    } else {
      EXPECT_NE(s->last_choice.find("not measured yet"), std::string::npos) << s->last_choice;
    }
    EXPECT_EQ(known->learned.load(), 1) << "the choice first learns what the send would";
    for (auto& t : world) t->Stop();
  }
}

// On a link faster than any codec the decorator samples each recipe once
// and then stops paying for samples (15-30 ms a 20 MB message on a LAN);
// on a slow link it keeps choosing from fresh samples.
TEST(CompressingTransport, SamplesACodecThatCannotPayOnlyOnce) {
  const auto w = Weights(50000, 3);  // 200 KB: the link stays at its prior
  for (const auto& [mbps, skips] :
       {std::pair<const char*, bool>{"100000000", true}, {"1", false}}) {
    SCOPED_TRACE(mbps);
    auto world = World(2, std::string("compression-memo-") + mbps,
                       {{"compression", "int8"},
                        {"compression.link_MBps", mbps},
                        {"compression.min_message_bytes", "1"}});
    ASSERT_EQ(world.size(), 2u);
    for (int i = 0; i < 3; ++i) {
      Message m;
      m.tensors["w"] = F32(w);
      ASSERT_TRUE(world[0]->Send(1, m, 30s).ok());
      ASSERT_TRUE(world[1]->Receive(30s).ok());
      const std::string why = CompressionSummaryOf(*world[0])->last_choice;
      const bool skipped = why.find("not sampled") != std::string::npos;
      EXPECT_EQ(skipped, skips && i > 0) << "message " << i << ": " << why;
    }
    EXPECT_EQ(CompressionSummaryOf(*world[0])->messages_compressed, skips ? 0u : 3u);
  }
}

// An inner transport that takes streamed sends: it fails one at once
// (as a stopped transport does), or sends the message once it is
// finished.
class StreamingInner final : public ForwardingTransport, public StreamSink {
 public:
  StreamingInner(std::unique_ptr<Transport> inner, bool fail_now)
      : ForwardingTransport(std::move(inner)), fail_now_(fail_now) {}
  ~StreamingInner() override {
    for (auto& t : threads_) t.join();
  }
  StreamSink* stream_sink() override { return this; }
  bool StreamsSends(int32_t) override { return true; }
  void SendStreamAsync(int32_t peer, std::shared_ptr<EncodeStream> stream,
                       SendCallback done) override {
    if (fail_now_) return done(Cancelled("transport stopped"));
    threads_.emplace_back([this, peer, stream, done = std::move(done)] {
      auto m = stream->TakeMessage();
      if (!m.ok()) return done(m.status());
      inner().SendAsync(peer, std::move(m).value(), done);
    });
  }

 private:
  const bool fail_now_;
  std::vector<std::thread> threads_;
};

// A streamed send's callback runs once, after the encode, even when the
// inner transport fails it before the encode began; one that goes
// arrives as sent.
TEST(CompressingTransport, AStreamedSendCompletesOnceAfterItsEncode) {
  for (bool fail_now : {true, false}) {
    SCOPED_TRACE(fail_now ? "failed at once" : "sent");
    const std::string fabric = fail_now ? "compression-stream-fail" : "compression-stream";
    const std::map<std::string, std::string> backend = {{"compression", "lossless"},
                                                        {"compression.when", "always"}};
    TransportOptions o;
    o.rank = 0;
    o.world_size = 2;
    o.address = fabric;
    auto inner = TransportRegistry::Global().Create("inproc", o);
    ASSERT_TRUE(inner.ok()) << inner.status().ToString();
    o.backend = backend;
    CompressionPolicy policy;
    TransportOptions rest;
    ASSERT_TRUE(ParseCompressionOptions(o, &policy, &rest).ok());
    std::unique_ptr<Transport> sender = MakeCompressingTransport(
        std::make_unique<StreamingInner>(std::move(inner).value(), fail_now), policy);
    o.rank = 1;
    auto receiver = TransportRegistry::Global().Create("inproc", o);
    ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();
    auto started = std::async(std::launch::async, [&] { return sender->Start(); });
    ASSERT_TRUE((*receiver)->Start().ok());
    ASSERT_TRUE(started.get().ok());

    Message m;
    const auto values = Weights(1 << 18, 21);
    m.tensors["w"] = F32(values);
    std::atomic<int> calls{0};
    std::atomic<uint64_t> sent_at_callback{0};
    std::promise<Status> done;
    sender->SendAsync(1, m, [&](const Status& s) {
      sent_at_callback = CompressionSummaryOf(*sender)->messages_sent;
      if (calls.fetch_add(1) == 0) done.set_value(s);
    });
    auto f = done.get_future();
    ASSERT_EQ(f.wait_for(30s), std::future_status::ready);
    const Status s = f.get();
    EXPECT_EQ(sent_at_callback.load(), 1u) << "the callback ran before the encode ended";
    EXPECT_EQ(CompressionSummaryOf(*sender)->messages_streamed, 1u);
    if (fail_now) {
      EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
    } else {
      ASSERT_TRUE(s.ok()) << s.ToString();
      auto got = (*receiver)->Receive(30s);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(Floats(got->tensors.at("w")), values);
    }
    sender->Stop();
    (*receiver)->Stop();
    EXPECT_EQ(calls.load(), 1);
  }
}

TEST(CompressingTransport, AFrameThatCannotBeDecodedIsDroppedNotDelivered) {
  // Rank 0 compresses nothing itself but forges a table; rank 1 decodes.
  auto world = World(2, "compression-corrupt", {{"compression", "lossless"}});
  ASSERT_EQ(world.size(), 2u);
  Message bad;
  bad.type = "bad";
  bad.params[kCodecParam] = std::string(R"({"v":1,"t":{"w":{"dtype":"f32"}}})");
  bad.tensors["w"] = *Tensor::Zeros(DType::kU8, {100});
  ASSERT_TRUE(world[0]->Send(1, bad, 30s).ok());
  Message good;
  good.type = "good";
  good.tensors["w"] = F32(Weights(100, 8));
  ASSERT_TRUE(world[0]->Send(1, good, 30s).ok());
  auto got = world[1]->Receive(30s);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->type, "good") << "the undecodable message was delivered";
}

}  // namespace
}  // namespace xsilo
