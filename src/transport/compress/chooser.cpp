#include "transport/compress/chooser.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace xsilo {

namespace compression_internal {

std::string Fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

std::string RecipeName(const TensorRecipe& r) {
  std::string s = r.quant == Quant::kNone ? "lossless" : std::string(QuantName(r.quant));
  if (r.quant != Quant::kNone && r.zstd) s += "+zstd";
  if (r.topk > 0) s += " top-" + Fixed(r.topk, 4);
  if (r.delta) s += r.value_scale ? " delta on the values' scale" : " delta";
  return s;
}

}  // namespace compression_internal

using compression_internal::Fixed;
using compression_internal::RecipeName;

bool CompressionCannotPay(uint64_t eligible_bytes, uint64_t message_bytes, double link_Bps,
                          int threads, double encode_Bps, double decode_Bps, double best_ratio,
                          double margin) {
  if (!(link_Bps > 0) || !(encode_Bps > 0) || !(decode_Bps > 0) || threads < 1) return false;
  const double e = static_cast<double>(eligible_bytes), total = static_cast<double>(message_bytes);
  const double best = e / (encode_Bps * threads) + (total - e + e * best_ratio) / link_Bps +
                      e / (decode_Bps * threads);
  return best >= total / link_Bps * (1 - margin);
}

CompressionChoice ChooseCompression(uint64_t message_bytes, double link_Bps, int threads,
                                    const std::vector<CodecCandidate>& candidates, double margin) {
  CompressionChoice best;
  if (link_Bps <= 0 || message_bytes == 0) {
    best.reason = "none: the link's throughput is unknown";
    return best;
  }
  const double total = static_cast<double>(message_bytes);
  best.uncompressed_s = best.predicted_s = total / link_Bps;
  const double th = std::max(1, threads);
  std::string tried;
  const CodecCandidate* chosen = nullptr;
  for (const auto& c : candidates) {
    const auto& e = c.estimate;
    if (e.encode_Bps <= 0 || e.decode_Bps <= 0 || c.eligible_bytes == 0) continue;
    const double eligible = static_cast<double>(std::min(c.eligible_bytes, message_bytes));
    const double t = eligible / (e.encode_Bps * th) +
                     (total - eligible + eligible * e.ratio) / link_Bps +
                     eligible / (e.decode_Bps * th);
    tried += (tried.empty() ? "" : ", ") + RecipeName(e.recipe) + " " + Fixed(t, 3) + " s (ratio " +
             Fixed(e.ratio, 3) + ")";
    if (t < best.predicted_s) {
      best.predicted_s = t;
      chosen = &c;
    }
  }
  const std::string tail = " at " + Fixed(link_Bps / 1e6, 1) + " MB/s: as it is " +
                           Fixed(best.uncompressed_s, 3) + " s" +
                           (tried.empty() ? "" : ", " + tried);
  if (chosen != nullptr && best.predicted_s < best.uncompressed_s * (1 - margin)) {
    best.compress = true;
    best.recipe = chosen->estimate.recipe;
    best.ratio = chosen->estimate.ratio;
    best.reason = RecipeName(best.recipe) + tail;
  } else {
    best.predicted_s = best.uncompressed_s;
    best.reason = "none" + tail;
  }
  return best;
}

CompressionChoice ChooseCompressionUnderCeiling(uint64_t message_bytes, double ceiling_Bps,
                                                int threads,
                                                const std::vector<CodecCandidate>& candidates,
                                                double margin) {
  CompressionChoice best;
  if (!(ceiling_Bps > 0) || !std::isfinite(ceiling_Bps) || message_bytes == 0) {
    best.reason = "none: the link's throughput is unknown";
    return best;
  }
  // Each option takes a + b x seconds at x = 1/link in [x0, inf): none
  // first, then every usable candidate.
  struct Option {
    const CodecCandidate* c = nullptr;
    double a = 0, b = 0, worst = 1;  // worst: set below
  };
  const double total = static_cast<double>(message_bytes);
  const double th = std::max(1, threads);
  std::vector<Option> options = {{nullptr, 0, total}};
  for (const auto& c : candidates) {
    const auto& e = c.estimate;
    if (e.encode_Bps <= 0 || e.decode_Bps <= 0 || c.eligible_bytes == 0) continue;
    const double eligible = static_cast<double>(std::min(c.eligible_bytes, message_bytes));
    const double a = eligible / (e.encode_Bps * th) + eligible / (e.decode_Bps * th);
    const double b = total - eligible + eligible * e.ratio;
    if (!std::isfinite(a) || !std::isfinite(b) || b < 0) continue;
    options.push_back({&c, a, b});
  }
  // Each option's slowdown t / E against the best of all, E(x) = min_j
  // t_j(x), is quasi-convex in x (its sublevel sets {t - c E <= 0} are
  // intervals, E being concave), so its largest is at one end: at the
  // ceiling, or on the slowest links (x -> inf), where it is its bytes
  // over the fewest any option sends.
  const double x0 = 1 / ceiling_Bps;
  double fewest = total, best_at_x0 = total * x0;
  for (const Option& o : options) {
    fewest = std::min(fewest, o.b);
    best_at_x0 = std::min(best_at_x0, o.a + o.b * x0);
  }
  for (Option& o : options) {
    const double slow_end =
        fewest > 0 ? o.b / fewest : (o.b > 0 ? std::numeric_limits<double>::infinity() : 1);
    o.worst = std::max((o.a + o.b * x0) / best_at_x0, slow_end);
  }
  const Option* chosen = &options[0];
  std::string tried;
  for (const Option& o : options) {
    if (o.c == nullptr) continue;
    tried += ", " + RecipeName(o.c->estimate.recipe) + " " + Fixed(o.a + o.b * x0, 3) +
             " s (ratio " + Fixed(o.c->estimate.ratio, 3) + ", at worst " + Fixed(o.worst, 2) +
             "x)";
    if (o.worst < chosen->worst) chosen = &o;
  }
  best.uncompressed_s = total * x0;
  const std::string tail = " at up to " + Fixed(ceiling_Bps / 1e6, 1) +
                           " MB/s, the least slowdown at worst against the best at any speed: as "
                           "it is " +
                           Fixed(best.uncompressed_s, 3) + " s at the ceiling (at worst " +
                           Fixed(options[0].worst, 2) + "x)" + tried;
  if (chosen->c != nullptr && chosen->worst < options[0].worst * (1 - margin)) {
    best.compress = true;
    best.recipe = chosen->c->estimate.recipe;
    best.ratio = chosen->c->estimate.ratio;
    best.predicted_s = chosen->a + chosen->b * x0;
    best.reason = RecipeName(best.recipe) + tail;
  } else {
    best.predicted_s = best.uncompressed_s;
    best.reason = "none" + tail;
  }
  return best;
}

}  // namespace xsilo
