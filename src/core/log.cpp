#include "xsilo/core/log.h"

#include <spdlog/details/log_msg.h>
#include <spdlog/pattern_formatter.h>

#include <unistd.h>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace xsilo {

namespace {

// One configuration, immutable once published. A replaced one is never
// freed, since a thread may still be reading it; it stays reachable through
// `previous` of its successor (so it is retained, not leaked), and setters
// are rare (a process makes a handful).
struct Config {
  const Config* previous = nullptr;  // the configuration this one replaced
  uint64_t generation = 1;
  LogLevel fallback = LogLevel::kInfo;
  std::vector<std::pair<std::string, LogLevel>> levels;  // per component
  LogFormat format = LogFormat::kText;
  std::shared_ptr<const LogSink> sink;  // null: stderr

  LogLevel LevelOf(std::string_view component) const {
    for (const auto& [name, level] : levels) {
      if (name == component) return level;
    }
    return fallback;
  }
};

std::atomic<const Config*> g_config{nullptr};
std::mutex g_set_mu;  // serialises the setters

constexpr std::string_view kLevelNames[] = {"trace", "debug", "info", "warn", "error", "off"};

struct Parsed {
  LogLevel fallback = LogLevel::kInfo;
  std::vector<std::pair<std::string, LogLevel>> levels;
};

Result<Parsed> ParseSpec(std::string_view spec) {
  Parsed out;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string_view::npos) comma = spec.size();
    std::string_view item = spec.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      XSILO_ASSIGN_OR_RETURN(out.fallback, ParseLogLevel(item));
      continue;
    }
    const std::string_view name = item.substr(0, eq);
    if (name.empty()) {
      return InvalidArgument("log spec item '" + std::string(item) + "' has no component name");
    }
    XSILO_ASSIGN_OR_RETURN(LogLevel level, ParseLogLevel(item.substr(eq + 1)));
    out.levels.emplace_back(std::string(name), level);
  }
  return out;
}

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere to report a failing stderr
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Installed under g_set_mu (or by the one-time initialisation).
void Publish(Config* fresh) {
  const Config* old = g_config.load(std::memory_order_acquire);
  fresh->previous = old;
  fresh->generation = old == nullptr ? 1 : old->generation + 1;
  g_config.store(fresh, std::memory_order_release);
}

Config* FromEnvironment() {
  auto* c = new Config();
  const char* spec = std::getenv("XSILO_LOG");
  if (spec != nullptr && *spec != '\0') {
    Result<Parsed> p = ParseSpec(spec);
    if (p.ok()) {
      c->fallback = p->fallback;
      c->levels = std::move(p->levels);
    } else {
      const std::string line = "xsilo log: XSILO_LOG='" + std::string(spec) +
                               "' ignored: " + p.status().message() + "\n";
      WriteAll(2, line.data(), line.size());
    }
  } else if (const char* debug = std::getenv("XSILO_DEBUG");
             debug != nullptr && *debug != '\0' && std::string_view(debug) != "0") {
    c->fallback = LogLevel::kDebug;
  }
  if (const char* f = std::getenv("XSILO_LOG_FORMAT"); f != nullptr && *f != '\0') {
    const std::string_view format(f);
    if (format == "json") {
      c->format = LogFormat::kJson;
    } else if (format != "text") {
      const std::string line =
          "xsilo log: XSILO_LOG_FORMAT='" + std::string(format) + "' ignored: text or json\n";
      WriteAll(2, line.data(), line.size());
    }
  }
  return c;
}

const Config& Current() {
  const Config* c = g_config.load(std::memory_order_acquire);
  if (c != nullptr) return *c;
  static std::once_flag once;
  std::call_once(once, [] {
    std::lock_guard<std::mutex> lock(g_set_mu);
    if (g_config.load(std::memory_order_acquire) == nullptr) Publish(FromEnvironment());
  });
  return *g_config.load(std::memory_order_acquire);
}

// A copy of the current configuration, for a setter to change and publish.
template <typename Change>
void Update(Change change) {
  Current();  // the environment is read first, so it never overrides a setter
  std::lock_guard<std::mutex> lock(g_set_mu);
  auto* fresh = new Config(*g_config.load(std::memory_order_acquire));
  change(*fresh);
  Publish(fresh);
}

spdlog::level::level_enum ToSpdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kOff:
      break;
  }
  return spdlog::level::off;
}

// %* in the JSON pattern: the message as the inside of a JSON string.
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    static constexpr char kHex[] = "0123456789abcdef";
    for (const char ch : std::string_view(msg.payload.data(), msg.payload.size())) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == '"' || c == '\\') {
        dest.push_back('\\');
        dest.push_back(ch);
      } else if (c == '\n') {
        dest.append(std::string_view("\\n"));
      } else if (c == '\t') {
        dest.append(std::string_view("\\t"));
      } else if (c < 0x20) {
        const char esc[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
        dest.append(esc, esc + sizeof(esc));
      } else {
        dest.push_back(ch);
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

std::unique_ptr<spdlog::formatter> MakeFormatter(LogFormat format) {
  auto f = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc, "\n");
  if (format == LogFormat::kJson) {
    f->add_flag<JsonEscapedMessage>('*').set_pattern(
        R"({"ts":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","component":"%n","pid":%P,"msg":"%*"})");
  } else {
    f->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ xsilo %n %l: %v");
  }
  return f;
}

}  // namespace

Result<LogLevel> ParseLogLevel(std::string_view name) {
  for (size_t i = 0; i < std::size(kLevelNames); ++i) {
    if (name == kLevelNames[i]) return static_cast<LogLevel>(i);
  }
  if (name == "warning") return LogLevel::kWarn;
  return InvalidArgument("log level '" + std::string(name) +
                         "' is none of trace, debug, info, warn, error, off");
}

Status SetLogSpec(std::string_view spec) {
  XSILO_ASSIGN_OR_RETURN(Parsed p, ParseSpec(spec));
  Update([&](Config& c) {
    c.fallback = p.fallback;
    c.levels = std::move(p.levels);
  });
  return Status::OK();
}

void SetLogFormat(LogFormat format) {
  Update([&](Config& c) { c.format = format; });
}

void SetLogSink(LogSink sink) {
  Update([&](Config& c) {
    c.sink = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
  });
}

void ResetLogConfiguration() {
  Current();
  std::lock_guard<std::mutex> lock(g_set_mu);
  Publish(FromEnvironment());
}

bool LogComponent::enabled(LogLevel level) const {
  const Config& c = Current();
  uint64_t cached = cached_.load(std::memory_order_relaxed);
  if ((cached >> 8) != c.generation) {
    cached = (c.generation << 8) | static_cast<uint64_t>(c.LevelOf(name_));
    cached_.store(cached, std::memory_order_relaxed);
  }
  const auto least = static_cast<LogLevel>(cached & 0xff);
  return level != LogLevel::kOff && least != LogLevel::kOff && level >= least;
}

void LogComponent::Write(LogLevel level, std::string_view message) const {
  const Config& c = Current();
  // A formatter keeps state between lines (the cached time): one per
  // thread and format, never shared.
  thread_local std::unique_ptr<spdlog::formatter> formatters[2];
  auto& formatter = formatters[c.format == LogFormat::kJson ? 1 : 0];
  if (!formatter) formatter = MakeFormatter(c.format);
  const spdlog::details::log_msg msg(spdlog::string_view_t(name_), ToSpdlog(level),
                                     spdlog::string_view_t(message.data(), message.size()));
  spdlog::memory_buf_t line;
  formatter->format(msg, line);
  if (c.sink) {
    (*c.sink)(level, name_, std::string_view(line.data(), line.size() - 1));  // no '\n'
  } else {
    WriteAll(2, line.data(), line.size());
  }
}

}  // namespace xsilo
