#include "hybrid/auto/link_estimator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace xsilo {

const char* const kNoParallelProbe = "no parallel probe yet";

LinkEstimator::LinkEstimator(LinkEstimatorOptions options) : options_(options) {
  options_.change_factor =
      std::isfinite(options_.change_factor) ? std::max(options_.change_factor, 1.0) : 2.0;
  options_.change_samples = std::max(options_.change_samples, 1);
}

bool LinkEstimator::Add(Figure* f, double x, double gain, bool young_rules) {
  if (f->samples == 0) {
    f->value = x;
    f->samples = 1;
    return false;
  }
  const double factor = options_.change_factor;
  const int side = x >= f->value * factor ? 1 : (x <= f->value / factor ? -1 : 0);
  const bool young = young_rules && f->samples < options_.change_samples;
  if (side > 0 && young) {
    // Noise on a shared machine only slows a transfer down: a much faster
    // sample says the few before it were slowed, not that the link sped up.
    f->value = x;
    ++f->samples;
    f->departing.clear();
    f->departing_side = 0;
    return false;
  }
  if (side == 0) {
    f->departing.clear();
    f->value += std::clamp(gain, 0.0, 1.0) * (x - f->value);
    ++f->samples;
    return false;
  }
  if (side != f->departing_side) f->departing.clear();
  f->departing_side = side;
  f->departing.push_back(x);
  if (static_cast<int>(f->departing.size()) < options_.change_samples) return false;
  f->value = std::accumulate(f->departing.begin(), f->departing.end(), 0.0) /
             static_cast<double>(f->departing.size());
  f->samples = static_cast<int>(f->departing.size());
  f->departing.clear();
  f->departing_side = 0;
  // A young figure replaced was a bad first measurement (a slow probe), not
  // a link that changed: corrected, and nothing to measure again.
  return !young;
}

void LinkEstimator::NoteChange(const char* what, double before, double after, const char* unit,
                               double scale) {
  char text[160];
  std::snprintf(text, sizeof text, "%s changed from %.3g to %.3g %s", what, before * scale,
                after * scale, unit);
  change_ = text;
  ++changes_;
}

void LinkEstimator::AddRtt(Clock::time_point at, double rtt_s) {
  if (!std::isfinite(rtt_s) || rtt_s < 0) return;
  any_sample_ = true;
  last_sample_ = std::max(last_sample_, at);
  const double before = rtt_.value;
  if (!Add(&rtt_, rtt_s, options_.rtt_gain)) return;
  NoteChange("round trip", before, rtt_.value, "ms", 1e3);
  if (std::fabs(rtt_.value - before) >= options_.path_change_rtt_s) {
    // A new path: what was measured on the old one says nothing about it.
    one_stream_ = Figure();
    aggregate_ = Figure();
    aggregate_streams_ = 0;
    ++path_changes_;
    change_ += " (a new path: throughput to be measured again)";
  }
}

bool LinkEstimator::AddTransfer(Clock::time_point at, uint64_t bytes, double seconds, int streams) {
  if (streams < 1 || !std::isfinite(seconds) || seconds <= 0 ||
      bytes < std::max<uint64_t>(options_.min_transfer_bytes, 1)) {
    return false;
  }
  double byte_seconds = seconds;
  if (rtt_.samples > 0) {
    // Mostly latency: the bytes' share of the time is too small to measure.
    if (seconds < options_.min_transfer_rtts * rtt_.value) return false;
    byte_seconds = seconds - std::max(options_.transfer_round_trips, 0.0) * rtt_.value;
    if (byte_seconds <= 0) return false;
  }
  const double rate = static_cast<double>(bytes) / byte_seconds;
  if (!std::isfinite(rate) || rate <= 0) return false;
  any_sample_ = true;
  last_sample_ = std::max(last_sample_, at);
  Figure& figure = streams == 1 ? one_stream_ : aggregate_;
  const double before = figure.value;
  const bool changed = Add(&figure, rate, options_.rate_gain, /*young_rules=*/true);
  if (streams > 1 && figure.departing.empty()) aggregate_streams_ = streams;
  if (changed) {
    NoteChange(streams == 1 ? "one-stream throughput" : "aggregate throughput", before,
               figure.value, "MB/s", 1e-6);
  }
  return true;
}

LinkEstimate LinkEstimator::estimate() const {
  LinkEstimate e;
  e.samples = rtt_.samples + one_stream_.samples + aggregate_.samples;
  e.rtt_s = rtt_.samples > 0 ? rtt_.value : -1;
  e.one_stream_Bps = one_stream_.samples > 0 ? one_stream_.value : 0;
  e.aggregate_Bps = aggregate_.samples > 0 ? aggregate_.value : 0;
  e.aggregate_streams = aggregate_.samples > 0 ? aggregate_streams_ : 0;
  e.one_stream_samples = one_stream_.samples;
  e.aggregate_samples = aggregate_.samples;
  return e;
}

std::string LinkEstimator::RemeasureReason(Clock::time_point now) const {
  if (!change_.empty()) return change_;
  if (rtt_.samples == 0) return "no round trip measured yet";
  if (any_sample_ && now - last_sample_ > options_.max_age) {
    const auto idle = std::chrono::duration_cast<std::chrono::seconds>(now - last_sample_);
    return "no sample for " + std::to_string(idle.count()) + " s";
  }
  if (aggregate_.samples == 0) return kNoParallelProbe;
  return "";
}

void LinkEstimator::AcknowledgeChange() { change_.clear(); }

}  // namespace xsilo
