#include "hybrid/auto/auto_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace xsilo {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

bool Positive(double x) { return std::isfinite(x) && x > 0; }

// How much of the link is known.
enum class Knowledge {
  kNone,     // nothing measured
  kRttOnly,  // a round trip, no usable throughput pair yet
  kFull,     // round trip, one-stream and aggregate goodput
};

Knowledge Classify(const LinkEstimate& link) {
  if (link.samples <= 0 || !std::isfinite(link.rtt_s) || link.rtt_s < 0) return Knowledge::kNone;
  if (!Positive(link.one_stream_Bps) || !Positive(link.aggregate_Bps)) return Knowledge::kRttOnly;
  return Knowledge::kFull;
}

// A path's predicted time: fixed seconds plus seconds per byte.
struct Cost {
  double fixed_s = 0;
  double per_byte_s = kInfinity;
  double At(double bytes) const { return bytes > 0 ? fixed_s + bytes * per_byte_s : fixed_s; }
};

struct Costs {
  int streams = 1;  // K; striped is a candidate when > 1
  Cost inline_path, striped, store;
};

// Only for a kFull link.
Costs Predict(const LinkEstimate& link, int receivers, const AutoPolicyOptions& o) {
  Costs c;
  const double rtt = link.rtt_s;
  const double one = link.one_stream_Bps;
  const double aggregate = std::max(link.aggregate_Bps, one);  // a noisy probe is no loss
  const double window_rate =
      o.window_bytes > 0 && rtt > 0 ? static_cast<double>(o.window_bytes) / rtt : kInfinity;
  // Copies of an inline or striped broadcast share the sender's egress.
  const double per_copy =
      Positive(o.sender_egress_Bps) ? o.sender_egress_Bps / std::max(receivers, 1) : kInfinity;
  const double inline_fixed = std::max(o.inline_round_trips, 0.0) * rtt;

  c.inline_path = {inline_fixed, 1 / std::min({one, window_rate, per_copy})};
  c.streams = StripeStreams(link, o);
  if (c.streams > 1) {
    const double striped = std::min({c.streams * one, aggregate, window_rate, per_copy});
    c.striped = {inline_fixed, 1 / striped};
  }
  const double store_link = std::min(aggregate, std::max(o.store_connections, 1) * one);
  const double local = Positive(o.store_local_Bps) ? 1 / o.store_local_Bps : 0;
  c.store = {std::max(o.store_round_trips, 0.0) * rtt, local + 1 / store_link};
  return c;
}

// The rule of ChooseAutoPath on predicted seconds: the simplest path unless
// a more complex one is `margin` times faster than every simpler one.
AutoPath Pick(double inline_s, double striped_s, double store_s, double margin) {
  if (store_s * margin <= std::min(inline_s, striped_s)) return AutoPath::kStore;
  if (striped_s * margin <= inline_s) return AutoPath::kStriped;
  return AutoPath::kInline;
}

double Margin(const AutoPolicyOptions& o) {
  return std::isfinite(o.switch_margin) ? std::max(o.switch_margin, 1.0) : 1.0;
}

std::string Format(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

// Three significant digits, without an exponent from 100 on.
std::string Number(double x, const char* unit) {
  return Format(x < 100 ? "%.3g" : "%.0f", x) + " " + unit;
}

std::string Seconds(double s) {
  if (!std::isfinite(s)) return "never";
  return s < 1 ? Number(s * 1e3, "ms") : Number(s, "s");
}

std::string Rate(double bytes_per_s) { return Number(bytes_per_s / 1e6, "MB/s"); }

std::string Bytes(uint64_t bytes) {
  if (bytes < (1ull << 10)) return std::to_string(bytes) + " B";
  if (bytes < (1ull << 20)) return Format("%.3g KiB", static_cast<double>(bytes) / (1 << 10));
  if (bytes < (1ull << 30)) return Format("%.3g MiB", static_cast<double>(bytes) / (1 << 20));
  return Format("%.3g GiB", static_cast<double>(bytes) / (1ull << 30));
}

// Without throughput figures: the paper's guideline, unless the round trip
// says LAN.
AutoChoice ChooseWithoutThroughput(const LinkEstimate& link, const AutoRequest& request,
                                   const AutoPolicyOptions& o, Knowledge known) {
  AutoChoice choice;
  if (known == Knowledge::kRttOnly && link.rtt_s < o.lan_rtt_s) {
    choice.reason = "inline: LAN round trip " + Seconds(link.rtt_s) + " (< " +
                    Seconds(o.lan_rtt_s) + "), no throughput figures yet";
    return choice;
  }
  const std::string why = known == Knowledge::kNone
                              ? "no link estimate yet"
                              : "round trip " + Seconds(link.rtt_s) + ", no throughput figures yet";
  if (request.store_available && request.bytes >= o.default_store_bytes && request.bytes > 0) {
    choice.path = AutoPath::kStore;
    choice.reason = "store: " + why + ", " + Bytes(request.bytes) + " >= default threshold " +
                    Bytes(o.default_store_bytes);
  } else {
    choice.reason = "inline: " + why + ", " +
                    (request.store_available ? Bytes(request.bytes) + " < default threshold " +
                                                   Bytes(o.default_store_bytes)
                                             : std::string("no object store"));
  }
  return choice;
}

}  // namespace

std::string_view AutoPathName(AutoPath path) {
  switch (path) {
    case AutoPath::kInline:
      return "inline";
    case AutoPath::kStriped:
      return "striped";
    case AutoPath::kStore:
      return "store";
  }
  return "?";
}

int StripeStreams(const LinkEstimate& link, const AutoPolicyOptions& o) {
  if (Classify(link) != Knowledge::kFull) return 1;
  const double gain = link.aggregate_Bps / link.one_stream_Bps;
  if (!std::isfinite(gain) || gain < o.min_parallel_gain) return 1;
  const int most = std::max(o.max_streams, 1);
  // Compared before the cast: a huge gain must not overflow int.
  return gain >= most ? most : std::clamp(static_cast<int>(std::ceil(gain)), 1, most);
}

AutoChoice ChooseAutoPath(const LinkEstimate& link, const AutoRequest& request,
                          const AutoPolicyOptions& o) {
  const Knowledge known = Classify(link);
  if (known != Knowledge::kFull) return ChooseWithoutThroughput(link, request, o, known);

  AutoChoice choice;
  const Costs costs = Predict(link, request.receivers, o);
  const double bytes = static_cast<double>(request.bytes);
  choice.inline_s = costs.inline_path.At(bytes);
  const double striped_s = costs.streams > 1 ? costs.striped.At(bytes) : kInfinity;
  const double store_s = request.store_available ? costs.store.At(bytes) : kInfinity;
  if (costs.streams > 1) choice.striped_s = striped_s;
  if (request.store_available) choice.store_s = store_s;

  choice.path =
      request.bytes == 0 ? AutoPath::kInline : Pick(choice.inline_s, striped_s, store_s, Margin(o));
  if (choice.path == AutoPath::kStriped) choice.streams = costs.streams;

  std::string reason = std::string(AutoPathName(choice.path));
  if (choice.path == AutoPath::kStriped) reason += "(" + std::to_string(costs.streams) + ")";
  reason += ": " + Bytes(request.bytes);
  if (request.receivers > 1) {
    reason += " to " + std::to_string(request.receivers) + " receivers";
    if (Positive(o.sender_egress_Bps)) reason += " (egress " + Rate(o.sender_egress_Bps) + ")";
  }
  reason += ", predicted inline " + Seconds(choice.inline_s);
  if (costs.streams > 1)
    reason += ", striped(" + std::to_string(costs.streams) + ") " + Seconds(striped_s);
  if (request.store_available) {
    reason += ", store " + Seconds(store_s);
    if (Positive(o.store_local_Bps)) reason += " (writes at " + Rate(o.store_local_Bps) + ")";
  } else {
    reason += ", no store";
  }
  reason += "; link " + Seconds(link.rtt_s) + " RTT, one stream " + Rate(link.one_stream_Bps) +
            ", " + Rate(link.aggregate_Bps) + " with " + std::to_string(link.aggregate_streams) +
            " streams";
  if (link.aggregate_Bps < o.min_parallel_gain * link.one_stream_Bps) {
    reason += " (one stream fills it)";
  }
  choice.reason = std::move(reason);
  return choice;
}

std::optional<AutoChoice> ExploreAutoPath(const LinkEstimate& link, const AutoRequest& request,
                                          const AutoChoice& chosen, const AutoPolicyOptions& o) {
  if (Classify(link) != Knowledge::kFull || request.bytes == 0) return std::nullopt;
  if (!std::isfinite(o.explore_factor) || o.explore_factor < 1) return std::nullopt;
  AutoChoice alt = chosen;
  alt.streams = 1;
  double chosen_s, alt_s;
  int alt_samples;
  if (chosen.path == AutoPath::kStore) {
    alt.path = AutoPath::kInline;
    chosen_s = chosen.store_s;
    alt_s = chosen.inline_s;
    alt_samples = link.one_stream_samples;
  } else {
    if (!request.store_available) return std::nullopt;
    alt.path = AutoPath::kStore;
    chosen_s = chosen.path == AutoPath::kStriped ? chosen.striped_s : chosen.inline_s;
    alt_s = chosen.store_s;
    alt_samples = link.aggregate_samples;
  }
  if (alt_samples >= o.trusted_samples || !Positive(chosen_s) || !Positive(alt_s) ||
      alt_s > o.explore_factor * chosen_s) {
    return std::nullopt;
  }
  const std::string figure = alt.path == AutoPath::kStore ? "aggregate" : "one-stream";
  alt.reason = std::string(AutoPathName(alt.path)) + ": exploring, its " + figure +
               " rate is from " + std::to_string(alt_samples) + " transfer" +
               (alt_samples == 1 ? "" : "s") + " (predicted " + Seconds(alt_s) + ", within " +
               Format("%.3gx", o.explore_factor) + " of " + std::string(AutoPathName(chosen.path)) +
               " " + Seconds(chosen_s) + "); chosen was " + chosen.reason;
  return alt;
}

uint64_t StoreThresholdBytes(const LinkEstimate& link, const AutoPolicyOptions& o) {
  const Knowledge known = Classify(link);
  if (known != Knowledge::kFull) {
    if (known == Knowledge::kRttOnly && link.rtt_s < o.lan_rtt_s) return UINT64_MAX;
    return std::max<uint64_t>(o.default_store_bytes, 1);
  }
  const Costs c = Predict(link, 1, o);
  const double m = Margin(o);
  // The store wins from some size on only if, per byte, it beats every other
  // candidate by the margin; then the winning sizes are one half-line and a
  // bisection on the rule itself finds where it starts.
  auto beats_per_byte = [&](const Cost& other) {
    return !std::isfinite(other.per_byte_s) || other.per_byte_s > m * c.store.per_byte_s;
  };
  if (!beats_per_byte(c.inline_path) || (c.streams > 1 && !beats_per_byte(c.striped))) {
    return UINT64_MAX;
  }
  auto store_wins = [&](uint64_t bytes) {
    const double b = static_cast<double>(bytes);
    const double striped = c.streams > 1 ? c.striped.At(b) : kInfinity;
    return Pick(c.inline_path.At(b), striped, c.store.At(b), m) == AutoPath::kStore;
  };
  uint64_t lo = 1, hi = UINT64_MAX;  // store_wins(hi) holds by the slopes above
  if (store_wins(lo)) return lo;
  if (!store_wins(hi)) return UINT64_MAX;
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (store_wins(mid) ? hi : lo) = mid;
  }
  return hi;
}

}  // namespace xsilo
