// A layer's string options (a transport's backend keys, the hybrid's, a
// connector's) as one table: each key's name, type, default, range and doc
// line. A layer parses its options through its table, so the table is the
// one place a key's default and range are written; `xsilo backends --keys`
// prints every table and docs/backend-options.md is made from it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "xsilo/core/status.h"

namespace xsilo {

using OptionMap = std::map<std::string, std::string>;

enum class OptionType {
  kInt,       // an integer in [min, max]
  kU64,       // any unsigned 64-bit integer (a seed, a count)
  kBytes,     // a byte count in [min, max]
  kMillis,    // a duration in ms, in [min, max]
  kMicros,    // a duration in µs, in [min, max]
  kSeconds,   // a duration in s, in [min, max]
  kFlag,      // 0 or 1
  kString,    // any text
  kEnum,      // one of `choices`
  kReal,      // a real number >= 0
  kFraction,  // a real number in [0, 1] (a probability), or (0, 1] when min is 1
};

struct OptionSpec {
  std::string_view name;  // as the user writes it; "inner.*" takes every key of a prefix
  OptionType type;
  std::string_view default_value;  // as text; "" when there is none (the doc says why)
  int64_t min = 0, max = 0;        // the integer types: the accepted range, inclusive
  std::string_view choices;        // kEnum: "|"-separated
  std::string_view doc;            // one line: what the key does
  bool secret = false;             // a credential: never printed, never in a reference
};

class OptionTable {
 public:
  // `owner` names the options in errors and docs ("grpc", "hybrid", "s3
  // connector"); `noun` is what an unknown key is called in CheckKeys'
  // error ("unknown backend option 'x' of grpc").
  OptionTable(std::string owner, std::vector<OptionSpec> rows, std::string noun = "backend option");

  const std::string& owner() const { return owner_; }
  const std::vector<OptionSpec>& rows() const { return rows_; }
  // The row of `name` (a prefix row "inner.*" matches "inner.<anything>");
  // null when none.
  const OptionSpec* Find(std::string_view name) const;

  // InvalidArgument for the first key of `options` without a row, naming
  // the nearest name when one is close enough to be a slip.
  Status CheckKeys(const OptionMap& options) const;

  // A key's value, or its default when absent. InvalidArgument naming the
  // owner, the key, the value and what is accepted when it does not parse
  // or is out of range. REQUIRES: `name` has a row of a fitting type.
  Result<int64_t> Int(const OptionMap& options, std::string_view name) const;
  Result<uint64_t> U64(const OptionMap& options, std::string_view name) const;
  Result<bool> Flag(const OptionMap& options, std::string_view name) const;
  Result<double> Real(const OptionMap& options, std::string_view name) const;
  Result<std::string> Enum(const OptionMap& options, std::string_view name) const;
  std::string String(const OptionMap& options, std::string_view name) const;
  bool Has(const OptionMap& options, std::string_view name) const;

  // "integer in [1024, 67108864]", "0 or 1", "one of stream, unary", ...
  static std::string Accepted(const OptionSpec& row);

 private:
  const OptionSpec& Row(std::string_view name) const;
  std::string Value(const OptionMap& options, const OptionSpec& row) const;

  std::string owner_;
  std::vector<OptionSpec> rows_;
  std::string noun_;
};

// The name of `names` nearest to `key` (edit distance) when close enough to
// be a slip (at most a third of its letters differ); else empty.
std::string NearestName(std::string_view key, const std::vector<std::string>& names);

}  // namespace xsilo
