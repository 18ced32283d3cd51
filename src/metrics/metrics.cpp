#include "xsilo/metrics/metrics.h"

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace xsilo::metrics {

namespace {

bool NameChar(char c, bool first, bool colon) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return true;
  if (colon && c == ':') return true;
  return !first && c >= '0' && c <= '9';
}

bool ValidName(const std::string& name, bool colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!NameChar(name[i], i == 0, colon)) return false;
  }
  return true;
}

const char* TypeName(MetricType type) { return type == MetricType::kCounter ? "counter" : "gauge"; }

}  // namespace

void Gauge::Add(double d) {
  double old = value_.load(std::memory_order_relaxed);
  while (!value_.compare_exchange_weak(old, old + d, std::memory_order_relaxed)) {
  }
}

bool IsValidMetricName(const std::string& name) { return ValidName(name, true); }

bool IsValidLabelName(const std::string& name) {
  // Names starting with "__" are reserved for Prometheus itself.
  return ValidName(name, false) && name.rfind("__", 0) != 0;
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, value);  // shortest round-trip form
  return std::string(buf, res.ptr);
}

std::string FormatSeries(const std::string& name, const Labels& labels) {
  if (labels.empty()) return name;
  std::string out = name + "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ",";
    first = false;
    out += k + "=\"" + EscapeLabelValue(v) + "\"";
  }
  return out + "}";
}

Registry::Family& Registry::FamilyFor(const std::string& name, const std::string& help,
                                      MetricType type, const Labels& labels) {
  if (!IsValidMetricName(name)) throw std::invalid_argument("bad metric name '" + name + "'");
  for (const auto& [k, v] : labels) {
    if (!IsValidLabelName(k)) throw std::invalid_argument("bad label name '" + k + "'");
  }
  auto [it, inserted] = families_.try_emplace(name);
  Family& f = it->second;
  if (inserted) {
    f.help = help;
    f.type = type;
  } else if (f.type != type) {
    throw std::invalid_argument("metric '" + name + "' is already a " + TypeName(f.type));
  }
  return f;
}

Counter& Registry::GetCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = FamilyFor(name, help, MetricType::kCounter, labels);
  if (!f.gauges.empty()) {
    throw std::invalid_argument("metric '" + name + "' already holds fractional counters");
  }
  auto& slot = f.counters[labels];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& Registry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = FamilyFor(name, help, MetricType::kGauge, labels);
  auto& slot = f.gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Gauge& Registry::GetFloatCounter(const std::string& name, const std::string& help,
                                 const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = FamilyFor(name, help, MetricType::kCounter, labels);
  if (!f.counters.empty()) {
    throw std::invalid_argument("metric '" + name + "' already holds integer counters");
  }
  auto& slot = f.gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

int Registry::AddCollector(const std::string& name, const std::string& help, MetricType type,
                           std::function<std::vector<Sample>()> collect) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = FamilyFor(name, help, type, {});
  const int id = next_collector_++;
  f.collectors[id] = std::move(collect);
  collector_family_[id] = name;
  return id;
}

void Registry::RemoveCollector(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = collector_family_.find(id);
  if (it == collector_family_.end()) return;
  auto f = families_.find(it->second);
  if (f != families_.end()) f->second.collectors.erase(id);
  collector_family_.erase(it);
}

std::string Registry::Render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    // Collected samples first, so that a family whose collector returns
    // nothing (and has no fixed series) is left out entirely.
    std::map<Labels, double> collected;
    for (const auto& [id, collect] : f.collectors) {
      for (auto& s : collect()) {
        for (const auto& [k, v] : s.labels) {
          if (!IsValidLabelName(k)) throw std::invalid_argument("bad label name '" + k + "'");
        }
        collected[s.labels] += s.value;
      }
    }
    if (f.counters.empty() && f.gauges.empty() && collected.empty()) continue;
    out += "# HELP " + name + " " + EscapeHelp(f.help) + "\n";
    out += "# TYPE " + name + " " + TypeName(f.type) + "\n";
    for (const auto& [labels, c] : f.counters) {
      out += FormatSeries(name, labels) + " " + std::to_string(c->value()) + "\n";
    }
    for (const auto& [labels, g] : f.gauges) {
      out += FormatSeries(name, labels) + " " + FormatValue(g->value()) + "\n";
    }
    for (const auto& [labels, v] : collected) {
      out += FormatSeries(name, labels) + " " + FormatValue(v) + "\n";
    }
  }
  return out;
}

}  // namespace xsilo::metrics
