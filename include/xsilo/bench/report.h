// Figures and text the benchmark drivers share: summary statistics of a
// sample, fixed-point numbers for tables, timestamps for result names.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace xsilo::bench {

// The middle value (mean of the two middle ones for an even count); 0 when
// `v` is empty.
double Median(std::vector<double> v);

// Nearest-rank percentile, `p` in [0, 100]; 0 when `v` is empty.
double Percentile(std::vector<double> v, double p);

// `v` with exactly `digits` digits after the point ("%.*f").
std::string Fixed(double v, int digits);

// The current UTC time as YYYYMMDD-HHMMSS, for result directory names.
std::string UtcStamp();

// The non-empty items of a comma-separated list.
std::vector<std::string> SplitList(const std::string& s);

// A benchmark backend name may end in "~CODEC" (auto+s3~lossless,
// grpc~int8): the base backend under the compressing decorator with
// compression=CODEC (docs/compression.md), a row of its own beside the
// base; "~CODEC:whole" the same without streaming (compression.stream=0,
// for an A/B in one run). Returns the base name and adds the options to
// *options; the name itself when it has no suffix. False for an unknown
// CODEC.
bool SplitCompressionSuffix(const std::string& name, std::string* base,
                            std::map<std::string, std::string>* options);

}  // namespace xsilo::bench
