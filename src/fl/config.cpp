#include "xsilo/fl/config.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

namespace xsilo::fl {

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

bool IsBareKeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

bool IsDottedKey(std::string_view k) {
  if (k.empty() || k.front() == '.' || k.back() == '.') return false;
  char prev = 0;
  for (char c : k) {
    if (c == '.' && prev == '.') return false;
    if (c != '.' && !IsBareKeyChar(c)) return false;
    prev = c;
  }
  return true;
}

// Parses a value and whatever trails it (only a comment may).
Result<ConfigValue> ParseValue(std::string_view v) {
  if (v.empty()) return InvalidArgument("missing value");
  std::string_view rest;
  ConfigValue out;
  if (v.front() == '"' || v.front() == '\'') {
    const char q = v.front();
    if (v.substr(0, 3) == std::string(3, q))
      return InvalidArgument("multi-line strings unsupported");
    std::string s;
    size_t i = 1;
    for (; i < v.size() && v[i] != q; ++i) {
      if (q == '"' && v[i] == '\\') {
        if (++i == v.size()) break;
        switch (v[i]) {
          case 'n':
            s += '\n';
            break;
          case 't':
            s += '\t';
            break;
          case 'r':
            s += '\r';
            break;
          case '"':
            s += '"';
            break;
          case '\\':
            s += '\\';
            break;
          default:
            return InvalidArgument(std::string("unsupported escape \\") + v[i]);
        }
      } else {
        s += v[i];
      }
    }
    if (i >= v.size()) return InvalidArgument("unterminated string");
    out = std::move(s);
    rest = v.substr(i + 1);
  } else {
    size_t end = v.find('#');
    std::string_view tok = Trim(v.substr(0, end));
    rest = end == std::string_view::npos ? std::string_view{} : v.substr(end);
    if (tok == "true" || tok == "false") {
      out = tok == "true";
    } else if (!tok.empty() && (tok.front() == '[' || tok.front() == '{')) {
      return InvalidArgument("arrays and inline tables unsupported");
    } else {
      std::string digits;
      for (char c : tok) {
        if (c != '_') digits += c;
      }
      const bool is_float =
          digits.find_first_of(".eE") != std::string::npos || digits == "inf" || digits == "nan";
      const char* b = digits.data();
      const char* e = b + digits.size();
      if (!digits.empty() && *b == '+') ++b;
      if (is_float) {
        double d = 0;
        auto [p, ec] = std::from_chars(b, e, d);
        if (ec != std::errc() || p != e)
          return InvalidArgument("bad number '" + std::string(tok) + "'");
        out = d;
      } else {
        int64_t n = 0;
        auto [p, ec] = std::from_chars(b, e, n);
        if (ec != std::errc() || p != e || b == e) {
          return InvalidArgument("bad value '" + std::string(tok) + "' (strings need quotes)");
        }
        out = n;
      }
    }
  }
  rest = Trim(rest);
  if (!rest.empty() && rest.front() != '#') return InvalidArgument("unexpected text after value");
  return out;
}

template <typename T>
const char* TypeName() {
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  if constexpr (std::is_same_v<T, int64_t>) return "an integer";
  if constexpr (std::is_same_v<T, double>) return "a number";
  return "a boolean";
}

template <typename T>
Result<T> Get(const std::map<std::string, ConfigValue>& m, const std::string& key, T fallback) {
  auto it = m.find(key);
  if (it == m.end()) return fallback;
  if (auto* v = std::get_if<T>(&it->second)) return *v;
  if constexpr (std::is_same_v<T, double>) {
    if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  }
  return InvalidArgument("config key '" + key + "' must be " + TypeName<T>());
}

}  // namespace

Result<Config> Config::Parse(std::string_view text) {
  Config c;
  std::string table;
  size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    size_t nl = text.find('\n');
    std::string_view line = Trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    auto fail = [&](const std::string& why) {
      return InvalidArgument("config line " + std::to_string(line_no) + ": " + why);
    };
    if (line.empty() || line.front() == '#') continue;
    if (line.front() == '[') {
      if (line.size() > 1 && line[1] == '[') return fail("arrays of tables unsupported");
      size_t close = line.find(']');
      if (close == std::string_view::npos) return fail("unterminated table header");
      std::string_view after = Trim(line.substr(close + 1));
      if (!after.empty() && after.front() != '#') return fail("unexpected text after table header");
      std::string_view name = Trim(line.substr(1, close - 1));
      if (!IsDottedKey(name)) return fail("bad table name '" + std::string(name) + "'");
      table = std::string(name);
      continue;
    }
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) return fail("expected key = value");
    std::string_view key = Trim(line.substr(0, eq));
    if (!IsDottedKey(key)) return fail("bad key '" + std::string(key) + "'");
    auto value = ParseValue(Trim(line.substr(eq + 1)));
    if (!value.ok()) return fail(value.status().message());
    std::string full = table.empty() ? std::string(key) : table + "." + std::string(key);
    if (!c.values_.emplace(full, std::move(value).value()).second) {
      return fail("duplicate key '" + full + "'");
    }
  }
  return c;
}

Result<Config> Config::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open config file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  auto c = Parse(ss.str());
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

Result<std::string> Config::String(const std::string& key, std::string fallback) const {
  return Get<std::string>(values_, key, std::move(fallback));
}
Result<int64_t> Config::Int(const std::string& key, int64_t fallback) const {
  return Get<int64_t>(values_, key, fallback);
}
Result<double> Config::Double(const std::string& key, double fallback) const {
  return Get<double>(values_, key, fallback);
}
Result<bool> Config::Bool(const std::string& key, bool fallback) const {
  return Get<bool>(values_, key, fallback);
}

std::string Config::ToText(const ConfigValue& v) {
  struct {
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    // Shortest text that reads back as the same double: a pass-through
    // option must reach the transport unchanged (1048576.5 is not 1.04858e+06).
    std::string operator()(double d) const {
      char buf[64];
      auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
      return ec == std::errc() ? std::string(buf, end) : std::string("nan");
    }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
  } visitor;
  return std::visit(visitor, v);
}

Status ParseQuorum(std::string_view text, ServerOptions& options) {
  std::string s(Trim(text));
  if (s.empty()) return InvalidArgument("empty quorum");
  bool percent = s.back() == '%';
  if (percent) s.pop_back();
  const char* b = s.data();
  const char* e = b + s.size();
  if (!percent && s.find_first_of(".eE") == std::string::npos) {
    int64_t n = 0;
    auto [p, ec] = std::from_chars(b, e, n);
    if (ec != std::errc() || p != e || n < 1 || n > std::numeric_limits<uint32_t>::max()) {
      return InvalidArgument("quorum '" + std::string(text) + "': a count >= 1 or a fraction");
    }
    options.quorum_count = static_cast<uint32_t>(n);
    options.quorum_fraction = 0;
    return Status::OK();
  }
  double f = 0;
  auto [p, ec] = std::from_chars(b, e, f);
  if (percent) f /= 100;
  if (ec != std::errc() || p != e || !(f > 0 && f <= 1)) {
    return InvalidArgument("quorum '" + std::string(text) + "': a fraction must lie in (0, 1]");
  }
  options.quorum_fraction = f;
  options.quorum_count = 0;
  return Status::OK();
}

Result<JobConfig> ReadJobConfig(const Config& c) {
  static const std::set<std::string> kKnown = {"transport.name",
                                               "transport.address",
                                               "transport.rank",
                                               "transport.world_size",
                                               "transport.connect_timeout_s",
                                               "transport.receive_queue_capacity",
                                               "transport.max_message_bytes",
                                               "fl.tier",
                                               "fl.rounds",
                                               "fl.clients_per_round",
                                               "fl.quorum",
                                               "fl.round_deadline_s",
                                               "fl.finish_deadline_s",
                                               "fl.local_steps",
                                               "fl.local_epochs",
                                               "fl.max_failed_rounds",
                                               "fl.seed",
                                               "fl.idle_timeout_s",
                                               "fl.send_timeout_s",
                                               "fl.aggregation_threads",
                                               "fl.checkpoint_dir",
                                               "mlp.batch_size",
                                               "mlp.learning_rate",
                                               "mlp.clip_norm",
                                               "mlp.seed",
                                               "data.alpha",
                                               "data.beta",
                                               "data.seed",
                                               "data.lognormal_mean",
                                               "data.lognormal_sigma",
                                               "data.min_samples",
                                               "data.max_samples",
                                               "data.test_fraction",
                                               "data.max_test_samples"};
  JobConfig j;
  for (const auto& [key, value] : c.values()) {
    if (key.rfind("backend.", 0) == 0) {
      j.transport_options.backend[key.substr(8)] = Config::ToText(value);
    } else if (!kKnown.count(key)) {
      return InvalidArgument("unknown config key '" + key + "'");
    }
  }
  // Seconds as a Duration: finite, positive and at most kMaxSeconds, so
  // the conversion to milliseconds can neither overflow nor round to 0.
  constexpr double kMaxSeconds = 1e9;  // ~31 years
  auto secs = [](const char* key, double s) -> Result<Duration> {
    if (!(s >= 0.001 && s <= kMaxSeconds)) {
      return InvalidArgument(std::string("config key '") + key +
                             "' must be a number of seconds in [0.001, 1e9]");
    }
    return Duration(static_cast<int64_t>(std::llround(s * 1000)));
  };
  auto fits_u32 = [](const char* key, int64_t v) -> Status {
    if (v > std::numeric_limits<uint32_t>::max())
      return InvalidArgument(std::string("config key '") + key + "' is too large");
    return Status::OK();
  };
  auto non_negative = [](const char* key, int64_t v) -> Status {
    if (v < 0) return InvalidArgument(std::string("config key '") + key + "' must be >= 0");
    return Status::OK();
  };
  TransportOptions& t = j.transport_options;
  XSILO_ASSIGN_OR_RETURN(j.transport, c.String("transport.name", j.transport));
  XSILO_ASSIGN_OR_RETURN(t.address, c.String("transport.address", t.address));
  XSILO_ASSIGN_OR_RETURN(int64_t rank, c.Int("transport.rank", t.rank));
  XSILO_ASSIGN_OR_RETURN(int64_t world, c.Int("transport.world_size", 8));
  if (world < 2 || world > 1 << 20)
    return InvalidArgument("transport.world_size must be in [2, 1048576]");
  if (rank < 0 || rank >= world) return InvalidArgument("transport.rank outside the world");
  t.rank = static_cast<int32_t>(rank);
  t.world_size = static_cast<int32_t>(world);
  XSILO_ASSIGN_OR_RETURN(double connect, c.Double("transport.connect_timeout_s", 60));
  XSILO_ASSIGN_OR_RETURN(t.connect_timeout, secs("transport.connect_timeout_s", connect));
  XSILO_ASSIGN_OR_RETURN(int64_t queue, c.Int("transport.receive_queue_capacity", 64));
  XSILO_RETURN_IF_ERROR(non_negative("transport.receive_queue_capacity", queue));
  t.receive_queue_capacity = static_cast<size_t>(queue);
  XSILO_ASSIGN_OR_RETURN(int64_t max_bytes,
                         c.Int("transport.max_message_bytes", static_cast<int64_t>(1) << 40));
  XSILO_RETURN_IF_ERROR(non_negative("transport.max_message_bytes", max_bytes));
  t.max_message_bytes = static_cast<uint64_t>(max_bytes);

  ServerOptions& s = j.server;
  XSILO_ASSIGN_OR_RETURN(j.tier, c.String("fl.tier", j.tier));
  XSILO_ASSIGN_OR_RETURN(int64_t rounds, c.Int("fl.rounds", 3));
  XSILO_ASSIGN_OR_RETURN(int64_t per_round, c.Int("fl.clients_per_round", 0));
  XSILO_ASSIGN_OR_RETURN(int64_t steps, c.Int("fl.local_steps", 10));
  XSILO_ASSIGN_OR_RETURN(int64_t epochs, c.Int("fl.local_epochs", 0));
  XSILO_ASSIGN_OR_RETURN(int64_t max_failed, c.Int("fl.max_failed_rounds", 3));
  XSILO_ASSIGN_OR_RETURN(int64_t seed, c.Int("fl.seed", 1));
  XSILO_ASSIGN_OR_RETURN(int64_t agg_threads, c.Int("fl.aggregation_threads", 0));
  for (auto [k, v] : {std::pair{"fl.rounds", rounds},
                      {"fl.clients_per_round", per_round},
                      {"fl.local_steps", steps},
                      {"fl.local_epochs", epochs},
                      {"fl.max_failed_rounds", max_failed},
                      {"fl.aggregation_threads", agg_threads}}) {
    XSILO_RETURN_IF_ERROR(non_negative(k, v));
  }
  for (auto [k, v] : {std::pair{"fl.clients_per_round", per_round},
                      {"fl.max_failed_rounds", max_failed},
                      {"fl.aggregation_threads", agg_threads}}) {
    XSILO_RETURN_IF_ERROR(fits_u32(k, v));
  }
  s.rounds = static_cast<uint64_t>(rounds);
  s.clients_per_round = static_cast<uint32_t>(per_round);
  // Epochs chosen alone replace the default steps.
  if (c.Has("fl.local_epochs") && !c.Has("fl.local_steps")) steps = 0;
  s.local_work = {static_cast<uint64_t>(epochs), static_cast<uint64_t>(steps)};
  if (s.local_work.steps == 0 && s.local_work.epochs == 0) {
    return InvalidArgument("fl.local_steps or fl.local_epochs must be > 0");
  }
  s.max_failed_rounds = static_cast<uint32_t>(std::max<int64_t>(1, max_failed));
  s.seed = static_cast<uint64_t>(seed);
  s.aggregator.threads = static_cast<uint32_t>(agg_threads);
  XSILO_ASSIGN_OR_RETURN(s.checkpoint_dir, c.String("fl.checkpoint_dir", ""));
  if (c.Has("fl.quorum")) {
    XSILO_RETURN_IF_ERROR(ParseQuorum(Config::ToText(c.values().at("fl.quorum")), s));
  }
  XSILO_ASSIGN_OR_RETURN(double deadline, c.Double("fl.round_deadline_s", 600));
  XSILO_ASSIGN_OR_RETURN(double finish, c.Double("fl.finish_deadline_s", 60));
  XSILO_ASSIGN_OR_RETURN(double idle, c.Double("fl.idle_timeout_s", 3600));
  XSILO_ASSIGN_OR_RETURN(double send, c.Double("fl.send_timeout_s", 600));
  XSILO_ASSIGN_OR_RETURN(s.round_deadline, secs("fl.round_deadline_s", deadline));
  XSILO_ASSIGN_OR_RETURN(s.finish_deadline, secs("fl.finish_deadline_s", finish));
  XSILO_ASSIGN_OR_RETURN(j.client.idle_timeout, secs("fl.idle_timeout_s", idle));
  XSILO_ASSIGN_OR_RETURN(j.client.send_timeout, secs("fl.send_timeout_s", send));
  j.client.default_work = s.local_work;

  MlpOptions& m = j.mlp;
  XSILO_ASSIGN_OR_RETURN(int64_t batch,
                         c.Int("mlp.batch_size", static_cast<int64_t>(m.batch_size)));
  if (batch < 1) return InvalidArgument("mlp.batch_size must be >= 1");
  m.batch_size = static_cast<uint64_t>(batch);
  XSILO_ASSIGN_OR_RETURN(m.learning_rate, c.Double("mlp.learning_rate", m.learning_rate));
  if (!(m.learning_rate > 0)) return InvalidArgument("mlp.learning_rate must be > 0");
  XSILO_ASSIGN_OR_RETURN(m.clip_norm, c.Double("mlp.clip_norm", m.clip_norm));
  XSILO_ASSIGN_OR_RETURN(int64_t mseed, c.Int("mlp.seed", static_cast<int64_t>(m.seed)));
  m.seed = static_cast<uint64_t>(mseed);

  SyntheticOptions& d = j.data;
  XSILO_ASSIGN_OR_RETURN(d.alpha, c.Double("data.alpha", d.alpha));
  XSILO_ASSIGN_OR_RETURN(d.beta, c.Double("data.beta", d.beta));
  XSILO_ASSIGN_OR_RETURN(int64_t dseed, c.Int("data.seed", static_cast<int64_t>(d.seed)));
  d.seed = static_cast<uint64_t>(dseed);
  XSILO_ASSIGN_OR_RETURN(d.lognormal_mean, c.Double("data.lognormal_mean", d.lognormal_mean));
  XSILO_ASSIGN_OR_RETURN(d.lognormal_sigma, c.Double("data.lognormal_sigma", d.lognormal_sigma));
  XSILO_ASSIGN_OR_RETURN(int64_t min_s,
                         c.Int("data.min_samples", static_cast<int64_t>(d.min_samples)));
  XSILO_ASSIGN_OR_RETURN(int64_t max_s,
                         c.Int("data.max_samples", static_cast<int64_t>(d.max_samples)));
  XSILO_ASSIGN_OR_RETURN(int64_t max_t,
                         c.Int("data.max_test_samples", static_cast<int64_t>(d.max_test_samples)));
  for (auto [k, v] : {std::pair{"data.min_samples", min_s},
                      {"data.max_samples", max_s},
                      {"data.max_test_samples", max_t}}) {
    XSILO_RETURN_IF_ERROR(non_negative(k, v));
  }
  d.min_samples = static_cast<uint64_t>(min_s);
  d.max_samples = static_cast<uint64_t>(max_s);
  d.max_test_samples = static_cast<uint64_t>(max_t);
  XSILO_ASSIGN_OR_RETURN(d.test_fraction, c.Double("data.test_fraction", d.test_fraction));
  return j;
}

}  // namespace xsilo::fl
