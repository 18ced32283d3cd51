#include "xsilo/metrics/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

namespace xsilo::metrics {
namespace {

TEST(MetricsFormat, ValidNames) {
  EXPECT_TRUE(IsValidMetricName("xsilo_bytes_total"));
  EXPECT_TRUE(IsValidMetricName("job:rate5m"));
  EXPECT_TRUE(IsValidMetricName("_x1"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("1x"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_FALSE(IsValidMetricName("a b"));
  EXPECT_TRUE(IsValidLabelName("peer"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
  EXPECT_FALSE(IsValidLabelName("__name__"));
  EXPECT_FALSE(IsValidLabelName("9"));
}

TEST(MetricsFormat, Escapes) {
  EXPECT_EQ(EscapeLabelValue(R"(a"b\c)"
                             "\nd"),
            R"(a\"b\\c\nd)");
  EXPECT_EQ(EscapeHelp("x\\y\n\"z\""), "x\\\\y\\n\"z\"");
}

TEST(MetricsFormat, Values) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(42), "42");
  EXPECT_EQ(FormatValue(-3), "-3");
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(1e21), "1e+21");
  EXPECT_EQ(std::stod(FormatValue(0.1)), 0.1);  // round-trips
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
}

TEST(MetricsFormat, Series) {
  EXPECT_EQ(FormatSeries("m", {}), "m");
  EXPECT_EQ(FormatSeries("m", {{"z", "1"}, {"a", "x\"y"}}), R"(m{a="x\"y",z="1"})");
}

TEST(Registry, RendersFamiliesSortedWithHelpAndType) {
  Registry r;
  r.GetCounter("xsilo_b_total", "B things.", {{"peer", "1"}}).Add(5);
  r.GetCounter("xsilo_b_total", "ignored: first help wins", {{"peer", "2"}}).Add();
  r.GetGauge("xsilo_a", "An A\nwith a newline.").Set(1.5);
  r.GetFloatCounter("xsilo_c_seconds_total", "C seconds.").Add(0.5);
  EXPECT_EQ(r.Render(),
            "# HELP xsilo_a An A\\nwith a newline.\n"
            "# TYPE xsilo_a gauge\n"
            "xsilo_a 1.5\n"
            "# HELP xsilo_b_total B things.\n"
            "# TYPE xsilo_b_total counter\n"
            "xsilo_b_total{peer=\"1\"} 5\n"
            "xsilo_b_total{peer=\"2\"} 1\n"
            "# HELP xsilo_c_seconds_total C seconds.\n"
            "# TYPE xsilo_c_seconds_total counter\n"
            "xsilo_c_seconds_total 0.5\n");
}

TEST(Registry, SameLabelsSameSeries) {
  Registry r;
  Counter& a = r.GetCounter("x_total", "", {{"k", "v"}});
  Counter& b = r.GetCounter("x_total", "", {{"k", "v"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &r.GetCounter("x_total", "", {{"k", "w"}}));
}

TEST(Registry, RejectsBadNamesAndTypeClashes) {
  Registry r;
  EXPECT_THROW(r.GetCounter("bad-name", ""), std::invalid_argument);
  EXPECT_THROW(r.GetCounter("ok", "", {{"bad-label", "v"}}), std::invalid_argument);
  r.GetCounter("x_total", "");
  EXPECT_THROW(r.GetGauge("x_total", ""), std::invalid_argument);
  EXPECT_THROW(r.GetFloatCounter("x_total", ""), std::invalid_argument);
}

TEST(Registry, LargeCountersStayExact) {
  Registry r;
  r.GetCounter("big_total", "").Add((1ull << 60) + 1);
  EXPECT_NE(r.Render().find("big_total 1152921504606846977\n"), std::string::npos);
}

TEST(Registry, CollectorsAreReadAtRenderAndRemovable) {
  Registry r;
  double v = 1;
  int id = r.AddCollector("xsilo_state_seconds_total", "Per state.", MetricType::kCounter, [&] {
    return std::vector<Sample>{{{{"state", "train"}}, v}, {{{"state", "wait"}}, 2 * v}};
  });
  v = 3;
  std::string text = r.Render();
  EXPECT_NE(text.find("# TYPE xsilo_state_seconds_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("xsilo_state_seconds_total{state=\"train\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("xsilo_state_seconds_total{state=\"wait\"} 6\n"), std::string::npos);
  r.RemoveCollector(id);
  EXPECT_EQ(r.Render(), "");  // a family with no series is left out
  r.RemoveCollector(id);      // idempotent
}

TEST(Registry, ConcurrentUpdatesAndRendersAddUp) {
  Registry r;
  constexpr int kThreads = 4, kAdds = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&r, t] {
      for (int i = 0; i < kAdds; ++i) {
        r.GetCounter("n_total", "", {{"t", std::to_string(t % 2)}}).Add();
        r.GetGauge("g", "").Add(1);
        if (i % 5000 == 0) (void)r.Render();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(r.GetCounter("n_total", "", {{"t", "0"}}).value() +
                r.GetCounter("n_total", "", {{"t", "1"}}).value(),
            uint64_t{kThreads} * kAdds);
  EXPECT_EQ(r.GetGauge("g", "").value(), double{kThreads} * kAdds);
}

}  // namespace
}  // namespace xsilo::metrics
