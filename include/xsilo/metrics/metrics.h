// Metrics an operator scrapes: counters and gauges with labels, kept in an
// explicit Registry and rendered in the Prometheus text exposition format
// 0.0.4 (docs/metrics.md). No dependency beyond the standard library.
//
// Thread model: every method of Counter, Gauge and Registry is thread-safe.
// A Counter or Gauge reference returned by the Registry stays valid for the
// Registry's lifetime; updating one is a single atomic operation, so hot
// paths (a transport's send completion) take no lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace xsilo::metrics {

// Label name -> value, rendered in name order.
using Labels = std::map<std::string, std::string>;

// A monotonically increasing integer (bytes, messages, errors).
class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down (a round number, a throughput estimate).
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double d);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

enum class MetricType { kCounter, kGauge };

// One sample of a collected family.
struct Sample {
  Labels labels;
  double value = 0;
};

class Registry {
 public:
  // The counter or gauge of family `name` with `labels`, created on first
  // use. `help` is kept from the family's first registration. A name or
  // label name that is not a valid Prometheus name, or a name already used
  // by a family of the other type, is a programming error: it throws
  // std::invalid_argument.
  Counter& GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  // A counter with a fractional value (seconds summed): a Gauge only ever
  // Add()ed to with d >= 0, rendered as TYPE counter.
  Gauge& GetFloatCounter(const std::string& name, const std::string& help,
                         const Labels& labels = {});

  // A family whose samples are read at render time from `collect` (for
  // values another component already keeps, e.g. the FL state timers).
  // `collect` runs under the registry's lock: keep it short and never call
  // back into the registry. Returns an id for RemoveCollector; remove it
  // before whatever `collect` reads goes away.
  int AddCollector(const std::string& name, const std::string& help, MetricType type,
                   std::function<std::vector<Sample>()> collect);
  void RemoveCollector(int id);

  // Every family, sorted by name, as Prometheus text format 0.0.4.
  std::string Render() const;

 private:
  struct Family {
    std::string help;
    MetricType type = MetricType::kCounter;
    std::map<Labels, std::unique_ptr<Counter>> counters;
    std::map<Labels, std::unique_ptr<Gauge>> gauges;
    std::map<int, std::function<std::vector<Sample>()>> collectors;
  };
  Family& FamilyFor(const std::string& name, const std::string& help, MetricType type,
                    const Labels& labels);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
  std::map<int, std::string> collector_family_;
  int next_collector_ = 1;
};

// Text-format pieces, for tests and for other renderers.
bool IsValidMetricName(const std::string& name);
bool IsValidLabelName(const std::string& name);
// Escapes \, " and newline as the format wants inside a label value.
std::string EscapeLabelValue(const std::string& value);
// Escapes \ and newline as the format wants in a HELP line.
std::string EscapeHelp(const std::string& help);
// Integers without a fraction, others shortest-exact; NaN, +Inf, -Inf.
std::string FormatValue(double value);
// `name{a="x",b="y"}` (just `name` without labels).
std::string FormatSeries(const std::string& name, const Labels& labels);

}  // namespace xsilo::metrics
