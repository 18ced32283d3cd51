// The auto policy on made-up links: given link figures and a size, the
// expected path. No timing.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "hybrid/auto/auto_policy.h"

namespace xsilo {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

LinkEstimate Link(double rtt_s, double one_MBps, double aggregate_MBps, int streams = 32) {
  LinkEstimate l;
  l.samples = 10;
  l.rtt_s = rtt_s;
  l.one_stream_Bps = one_MBps * 1e6;
  l.aggregate_Bps = aggregate_MBps * 1e6;
  l.aggregate_streams = streams;
  l.one_stream_samples = 5;
  l.aggregate_samples = 5;
  return l;
}

// A long fat link: 100 ms RTT, one stream window-bound at 10 MB/s, 400 MB/s
// filled.
LinkEstimate LongFat() { return Link(0.1, 10, 400); }
// A LAN: one stream fills it.
LinkEstimate Lan() { return Link(50e-6, 1000, 1200, 4); }

AutoChoice Choose(const LinkEstimate& link, uint64_t bytes, bool store = true,
                  const AutoPolicyOptions& o = {}) {
  AutoRequest r;
  r.bytes = bytes;
  r.store_available = store;
  return ChooseAutoPath(link, r, o);
}

TEST(AutoPolicy, NoEstimateFollowsTheDefaultThreshold) {
  LinkEstimate none;
  EXPECT_EQ(Choose(none, 1 * kMiB).path, AutoPath::kInline);
  EXPECT_EQ(Choose(none, 10 * kMiB - 1).path, AutoPath::kInline);
  AutoChoice big = Choose(none, 10 * kMiB);
  EXPECT_EQ(big.path, AutoPath::kStore);
  EXPECT_EQ(big.streams, 1);
  EXPECT_NE(big.reason.find("no link estimate"), std::string::npos) << big.reason;
  EXPECT_LT(big.store_s, 0) << "nothing predicted without figures";
  EXPECT_EQ(Choose(none, 10 * kGiB, /*store=*/false).path, AutoPath::kInline);
}

TEST(AutoPolicy, FiguresWithoutSamplesAreNoEstimate) {
  LinkEstimate l = LongFat();
  l.samples = 0;
  EXPECT_EQ(Choose(l, 10 * kMiB - 1).path, AutoPath::kInline);
  EXPECT_EQ(Choose(l, 10 * kMiB).path, AutoPath::kStore);
}

TEST(AutoPolicy, BadRoundTripIsNoEstimate) {
  for (double rtt : {std::nan(""), -1.0, std::numeric_limits<double>::infinity()}) {
    LinkEstimate l = Lan();
    l.rtt_s = rtt;
    EXPECT_EQ(Choose(l, 100 * kMiB).path, AutoPath::kStore) << rtt;
    EXPECT_EQ(Choose(l, 1 * kMiB).path, AutoPath::kInline) << rtt;
  }
}

TEST(AutoPolicy, ZeroOrNanThroughputUsesTheRoundTripOnly) {
  const double nan = std::nan("");
  for (auto [one, aggregate] : {std::pair{0.0, 400.0}, std::pair{10.0, 0.0}, std::pair{nan, 400.0},
                                std::pair{10.0, nan}, std::pair{-5.0, -5.0}}) {
    // WAN round trip: the default threshold.
    AutoChoice wan = Choose(Link(0.1, one, aggregate), 64 * kMiB);
    EXPECT_EQ(wan.path, AutoPath::kStore) << one << " " << aggregate;
    EXPECT_NE(wan.reason.find("no throughput"), std::string::npos) << wan.reason;
    EXPECT_EQ(Choose(Link(0.1, one, aggregate), 1 * kMiB).path, AutoPath::kInline);
    // LAN round trip: inline whatever the size.
    EXPECT_EQ(Choose(Link(50e-6, one, aggregate), 64 * kGiB).path, AutoPath::kInline);
  }
}

TEST(AutoPolicy, LoopbackRoundTripOfZeroIsAFigure) {
  LinkEstimate l = Link(0, 1000, 1200);
  EXPECT_EQ(Choose(l, 1 * kGiB).path, AutoPath::kInline);
  EXPECT_EQ(Choose(l, 0).path, AutoPath::kInline);
}

TEST(AutoPolicy, EmptyMessageIsInline) {
  AutoChoice c = Choose(LongFat(), 0);
  EXPECT_EQ(c.path, AutoPath::kInline);
  EXPECT_EQ(c.streams, 1);
}

TEST(AutoPolicy, LanStaysInlineAtEverySize) {
  const uint64_t sizes[] = {1, 64 << 10, 10 * kMiB, 256 * kMiB, 3 * kGiB, 1ull << 40};
  for (uint64_t bytes : sizes) {
    AutoChoice c = Choose(Lan(), bytes);
    EXPECT_EQ(c.path, AutoPath::kInline) << bytes << ": " << c.reason;
    EXPECT_LT(c.striped_s, 0) << "one stream fills a LAN: no stripe predicted";
  }
  EXPECT_EQ(StripeStreams(Lan()), 1);
  EXPECT_EQ(StoreThresholdBytes(Lan()), UINT64_MAX);
}

TEST(AutoPolicy, SmallMessagesInlineOnALongFatLink) {
  // 64 KiB is far inside one stream's window (10 MB/s x 100 ms = 1 MB).
  AutoChoice c = Choose(LongFat(), 64 << 10);
  EXPECT_EQ(c.path, AutoPath::kInline) << c.reason;
}

TEST(AutoPolicy, LongFatLinkStripesMidSizesAndStoresBigOnes) {
  // K = ceil(400 / 10) = 40, capped at 16 -> 160 MB/s striped; the store
  // path moves at min(400, 32 x 10) = 320 MB/s plus 600 MB/s locally.
  AutoChoice mid = Choose(LongFat(), 20 * kMiB);
  EXPECT_EQ(mid.path, AutoPath::kStriped) << mid.reason;
  EXPECT_EQ(mid.streams, 16);
  AutoChoice big = Choose(LongFat(), 1 * kGiB);
  EXPECT_EQ(big.path, AutoPath::kStore) << big.reason;
  EXPECT_EQ(big.streams, 1);
  EXPECT_GT(big.inline_s, big.striped_s);
  EXPECT_GT(big.striped_s, big.store_s);
}

TEST(AutoPolicy, WithoutAStoreBigMessagesAreStriped) {
  AutoChoice c = Choose(LongFat(), 4 * kGiB, /*store=*/false);
  EXPECT_EQ(c.path, AutoPath::kStriped) << c.reason;
  EXPECT_LT(c.store_s, 0);
  EXPECT_NE(c.reason.find("no store"), std::string::npos);
}

TEST(AutoPolicy, WithoutStripingBigMessagesGoThroughTheStore) {
  AutoPolicyOptions o;
  o.max_streams = 1;
  EXPECT_EQ(Choose(LongFat(), 20 * kMiB, true, o).path, AutoPath::kStore);
  EXPECT_EQ(Choose(LongFat(), 64 << 10, true, o).path, AutoPath::kInline);
  EXPECT_EQ(Choose(LongFat(), 20 * kMiB, false, o).path, AutoPath::kInline);
}

TEST(AutoPolicy, HugeSizesAbove2GiBAndNear64Bits) {
  const uint64_t sizes[] = {(2ull << 30) + 1, 5 * kGiB, 1ull << 40, 1ull << 62, UINT64_MAX};
  for (uint64_t bytes : sizes) {
    AutoChoice c = Choose(LongFat(), bytes);
    EXPECT_EQ(c.path, AutoPath::kStore) << bytes;
    EXPECT_TRUE(std::isfinite(c.store_s) && c.store_s > 0) << bytes;
    EXPECT_GT(c.inline_s, c.store_s) << bytes;
    EXPECT_EQ(Choose(Lan(), bytes).path, AutoPath::kInline) << bytes;
  }
  // Predictions grow with size: nothing wrapped around.
  EXPECT_LT(Choose(LongFat(), 2 * kGiB).store_s, Choose(LongFat(), 5 * kGiB).store_s);
}

TEST(AutoPolicy, StripeWidthIsTheParallelGainCapped) {
  EXPECT_EQ(StripeStreams(Link(0.1, 10, 40)), 4);
  EXPECT_EQ(StripeStreams(Link(0.1, 10, 41)), 5);
  EXPECT_EQ(StripeStreams(Link(0.1, 10, 400)), 16);
  AutoPolicyOptions wide;
  wide.max_streams = 64;
  EXPECT_EQ(StripeStreams(Link(0.1, 10, 400), wide), 40);
  EXPECT_EQ(StripeStreams(Link(0.1, 1e-9, 1e12), wide), 64) << "no int overflow";
  EXPECT_EQ(StripeStreams(Link(0.1, 10, 14)), 1) << "gain 1.4 < 1.5";
  EXPECT_EQ(StripeStreams(Link(0.1, 10, 5)), 1) << "probe below one stream";
  EXPECT_EQ(StripeStreams(Link(0.1, std::nan(""), 400)), 1);
  EXPECT_EQ(StripeStreams(LinkEstimate{}), 1);
  AutoPolicyOptions none;
  none.max_streams = 0;
  EXPECT_EQ(StripeStreams(Link(0.1, 10, 400), none), 1);
}

TEST(AutoPolicy, FlowControlWindowCapsStriping) {
  // 1 MiB window over 100 ms: ~10.5 MB/s whatever the stripe: striping
  // buys nothing over one 10 MB/s stream, the store path still does.
  AutoPolicyOptions o;
  o.window_bytes = 1 * kMiB;
  AutoChoice c = Choose(LongFat(), 20 * kMiB, /*store=*/false, o);
  EXPECT_EQ(c.path, AutoPath::kInline) << c.reason;
  EXPECT_EQ(Choose(LongFat(), 20 * kMiB, true, o).path, AutoPath::kStore);
}

TEST(AutoPolicy, NearTiesKeepTheSimplerPath) {
  // Striping over 2 streams is predicted 1.8x faster: taken at a margin of
  // 1.1, not at a margin of 2.
  LinkEstimate l = Link(0.001, 100, 200);
  AutoPolicyOptions o;
  o.switch_margin = 1.1;
  o.window_bytes = 0;
  // inline: 1 ms + 1 MB / 100 MB/s = 11 ms; striped(2): 1 ms + 5 ms = 6 ms.
  EXPECT_EQ(Choose(l, 1000000, false, o).path, AutoPath::kStriped);
  o.switch_margin = 2;
  EXPECT_EQ(Choose(l, 1000000, false, o).path, AutoPath::kInline);
  o.switch_margin = std::nan("");
  EXPECT_EQ(Choose(l, 1000000, false, o).path, AutoPath::kStriped) << "NaN margin counts as 1";
}

TEST(AutoPolicy, BroadcastCopiesShareTheSenderEgress) {
  AutoPolicyOptions o;
  o.sender_egress_Bps = 200e6;
  AutoRequest r;
  r.bytes = 20 * kMiB;
  r.store_available = true;
  r.receivers = 1;
  EXPECT_EQ(ChooseAutoPath(LongFat(), r, o).path, AutoPath::kStriped);
  r.receivers = 8;  // 8 copies at 25 MB/s each; the store path uploads once
  AutoChoice c = ChooseAutoPath(LongFat(), r, o);
  EXPECT_EQ(c.path, AutoPath::kStore) << c.reason;
  EXPECT_NE(c.reason.find("8 receivers"), std::string::npos) << c.reason;
  for (int bad : {0, -3}) {
    r.receivers = bad;
    EXPECT_EQ(ChooseAutoPath(LongFat(), r, o).path, AutoPath::kStriped) << "counts as 1";
  }
}

TEST(AutoPolicy, ReasonNamesPathAndFigures) {
  AutoChoice c = Choose(LongFat(), 1 * kGiB);
  EXPECT_EQ(c.reason.rfind("store: 1 GiB", 0), 0u) << c.reason;
  for (const char* part : {"predicted inline", "striped(16)", "100 ms RTT", "10 MB/s", "400 MB/s",
                           "(writes at 600 MB/s)"}) {
    EXPECT_NE(c.reason.find(part), std::string::npos) << part << " in " << c.reason;
  }
  EXPECT_EQ(Choose(LongFat(), 20 * kMiB).reason.rfind("striped(16): 20 MiB", 0), 0u);
  EXPECT_EQ(AutoPathName(AutoPath::kInline), "inline");
  EXPECT_EQ(AutoPathName(AutoPath::kStriped), "striped");
  EXPECT_EQ(AutoPathName(AutoPath::kStore), "store");
}

// geo-proximal medium in one pass of 908e3fc:results/archive/p2p-auto-all-v3: one slow
// store probe (191 MB/s, against ~4x that in the other passes) made the
// store look 1.4x slower than inline; the store is explored while its
// figure rests on fewer than three transfers.
TEST(AutoPolicy, AYoungFigureCloseToTheChoiceIsExplored) {
  LinkEstimate l = Link(0.00173, 207, 191);
  AutoRequest r;
  r.bytes = 19.7 * kMiB;
  r.store_available = true;
  const AutoChoice chosen = ChooseAutoPath(l, r);
  ASSERT_EQ(chosen.path, AutoPath::kInline) << chosen.reason;
  ASSERT_LT(chosen.store_s, 1.5 * chosen.inline_s) << chosen.reason;
  EXPECT_FALSE(ExploreAutoPath(l, r, chosen)) << "5 transfers: trusted";
  for (int samples : {1, 2}) {
    l.aggregate_samples = samples;
    auto alt = ExploreAutoPath(l, r, chosen);
    ASSERT_TRUE(alt);
    EXPECT_EQ(alt->path, AutoPath::kStore);
    EXPECT_EQ(alt->streams, 1);
    EXPECT_DOUBLE_EQ(alt->store_s, chosen.store_s);
    EXPECT_EQ(alt->reason.rfind("store: exploring, its aggregate rate is from " +
                                    std::to_string(samples) + " transfer",
                                0),
              0u)
        << alt->reason;
    EXPECT_NE(alt->reason.find("chosen was inline"), std::string::npos) << alt->reason;
  }
  l.aggregate_samples = 3;
  EXPECT_FALSE(ExploreAutoPath(l, r, chosen)) << "trusted_samples";
  l.aggregate_samples = 1;
  AutoPolicyOptions o;
  o.explore_factor = 1.2;
  EXPECT_FALSE(ExploreAutoPath(l, r, ChooseAutoPath(l, r, o), o)) << "1.4x is beyond 1.2x";
  for (double off : {0.0, 0.5, std::nan("")}) {
    o.explore_factor = off;
    EXPECT_FALSE(ExploreAutoPath(l, r, ChooseAutoPath(l, r, o), o)) << off;
  }
  r.store_available = false;
  EXPECT_FALSE(ExploreAutoPath(l, r, ChooseAutoPath(l, r))) << "no store to explore";
  r.store_available = true;
  r.bytes = 0;
  EXPECT_FALSE(ExploreAutoPath(l, r, ChooseAutoPath(l, r)));
  EXPECT_FALSE(ExploreAutoPath(LinkEstimate{}, r, ChooseAutoPath(LinkEstimate{}, r)))
      << "no figures: nothing to compare";
}

// The store chosen, inline explored when its one-stream figure is young and
// close (here 1.9x: within 2x, not within the default 1.5x); never when it
// is far (a LAN's store, 2.5x slower than inline with the fitted write
// rate, is not tried again and again).
TEST(AutoPolicy, InlineIsExploredFromTheStoreOnlyWhenClose) {
  LinkEstimate l = Link(0.0015, 183, 861);  // geo-proximal big in p2p-auto-all-v3
  l.one_stream_samples = 1;
  AutoRequest r;
  r.bytes = 253 * kMiB;
  r.store_available = true;
  AutoPolicyOptions o;
  o.max_streams = 1;  // as the router runs it by default
  AutoChoice chosen = ChooseAutoPath(l, r, o);
  ASSERT_EQ(chosen.path, AutoPath::kStore) << chosen.reason;
  EXPECT_FALSE(ExploreAutoPath(l, r, chosen, o)) << "inline predicted ~1.9x the store";
  o.explore_factor = 2;
  auto alt = ExploreAutoPath(l, r, chosen, o);
  ASSERT_TRUE(alt);
  EXPECT_EQ(alt->path, AutoPath::kInline);
  EXPECT_EQ(alt->reason.rfind("inline: exploring, its one-stream rate is from 1 transfer ", 0), 0u)
      << alt->reason;
  LinkEstimate lan = Lan();
  lan.aggregate_samples = 1;
  r.bytes = 265 * kMiB;
  chosen = ChooseAutoPath(lan, r);
  ASSERT_EQ(chosen.path, AutoPath::kInline);
  EXPECT_FALSE(ExploreAutoPath(lan, r, chosen)) << chosen.reason;
}

// Striped chosen: the store is explored against the striped prediction,
// not the inline one.
TEST(AutoPolicy, TheStoreIsExploredAgainstAStripedChoice) {
  LinkEstimate l = LongFat();
  l.aggregate_samples = 1;
  AutoRequest r;
  // striped(16) 755 ms, store 802 ms (1.06x), inline 10.6 s.
  r.bytes = 100 * kMiB;
  r.store_available = true;
  const AutoChoice chosen = ChooseAutoPath(l, r);
  ASSERT_EQ(chosen.path, AutoPath::kStriped) << chosen.reason;
  ASSERT_LT(chosen.striped_s, chosen.inline_s);
  auto alt = ExploreAutoPath(l, r, chosen);
  ASSERT_TRUE(alt) << chosen.reason;
  EXPECT_EQ(alt->path, AutoPath::kStore);
  EXPECT_NE(alt->reason.find("of striped "), std::string::npos) << alt->reason;
  // A factor just under the store's ratio to striped: not explored, though
  // inline is 13x slower than the store.
  AutoPolicyOptions o;
  o.explore_factor = chosen.store_s / chosen.striped_s * 0.99;
  ASSERT_GE(o.explore_factor, 1) << chosen.reason;
  EXPECT_FALSE(ExploreAutoPath(l, r, chosen, o)) << chosen.reason;
}

TEST(AutoPolicy, StoreThresholdIsWhereTheChoiceFlips) {
  AutoPolicyOptions no_stripe;
  no_stripe.max_streams = 1;
  for (const AutoPolicyOptions& o : {AutoPolicyOptions{}, no_stripe}) {
    const uint64_t t = StoreThresholdBytes(LongFat(), o);
    ASSERT_GT(t, 1u);
    ASSERT_LT(t, UINT64_MAX);
    EXPECT_EQ(Choose(LongFat(), t, true, o).path, AutoPath::kStore) << t;
    EXPECT_NE(Choose(LongFat(), t - 1, true, o).path, AutoPath::kStore) << t;
  }
  EXPECT_LT(StoreThresholdBytes(LongFat(), no_stripe), StoreThresholdBytes(LongFat()))
      << "striping keeps mid sizes off the store";
  EXPECT_EQ(StoreThresholdBytes(LinkEstimate{}), 10 * kMiB);
  EXPECT_EQ(StoreThresholdBytes(Link(50e-6, 0, 0)), UINT64_MAX) << "LAN by round trip";
  EXPECT_EQ(StoreThresholdBytes(Link(0.1, 0, 0)), 10 * kMiB);
  AutoPolicyOptions zero;
  zero.default_store_bytes = 0;
  EXPECT_EQ(StoreThresholdBytes(LinkEstimate{}, zero), 1u) << "an empty tensor stays inline";
}

}  // namespace
}  // namespace xsilo
