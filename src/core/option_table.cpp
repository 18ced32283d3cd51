#include "xsilo/core/option_table.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace xsilo {

namespace {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

bool IsInteger(OptionType t) {
  return t == OptionType::kInt || t == OptionType::kBytes || t == OptionType::kMillis ||
         t == OptionType::kMicros || t == OptionType::kSeconds;
}

bool PrefixRow(std::string_view name) { return name.size() > 2 && name.ends_with(".*"); }

}  // namespace

std::string NearestName(std::string_view key, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = 0;
  for (const auto& n : names) {
    const size_t d = EditDistance(key, n);
    if (best.empty() || d < best_distance) {
      best = n;
      best_distance = d;
    }
  }
  return !best.empty() && best_distance * 3 <= std::max(key.size(), best.size()) ? best : "";
}

OptionTable::OptionTable(std::string owner, std::vector<OptionSpec> rows, std::string noun)
    : owner_(std::move(owner)), rows_(std::move(rows)), noun_(std::move(noun)) {}

const OptionSpec* OptionTable::Find(std::string_view name) const {
  for (const auto& r : rows_) {
    if (r.name == name) return &r;
    if (PrefixRow(r.name) && name.size() > r.name.size() - 1 &&
        name.starts_with(r.name.substr(0, r.name.size() - 1))) {
      return &r;
    }
  }
  return nullptr;
}

const OptionSpec& OptionTable::Row(std::string_view name) const {
  const OptionSpec* r = Find(name);
  if (r == nullptr) std::abort();  // REQUIRES: a caller reads only its own keys
  return *r;
}

Status OptionTable::CheckKeys(const OptionMap& options) const {
  for (const auto& [k, v] : options) {
    if (Find(k) != nullptr) continue;
    std::vector<std::string> names;
    std::string list;
    for (const auto& r : rows_) {
      names.emplace_back(r.name);
      list += (list.empty() ? "" : ", ") + std::string(r.name);
    }
    const std::string nearest = NearestName(k, names);
    return InvalidArgument("unknown " + noun_ + " '" + k + "' of " + owner_ +
                           (nearest.empty() ? "" : " (did you mean '" + nearest + "'?)") +
                           " (known: " + (list.empty() ? "none" : list) + ")");
  }
  return Status::OK();
}

std::string OptionTable::Value(const OptionMap& options, const OptionSpec& row) const {
  auto it = options.find(std::string(row.name));
  return it == options.end() ? std::string(row.default_value) : it->second;
}

bool OptionTable::Has(const OptionMap& options, std::string_view name) const {
  return options.count(std::string(Row(name).name)) > 0;
}

std::string OptionTable::Accepted(const OptionSpec& row) {
  switch (row.type) {
    case OptionType::kInt:
    case OptionType::kBytes:
    case OptionType::kMillis:
    case OptionType::kMicros:
    case OptionType::kSeconds: {
      const char* unit = row.type == OptionType::kBytes     ? " (bytes)"
                         : row.type == OptionType::kMillis  ? " (ms)"
                         : row.type == OptionType::kMicros  ? " (µs)"
                         : row.type == OptionType::kSeconds ? " (s)"
                                                            : "";
      return "an integer in [" + std::to_string(row.min) + ", " + std::to_string(row.max) + "]" +
             unit;
    }
    case OptionType::kU64:
      return "an unsigned 64-bit integer";
    case OptionType::kFlag:
      return "0 or 1";
    case OptionType::kString:
      return "text";
    case OptionType::kEnum: {
      std::string out = "one of ";
      for (char c : row.choices) out += c == '|' ? std::string(", ") : std::string(1, c);
      return out;
    }
    case OptionType::kReal:
      return "a real number >= 0";
    case OptionType::kFraction:
      return row.min == 1 ? "a real number in (0, 1]" : "a probability, a real number in [0, 1]";
  }
  return "";
}

Result<int64_t> OptionTable::Int(const OptionMap& options, std::string_view name) const {
  const OptionSpec& row = Row(name);
  if (!IsInteger(row.type)) std::abort();
  const std::string text = Value(options, row);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size() || v < row.min ||
      v > row.max) {
    return InvalidArgument(owner_ + " option " + std::string(row.name) + "='" + text +
                           "' must be " + Accepted(row));
  }
  return v;
}

Result<uint64_t> OptionTable::U64(const OptionMap& options, std::string_view name) const {
  const OptionSpec& row = Row(name);
  if (row.type != OptionType::kU64) std::abort();
  const std::string text = Value(options, row);
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size()) {
    return InvalidArgument(owner_ + " option " + std::string(row.name) + "='" + text +
                           "' must be " + Accepted(row));
  }
  return v;
}

Result<bool> OptionTable::Flag(const OptionMap& options, std::string_view name) const {
  const OptionSpec& row = Row(name);
  if (row.type != OptionType::kFlag) std::abort();
  const std::string text = Value(options, row);
  if (text != "0" && text != "1") {
    return InvalidArgument(owner_ + " option " + std::string(row.name) + "='" + text +
                           "' must be 0 or 1");
  }
  return text == "1";
}

Result<double> OptionTable::Real(const OptionMap& options, std::string_view name) const {
  const OptionSpec& row = Row(name);
  if (row.type != OptionType::kReal && row.type != OptionType::kFraction) std::abort();
  const std::string text = Value(options, row);
  char* end = nullptr;
  const double v = text.empty() ? NAN : std::strtod(text.c_str(), &end);
  bool ok = !text.empty() && end == text.c_str() + text.size() && std::isfinite(v) && v >= 0;
  if (row.type == OptionType::kFraction) ok = ok && v <= 1 && (row.min != 1 || v > 0);
  if (!ok) {
    return InvalidArgument(owner_ + " option " + std::string(row.name) + "='" + text +
                           "' must be " + Accepted(row));
  }
  return v;
}

Result<std::string> OptionTable::Enum(const OptionMap& options, std::string_view name) const {
  const OptionSpec& row = Row(name);
  if (row.type != OptionType::kEnum) std::abort();
  std::string text = Value(options, row);
  std::string_view choices = row.choices;
  for (size_t start = 0; start <= choices.size();) {
    size_t bar = choices.find('|', start);
    if (bar == std::string_view::npos) bar = choices.size();
    if (choices.substr(start, bar - start) == text) return text;
    start = bar + 1;
  }
  return InvalidArgument(owner_ + " option " + std::string(row.name) + "='" + text + "' must be " +
                         Accepted(row));
}

std::string OptionTable::String(const OptionMap& options, std::string_view name) const {
  const OptionSpec& row = Row(name);
  return Value(options, row);
}

}  // namespace xsilo
