// libFuzzer target: the job-file loader (fl::Config::Parse, the TOML
// subset) and ReadJobConfig on what it returns. A file that parses is
// written back (every key dotted at the top level, every value in the form
// the parser reads) and must parse to the same values; a value passed
// through as text to the transport must read back as the same value; a job
// that ReadJobConfig accepts has positive timeouts and keeps every count
// exactly as written (no narrowing).
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "xsilo/fl/config.h"

namespace fl = xsilo::fl;

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

std::string Toml(const fl::ConfigValue& v) {
  if (auto* s = std::get_if<std::string>(&v)) {
    std::string out = "\"";
    for (char c : *s) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\r':
          out += "\\r";
          break;
        default:
          out += c;
      }
    }
    return out + "\"";
  }
  if (auto* d = std::get_if<double>(&v)) {
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), *d);
    std::string t(buf, end);
    if (t.find_first_of(".en") == std::string::npos) t += ".0";
    return t;
  }
  return fl::Config::ToText(v);  // integers and booleans
}

bool SameValue(const fl::ConfigValue& a, const fl::ConfigValue& b) {
  if (a.index() != b.index()) return false;
  if (auto* d = std::get_if<double>(&a)) {
    double e = std::get<double>(b);
    return std::memcmp(d, &e, sizeof e) == 0 || (std::isnan(*d) && std::isnan(e));
  }
  return a == b;
}

// The text a pass-through option carries reads back as its value.
void CheckPassThrough(const fl::ConfigValue& v, const std::string& text) {
  if (auto* d = std::get_if<double>(&v)) {
    double back = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), back);
    Check(ec == std::errc() && p == text.data() + text.size());
    Check(back == *d || (std::isnan(back) && std::isnan(*d)));
  } else if (auto* i = std::get_if<int64_t>(&v)) {
    Check(text == std::to_string(*i));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = fl::Config::Parse(text);
  if (!c.ok()) {
    Check(!c.status().message().empty());
    return 0;
  }
  std::string written;
  for (const auto& [k, v] : c->values()) written += k + " = " + Toml(v) + "\n";
  auto again = fl::Config::Parse(written);
  Check(again.ok() && again->values().size() == c->values().size());
  for (const auto& [k, v] : c->values()) {
    auto it = again->values().find(k);
    Check(it != again->values().end() && SameValue(v, it->second));
  }

  auto job = fl::ReadJobConfig(*c);
  if (!job.ok()) return 0;
  for (const auto& [k, v] : c->values()) {
    if (k.rfind("backend.", 0) == 0)
      CheckPassThrough(v, job->transport_options.backend.at(k.substr(8)));
  }
  const auto& s = job->server;
  Check(job->transport_options.connect_timeout.count() > 0);
  Check(s.round_deadline.count() > 0 && s.finish_deadline.count() > 0);
  Check(job->client.idle_timeout.count() > 0 && job->client.send_timeout.count() > 0);
  auto exact = [&](const char* key, uint64_t stored) {
    auto it = c->values().find(key);
    if (it == c->values().end()) return;
    Check(static_cast<uint64_t>(std::get<int64_t>(it->second)) == stored);
  };
  exact("fl.rounds", s.rounds);
  exact("fl.clients_per_round", s.clients_per_round);
  exact("fl.aggregation_threads", s.aggregator.threads);
  if (c->Has("fl.max_failed_rounds") &&
      std::get<int64_t>(c->values().at("fl.max_failed_rounds")) > 0)
    exact("fl.max_failed_rounds", s.max_failed_rounds);
  if (auto it = c->values().find("fl.quorum");
      it != c->values().end() && std::holds_alternative<int64_t>(it->second)) {
    exact("fl.quorum", s.quorum_count);
  }
  exact("transport.receive_queue_capacity", job->transport_options.receive_queue_capacity);
  exact("mlp.batch_size", job->mlp.batch_size);
  return 0;
}
