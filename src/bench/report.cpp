#include "xsilo/bench/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <string_view>

namespace xsilo::bench {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

std::string Fixed(double v, int digits) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

std::string UtcStamp() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::gmtime(&now));
  return buf;
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

bool SplitCompressionSuffix(const std::string& name, std::string* base,
                            std::map<std::string, std::string>* options) {
  const auto tilde = name.rfind('~');
  if (tilde == std::string::npos) {
    *base = name;
    return true;
  }
  static const char* kCodecs[] = {"auto", "lossless",  "bf16",      "fp16",     "int8",
                                  "topk", "bf16+topk", "fp16+topk", "int8+topk"};
  std::string_view codec = std::string_view(name).substr(tilde + 1);
  // ":whole": the compressed message is not streamed (compression.stream=0).
  constexpr std::string_view kWhole = ":whole";
  const bool unstreamed = codec.ends_with(kWhole);
  if (unstreamed) codec.remove_suffix(kWhole.size());
  if (tilde == 0 || std::find(std::begin(kCodecs), std::end(kCodecs), codec) == std::end(kCodecs))
    return false;
  *base = name.substr(0, tilde);
  (*options)["compression"] = std::string(codec);
  if (unstreamed) options->insert_or_assign("compression.stream", std::string("0"));
  return true;
}

}  // namespace xsilo::bench
