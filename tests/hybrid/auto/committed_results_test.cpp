// The auto policy on link classes its constants were not fitted to (the
// fitted ones are the LAN and ca-hk cells of results/p2p-*, docs/auto.md).
// No expected value here comes from the policy's own cost formulas: each is
// a bound from first principles (bytes / bandwidth + k round trips, with k
// counted from what each path must do) or a property the documented rule
// implies (docs/auto.md, "Rules": a more complex path only when kMargin
// times faster).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "hybrid/auto/auto_policy.h"

namespace xsilo {
namespace {

// The rule's margin, set explicitly: the bounds below follow from the
// documented rule, not from whatever the default is.
constexpr double kMargin = 1.1;

// Rate at which this test's store writes and serves bytes: a measured
// figure (AutoRouter::OnStoreWrite replaces the fitted 600 MB/s with one).
constexpr double kStoreLocalBps = 250e6;

struct LinkClass {
  const char* name;
  double rtt_s, one_MBps, aggregate_MBps;  // one stream, parallel probe
};

// None of them is a committed cell: a 100G datacenter, a metro 10G link,
// LTE and DSL (one stream nearly fills them), and three long fat links
// whose one stream is window-bound.
const LinkClass kLinks[] = {
    {"datacenter 100G", 80e-6, 2500, 11000},
    {"metro 10G", 0.004, 250, 1150},
    {"lte", 0.045, 3, 5},
    {"dsl", 0.025, 1.2, 1.25},
    {"transatlantic", 0.075, 40, 1100},
    {"eu-au", 0.28, 12, 300},
    {"geo satellite", 0.62, 1.5, 45},
};

LinkEstimate Estimate(double rtt_s, double one_Bps, double aggregate_Bps) {
  LinkEstimate l;
  l.samples = 10;
  l.rtt_s = rtt_s;
  l.one_stream_Bps = one_Bps;
  l.aggregate_Bps = aggregate_Bps;
  l.aggregate_streams = 32;
  l.one_stream_samples = 5;
  l.aggregate_samples = 5;
  return l;
}

LinkEstimate Estimate(const LinkClass& c) {
  return Estimate(c.rtt_s, c.one_MBps * 1e6, c.aggregate_MBps * 1e6);
}

AutoPolicyOptions Options(int max_streams) {
  AutoPolicyOptions o;
  o.max_streams = max_streams;
  o.switch_margin = kMargin;
  o.store_local_Bps = kStoreLocalBps;
  return o;
}

AutoChoice Choose(const LinkEstimate& link, uint64_t bytes, const AutoPolicyOptions& o,
                  bool store = true) {
  AutoRequest r;
  r.bytes = bytes;
  r.store_available = store;
  return ChooseAutoPath(link, r, o);
}

// The figures are physical: one stream moves at most a window per round trip.
TEST(AutoPolicyUnfittedLinks, LinkClassesAreConsistent) {
  const double window = static_cast<double>(AutoPolicyOptions{}.window_bytes);
  for (const LinkClass& c : kLinks) {
    EXPECT_LE(2 * Estimate(c).OneStreamBdpBytes(), window) << c.name;
    EXPECT_GE(c.aggregate_MBps, c.one_MBps) << c.name;
  }
}

// Every path takes at least one round trip (the message out, its
// confirmation back); the store path at least two (the receiver learns of
// the object from the stub, then requests it). Up to a twentieth of one
// stream's bandwidth-delay product, inline takes at most RTT + S / r1 <=
// 1.05 RTT, so no path can be kMargin times faster; with striping off, up
// to the whole product, inline takes at most 2 RTT, the store at least 2.
TEST(AutoPolicyUnfittedLinks, TinyMessagesGoInlineOnEveryLink) {
  for (const LinkClass& c : kLinks) {
    const LinkEstimate l = Estimate(c);
    const double bdp = l.OneStreamBdpBytes();
    ASSERT_GE(bdp / 20, 1) << c.name;
    for (uint64_t bytes : {uint64_t{1}, static_cast<uint64_t>(bdp / 20)}) {
      const AutoChoice choice = Choose(l, bytes, Options(16));
      EXPECT_EQ(choice.path, AutoPath::kInline) << c.name << ", " << bytes << ": " << choice.reason;
    }
    for (uint64_t bytes : {static_cast<uint64_t>(bdp / 20), static_cast<uint64_t>(bdp)}) {
      const AutoChoice choice = Choose(l, bytes, Options(1));
      EXPECT_EQ(choice.path, AutoPath::kInline) << c.name << ", " << bytes << ": " << choice.reason;
    }
  }
}

// Where the parallel probe moves 20 or more times one stream, a big message
// goes by many connections. The size is picked from first principles:
// inline takes at least S / r1; a store path that paid 5 round trips, the
// write rate and only half the aggregate (its 32 connections reach that
// much while the gain is at most 64) would take 5 RTT + S / local + 2 S /
// rA, and S makes the first at least twice the second.
TEST(AutoPolicyUnfittedLinks, AOneStreamFarBelowTheAggregateSendsBigMessagesAround) {
  int checked = 0;
  for (const LinkClass& c : kLinks) {
    const double gain = c.aggregate_MBps / c.one_MBps;
    if (gain < 20) continue;
    ++checked;
    AutoPolicyOptions o = Options(1);
    ASSERT_LE(gain, 2.0 * o.store_connections) << c.name;
    const LinkEstimate l = Estimate(c);
    const double r1 = l.one_stream_Bps, ra = l.aggregate_Bps;
    const double per_byte = 1 / r1 - 2 / kStoreLocalBps - 4 / ra;
    ASSERT_GT(per_byte, 0) << c.name;
    const uint64_t bytes = static_cast<uint64_t>(std::ceil(10 * c.rtt_s / per_byte));

    const AutoChoice store = Choose(l, bytes, o);
    EXPECT_EQ(store.path, AutoPath::kStore) << c.name << ": " << store.reason;
    EXPECT_GE(store.inline_s, 2 * store.store_s) << c.name << ": " << store.reason;
    // Striping on: whichever wins, not one stream.
    o.max_streams = 16;
    const AutoChoice any = Choose(l, bytes, o);
    EXPECT_NE(any.path, AutoPath::kInline) << c.name << ": " << any.reason;
    // No store: two streams alone (2 r1 fits the window, see above) take
    // RTT + S / (2 r1), and S / r1 >= 10 RTT makes that kMargin faster.
    const AutoChoice striped = Choose(l, bytes, o, /*store=*/false);
    EXPECT_EQ(striped.path, AutoPath::kStriped) << c.name << ": " << striped.reason;
    EXPECT_GE(striped.streams, 2) << c.name;
  }
  EXPECT_EQ(checked, 3);
}

// The store needs more round trips than inline and moves every byte both
// over the link (at most at the aggregate) and through the store (at its
// write rate). Where the slower of the two is at most kMargin times one
// stream, it can never be kMargin times faster than inline, at any size.
TEST(AutoPolicyUnfittedLinks, TheStoreNeverWinsWhereItCannotMoveBytesFaster) {
  int checked = 0;
  for (const LinkClass& c : kLinks) {
    const LinkEstimate l = Estimate(c);
    if (std::min(l.aggregate_Bps, kStoreLocalBps) > kMargin * l.one_stream_Bps) continue;
    ++checked;
    for (int streams : {1, 16}) {
      const AutoPolicyOptions o = Options(streams);
      EXPECT_EQ(StoreThresholdBytes(l, o), UINT64_MAX) << c.name;
      for (uint64_t bytes : {uint64_t{1} << 30, uint64_t{1} << 40}) {
        const AutoChoice choice = Choose(l, bytes, o);
        EXPECT_NE(choice.path, AutoPath::kStore) << c.name << ": " << choice.reason;
      }
    }
  }
  EXPECT_EQ(checked, 3) << "datacenter, metro and dsl";
}

// Striping off (the router's default). Lower bound: with at least one
// round trip more than inline and its bytes no faster than the aggregate,
// the store is not faster at all while RTT + S / r1 < 2 RTT + S / rA.
// Upper bound: a store path of at most 4 round trips (stub, upload
// request, ranged GET, one spare) plus S / local + S / rA (rA within its 32
// connections' reach) is beaten by kMargin from
// S = (4 kMargin - 1) RTT / (1 / r1 - kMargin / local - kMargin / rA).
TEST(AutoPolicyUnfittedLinks, TheCrossoverLiesBetweenRoundTripBounds) {
  int checked = 0;
  for (const LinkClass& c : kLinks) {
    const double gain = c.aggregate_MBps / c.one_MBps;
    if (gain < 20) continue;
    ++checked;
    const AutoPolicyOptions o = Options(1);
    ASSERT_LE(gain, o.store_connections) << c.name;
    const LinkEstimate l = Estimate(c);
    const double r1 = l.one_stream_Bps, ra = l.aggregate_Bps;
    const double lo = c.rtt_s / (1 / r1 - 1 / ra);
    const double per_byte = 1 / r1 - kMargin / kStoreLocalBps - kMargin / ra;
    ASSERT_GT(per_byte, 0) << c.name;
    const double hi = (4 * kMargin - 1) * c.rtt_s / per_byte;
    ASSERT_LT(hi, 5 * lo) << c.name << ": bounds too loose to mean anything";

    const uint64_t t = StoreThresholdBytes(l, o);
    EXPECT_GT(static_cast<double>(t), lo) << c.name;
    EXPECT_LE(static_cast<double>(t), hi) << c.name;
    EXPECT_EQ(Choose(l, static_cast<uint64_t>(lo), o).path, AutoPath::kInline) << c.name;
    EXPECT_EQ(Choose(l, static_cast<uint64_t>(std::ceil(hi)), o).path, AutoPath::kStore) << c.name;
  }
  EXPECT_EQ(checked, 3);
}

// A slower link never makes inline more attractive against the store:
// - one stream at half the rate, the aggregate unchanged: inline pays the
//   whole loss, the store's connections at most their share of it;
// - the same link farther away (round trip x a, window-bound rates / a):
//   everything inline pays scales by a, the store's local work does not.
// So inline's predicted time over the store's never falls, and with
// striping off a store choice stays one. Nor does a bigger message, which
// only adds bytes, where the store is cheaper per byte once it wins.
TEST(AutoPolicyUnfittedLinks, ASlowerLinkOrABiggerMessageNeverFavoursInline) {
  const uint64_t sizes[] = {64 << 10, 4 << 20, 64 << 20, uint64_t{1} << 30};
  for (const LinkClass& c : kLinks) {
    const LinkEstimate base = Estimate(c);
    for (int streams : {1, 16}) {
      const AutoPolicyOptions o = Options(streams);
      const bool striping_off = streams == 1;
      for (uint64_t bytes : sizes) {
        // Along a sequence of ever slower links: inline over store never
        // falls, and (striping off) a store choice stays one.
        auto expect_never_favours_inline = [&](const std::vector<LinkEstimate>& slower,
                                               const char* how) {
          double last = 0;
          bool was_store = false;
          for (size_t i = 0; i < slower.size(); ++i) {
            const AutoChoice choice = Choose(slower[i], bytes, o);
            const double ratio = choice.inline_s / choice.store_s;
            EXPECT_GE(ratio, last * (1 - 1e-12)) << c.name << ", " << how << " step " << i;
            if (striping_off && was_store) {
              EXPECT_EQ(choice.path, AutoPath::kStore) << c.name << ": " << choice.reason;
            }
            last = ratio;
            was_store = choice.path == AutoPath::kStore;
          }
        };
        std::vector<LinkEstimate> halved, farther;
        for (int halvings = 0; halvings < 8; ++halvings) {
          halved.push_back(Estimate(base.rtt_s, base.one_stream_Bps / std::ldexp(1.0, halvings),
                                    base.aggregate_Bps));
        }
        for (double a : {1.0, 2.0, 4.0, 8.0}) {
          farther.push_back(
              Estimate(base.rtt_s * a, base.one_stream_Bps / a, base.aggregate_Bps / a));
        }
        expect_never_favours_inline(halved, "one stream halved");
        expect_never_favours_inline(farther, "round trip doubled");
      }
      bool was_store = false;
      for (uint64_t bytes = 1 << 10; bytes <= (uint64_t{1} << 32); bytes *= 2) {
        const AutoChoice choice = Choose(base, bytes, o);
        if (was_store) {
          EXPECT_EQ(choice.path, AutoPath::kStore) << c.name << ", " << bytes;
        }
        was_store = choice.path == AutoPath::kStore;
      }
    }
  }
}

}  // namespace
}  // namespace xsilo
