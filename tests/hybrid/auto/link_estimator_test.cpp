// The link estimator on synthetic samples; time is passed in, never read.
#include <gtest/gtest.h>

#include <cmath>

#include "hybrid/auto/auto_policy.h"
#include "hybrid/auto/link_estimator.h"

namespace xsilo {
namespace {

using Clock = LinkEstimator::Clock;

Clock::time_point At(double seconds) {
  return Clock::time_point{} +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

constexpr uint64_t kMB = 1000000;

TEST(LinkEstimator, EmptyKnowsNothing) {
  LinkEstimator e;
  LinkEstimate l = e.estimate();
  EXPECT_EQ(l.samples, 0);
  EXPECT_EQ(e.RemeasureReason(At(0)), "no round trip measured yet");
  EXPECT_EQ(e.changes(), 0);
  AutoRequest r;
  r.bytes = 1 << 20;
  EXPECT_EQ(ChooseAutoPath(l, r).path, AutoPath::kInline);
}

TEST(LinkEstimator, RoundTripIsSmoothed) {
  LinkEstimator e;
  e.AddRtt(At(0), 0.100);
  EXPECT_DOUBLE_EQ(e.estimate().rtt_s, 0.100);
  e.AddRtt(At(1), 0.180);  // within a factor 2: smoothed in with gain 1/8
  EXPECT_DOUBLE_EQ(e.estimate().rtt_s, 0.110);
  EXPECT_EQ(e.estimate().samples, 2);
  EXPECT_EQ(e.RemeasureReason(At(1)), "no parallel probe yet");
}

TEST(LinkEstimator, BadRoundTripsAreIgnored) {
  LinkEstimator e;
  e.AddRtt(At(0), std::nan(""));
  e.AddRtt(At(0), -0.1);
  e.AddRtt(At(0), INFINITY);
  EXPECT_EQ(e.estimate().samples, 0);
  e.AddRtt(At(0), 0);  // loopback
  EXPECT_EQ(e.estimate().samples, 1);
  EXPECT_EQ(e.estimate().rtt_s, 0);
}

TEST(LinkEstimator, TransferRateLeavesOutTheRoundTrip) {
  LinkEstimator e;
  e.AddRtt(At(0), 0.1);
  // 10 MB in 1.1 s, of which one round trip: 10 MB/s.
  EXPECT_TRUE(e.AddTransfer(At(1), 10 * kMB, 1.1, 1));
  EXPECT_DOUBLE_EQ(e.estimate().one_stream_Bps, 10e6);
  EXPECT_TRUE(e.AddTransfer(At(2), 40 * kMB, 0.3, 8));
  EXPECT_DOUBLE_EQ(e.estimate().aggregate_Bps, 200e6);
  EXPECT_EQ(e.estimate().aggregate_streams, 8);
  EXPECT_EQ(e.RemeasureReason(At(2)), "");
}

TEST(LinkEstimator, WithoutRoundTripTheWholeDurationCounts) {
  LinkEstimator e;
  EXPECT_TRUE(e.AddTransfer(At(0), 10 * kMB, 2, 1));
  LinkEstimate l = e.estimate();
  EXPECT_DOUBLE_EQ(l.one_stream_Bps, 5e6);
  EXPECT_LT(l.rtt_s, 0) << "unknown";
  EXPECT_EQ(l.samples, 1);
}

TEST(LinkEstimator, UninformativeTransfersAreRefused) {
  LinkEstimator e;
  e.AddRtt(At(0), 0.1);
  EXPECT_FALSE(e.AddTransfer(At(1), 100 << 10, 1, 1)) << "below 256 KiB";
  EXPECT_FALSE(e.AddTransfer(At(1), 10 * kMB, 0.15, 1)) << "under two round trips";
  EXPECT_FALSE(e.AddTransfer(At(1), 10 * kMB, std::nan(""), 1));
  EXPECT_FALSE(e.AddTransfer(At(1), 10 * kMB, 0, 1));
  EXPECT_FALSE(e.AddTransfer(At(1), 10 * kMB, -1, 1));
  EXPECT_FALSE(e.AddTransfer(At(1), 10 * kMB, 1, 0)) << "no streams";
  EXPECT_EQ(e.estimate().one_stream_Bps, 0);
  EXPECT_EQ(e.estimate().samples, 1);
}

TEST(LinkEstimator, SizesAbove32BitsAreExact) {
  LinkEstimator e;
  e.AddRtt(At(0), 0.1);
  const uint64_t bytes = 5ull << 30;  // 5 GiB
  EXPECT_TRUE(e.AddTransfer(At(1), bytes, 10.1, 1));
  EXPECT_NEAR(e.estimate().one_stream_Bps, static_cast<double>(bytes) / 10, 1);
}

TEST(LinkEstimator, LoneOutlierIsNotSmoothedIn) {
  LinkEstimator e;
  e.AddRtt(At(0), 0.1);
  for (int i = 0; i < 3; ++i) e.AddTransfer(At(1), 10 * kMB, 1.1, 1);  // 10 MB/s, trusted
  for (double s : {0.2, 4.1}) {  // 100 MB/s and 2.5 MB/s: each departs alone
    e.AddTransfer(At(2), 10 * kMB, s, 1);
    EXPECT_DOUBLE_EQ(e.estimate().one_stream_Bps, 10e6) << s;
  }
  e.AddTransfer(At(3), 12 * kMB, 1.1, 1);  // 12 MB/s: smoothed in
  EXPECT_DOUBLE_EQ(e.estimate().one_stream_Bps, 10.5e6);
  EXPECT_EQ(e.changes(), 0);
}

// A young throughput figure (fewer than change_samples samples) and a
// much faster sample: noise only slows a transfer, so the first
// measurement was the slowed one and the faster sample replaces it at once.
TEST(LinkEstimator, AFasterSampleReplacesAYoungFigure) {
  LinkEstimator e;
  e.AddRtt(At(0), 0.1);
  e.AddTransfer(At(1), 10 * kMB, 4.1, 1);  // 2.5 MB/s: a slowed probe
  e.AddTransfer(At(2), 10 * kMB, 1.1, 1);  // 10 MB/s
  EXPECT_DOUBLE_EQ(e.estimate().one_stream_Bps, 10e6);
  EXPECT_EQ(e.estimate().one_stream_samples, 2);
  EXPECT_EQ(e.changes(), 0);
  EXPECT_EQ(e.RemeasureReason(At(2)), kNoParallelProbe);
  // The same for the aggregate figure.
  e.AddTransfer(At(3), 40 * kMB, 2.1, 8);  // 20 MB/s
  e.AddTransfer(At(4), 40 * kMB, 0.3, 8);  // 200 MB/s
  EXPECT_DOUBLE_EQ(e.estimate().aggregate_Bps, 200e6);
  EXPECT_EQ(e.changes(), 0);
}

TEST(LinkEstimator, SustainedDepartureIsAChange) {
  LinkEstimator e;
  e.AddRtt(At(0), 0.1);
  e.AddTransfer(At(1), 40 * kMB, 0.3, 8);                                  // aggregate 200 MB/s
  for (int i = 0; i < 5; ++i) e.AddTransfer(At(2 + i), 10 * kMB, 1.1, 1);  // 10 MB/s
  EXPECT_EQ(e.RemeasureReason(At(7)), "");
  // The link slows to 2.5 MB/s: three departing samples in a row.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(e.changes(), 0);
    e.AddTransfer(At(10 + i), 10 * kMB, 4.1, 1);
  }
  EXPECT_EQ(e.changes(), 1);
  EXPECT_DOUBLE_EQ(e.estimate().one_stream_Bps, 2.5e6) << "restarts from the new samples";
  EXPECT_EQ(e.RemeasureReason(At(13)), "one-stream throughput changed from 10 to 2.5 MB/s");
  e.AcknowledgeChange();
  EXPECT_EQ(e.RemeasureReason(At(13)), "");
  EXPECT_EQ(e.changes(), 1);
}

// A young throughput figure that three slower transfers in a row depart
// from is replaced like any figure, but that corrects a bad first
// measurement: it is no change of the link and asks for no new one.
TEST(LinkEstimator, AYoungFigureIsCorrectedWithoutAChange) {
  LinkEstimator e;
  e.AddRtt(At(0), 0.1);
  e.AddTransfer(At(1), 40 * kMB, 0.3, 8);   // aggregate 200 MB/s
  e.AddTransfer(At(2), 10 * kMB, 0.35, 1);  // one stream 40 MB/s: one sample
  for (int i = 0; i < 3; ++i) e.AddTransfer(At(3 + i), 10 * kMB, 1.1, 1);  // 10 MB/s
  EXPECT_DOUBLE_EQ(e.estimate().one_stream_Bps, 10e6);
  EXPECT_EQ(e.estimate().one_stream_samples, 3);
  EXPECT_EQ(e.changes(), 0);
  EXPECT_EQ(e.RemeasureReason(At(6)), "");
  // Trusted now: the same departure is a change.
  for (int i = 0; i < 3; ++i) e.AddTransfer(At(7 + i), 10 * kMB, 4.1, 1);
  EXPECT_EQ(e.changes(), 1);
  EXPECT_DOUBLE_EQ(e.estimate().one_stream_Bps, 2.5e6);
}

TEST(LinkEstimator, DeparturesOnBothSidesAreNoChange) {
  LinkEstimator e;
  e.AddRtt(At(0), 0.1);
  for (int i = 0; i < 3; ++i) e.AddTransfer(At(1), 10 * kMB, 1.1, 1);  // 10 MB/s, trusted
  for (double s : {0.2, 4.1, 0.2, 4.1, 0.2, 4.1}) e.AddTransfer(At(2), 10 * kMB, s, 1);
  EXPECT_EQ(e.changes(), 0);
  EXPECT_DOUBLE_EQ(e.estimate().one_stream_Bps, 10e6);
}

TEST(LinkEstimator, RoundTripChangeAsksForRemeasure) {
  LinkEstimatorOptions o;
  o.change_samples = 2;
  LinkEstimator e(o);
  e.AddRtt(At(0), 0.010);
  e.AddTransfer(At(0), 40 * kMB, 0.3, 8);
  e.AddRtt(At(1), 0.100);
  EXPECT_EQ(e.changes(), 0);
  e.AddRtt(At(2), 0.120);
  EXPECT_EQ(e.changes(), 1);
  EXPECT_DOUBLE_EQ(e.estimate().rtt_s, 0.110);
  EXPECT_EQ(e.RemeasureReason(At(2)),
            "round trip changed from 10 to 110 ms (a new path: throughput to be measured again)");
  // The aggregate was measured on the old path: dropped.
  EXPECT_EQ(e.estimate().aggregate_Bps, 0);
  EXPECT_EQ(e.estimate().aggregate_streams, 0);
  EXPECT_EQ(e.path_changes(), 1);
}

// A round trip that moves by less than path_change_rtt_s (loopback under
// load: 0.05 to 0.5 ms; a 2 ms link read 6 ms through busy parties) is a
// change of the figure, not a new path: the throughput figures stay.
TEST(LinkEstimator, ASmallRoundTripChangeKeepsTheThroughput) {
  LinkEstimator e;
  e.AddRtt(At(0), 0.00005);
  e.AddTransfer(At(0), 100 * kMB, 0.05, 1);  // 2 GB/s
  e.AddTransfer(At(0), 100 * kMB, 0.04, 8);
  for (int i = 1; i <= 3; ++i) e.AddRtt(At(i), 0.0005);
  EXPECT_EQ(e.changes(), 1);
  for (int i = 1; i <= 3; ++i) e.AddRtt(At(i), 0.006);
  EXPECT_EQ(e.changes(), 2);
  EXPECT_EQ(e.path_changes(), 0);
  EXPECT_GT(e.estimate().one_stream_Bps, 0);
  EXPECT_GT(e.estimate().aggregate_Bps, 0);
  // From LAN to a 83 ms link: a new path.
  for (int i = 4; i <= 6; ++i) e.AddRtt(At(i), 0.083);
  EXPECT_EQ(e.path_changes(), 1);
  EXPECT_EQ(e.estimate().one_stream_Bps, 0);
  EXPECT_EQ(e.estimate().aggregate_Bps, 0);
  EXPECT_NEAR(e.estimate().rtt_s, 0.083, 1e-9);
}

TEST(LinkEstimator, StaleEstimateAsksForRemeasure) {
  LinkEstimator e;
  e.AddRtt(At(0), 0.1);
  e.AddTransfer(At(5), 40 * kMB, 0.3, 8);
  EXPECT_EQ(e.RemeasureReason(At(5 + 600)), "");
  EXPECT_EQ(e.RemeasureReason(At(5 + 601)), "no sample for 601 s");
  e.AddRtt(At(700), 0.1);
  EXPECT_EQ(e.RemeasureReason(At(701)), "");
}

TEST(LinkEstimator, FeedsThePolicy) {
  // A long fat link seen through samples: 150 ms RTT, one stream 8 MB/s,
  // a 16-stream probe at 200 MB/s.
  LinkEstimator e;
  for (int i = 0; i < 4; ++i) e.AddRtt(At(i), 0.150);
  e.AddTransfer(At(5), 8 * kMB, 1.15, 1);
  e.AddTransfer(At(6), 60 * kMB, 0.45, 16);
  LinkEstimate l = e.estimate();
  EXPECT_EQ(StripeStreams(l), 16) << "ceil(200 / 8) = 25, capped";
  AutoRequest r;
  r.store_available = true;
  r.bytes = 64 << 10;
  EXPECT_EQ(ChooseAutoPath(l, r).path, AutoPath::kInline);
  r.bytes = 1ull << 30;
  EXPECT_EQ(ChooseAutoPath(l, r).path, AutoPath::kStore);
}

}  // namespace
}  // namespace xsilo
