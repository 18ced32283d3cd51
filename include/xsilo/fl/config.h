// Configuration of a federated job, read from a TOML file.
//
// The parser takes the subset of TOML a job file needs: `[table]` and
// `[table.sub]` headers, `key = value` lines with basic ("...") or literal
// ('...') strings, integers (with optional _ separators), floats, booleans,
// and # comments. Arrays, inline tables and multi-line strings are
// rejected with InvalidArgument naming the line.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "xsilo/fl/fedavg.h"
#include "xsilo/fl/mlp.h"
#include "xsilo/fl/synthetic.h"
#include "xsilo/transport/transport.h"

namespace xsilo::fl {

using ConfigValue = std::variant<std::string, int64_t, double, bool>;

class Config {
 public:
  static Result<Config> Parse(std::string_view text);
  static Result<Config> Load(const std::string& path);

  // Keys are dotted paths: "fl.rounds" for `rounds` under `[fl]`.
  const std::map<std::string, ConfigValue>& values() const { return values_; }
  bool Has(const std::string& key) const { return values_.count(key) > 0; }
  // Typed access with a fallback for absent keys; InvalidArgument on a
  // type mismatch (an integer is accepted where a float is expected).
  Result<std::string> String(const std::string& key, std::string fallback) const;
  Result<int64_t> Int(const std::string& key, int64_t fallback) const;
  Result<double> Double(const std::string& key, double fallback) const;
  Result<bool> Bool(const std::string& key, bool fallback) const;
  // The value as text (strings unquoted), for pass-through options.
  static std::string ToText(const ConfigValue& v);

 private:
  std::map<std::string, ConfigValue> values_;
};

// Everything `xsilo fl server` and `xsilo fl client` need. See docs/fl.md
// for the file layout; every key is optional.
struct JobConfig {
  std::string transport = "inproc";    // [transport] name
  TransportOptions transport_options;  // [transport] address, rank, world_size, ...
                                       // [backend] every key, passed through as text
  std::string tier = "small";          // [fl] tier
  ServerOptions server;                // [fl] rounds, local_steps, quorum, ...
  ClientOptions client;                // [fl] idle_timeout_s, send_timeout_s
  MlpOptions mlp;                      // [mlp] batch_size, learning_rate, clip_norm, seed
  SyntheticOptions data;               // [data] alpha, beta, seed, ...
};

// Fills a JobConfig from `config`; InvalidArgument for an unknown table or
// key (a typo must not silently fall back to a default) or a bad value.
Result<JobConfig> ReadJobConfig(const Config& config);

// "0.5" / "50%" -> fraction; "5" -> count. Sets one of the two, zeroing
// the other (fraction 0 when a count is given).
Status ParseQuorum(std::string_view text, ServerOptions& options);

}  // namespace xsilo::fl
