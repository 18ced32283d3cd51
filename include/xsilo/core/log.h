// The library's one logging seam: levels, per-component names, text or
// JSON lines. spdlog formats the lines behind src/core/log.cpp; nothing
// else includes it.
//
// Configuration (read at the first log call; SetLogSpec/SetLogFormat
// replace it at any time):
//   XSILO_LOG=LEVEL                 every component at LEVEL (default info)
//   XSILO_LOG=hybrid=debug,grpc=warn,info
//                                   per component; a bare LEVEL is the rest's
//   XSILO_LOG_FORMAT=json           one JSON object per line (default text)
//   XSILO_DEBUG=1                   the same as XSILO_LOG=debug (when
//                                   XSILO_LOG is unset)
// LEVEL is trace, debug, info, warn, error or off.
//
// Lines go to stderr, each with one write(2) and no lock, so a process that
// forks while another thread logs leaves its child a working logger. A
// callback (SetLogSink) takes them instead.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>

#include "xsilo/core/status.h"

namespace xsilo {

enum class LogLevel : uint8_t { kTrace, kDebug, kInfo, kWarn, kError, kOff };

// "debug" -> kDebug; an unknown name is InvalidArgument naming the levels.
Result<LogLevel> ParseLogLevel(std::string_view name);

// Replaces the levels: "LEVEL" or "NAME=LEVEL,...,LEVEL" (XSILO_LOG's
// syntax). A bad spec is InvalidArgument and changes nothing.
Status SetLogSpec(std::string_view spec);

enum class LogFormat { kText, kJson };
// kText: `2026-12-07T20:41:02.123Z xsilo hybrid debug: <message>`
// kJson: {"ts":"...","level":"debug","component":"hybrid","pid":N,"msg":"..."}
void SetLogFormat(LogFormat format);

// Receives every line written, formatted and without its newline, instead
// of stderr; an empty function restores stderr. Called on the logging
// thread, possibly from several threads at once.
using LogSink =
    std::function<void(LogLevel level, std::string_view component, std::string_view line)>;
void SetLogSink(LogSink sink);

// Back to what the environment says (levels and format, stderr), as at
// the first log call.
void ResetLogConfiguration();

// A named source of log lines ("grpc", "hybrid", "compression", ...),
// defined once per file as `constinit LogComponent kLog("hybrid");`.
// enabled() costs two relaxed atomic loads.
class LogComponent {
 public:
  explicit constexpr LogComponent(const char* name) : name_(name) {}
  LogComponent(const LogComponent&) = delete;
  LogComponent& operator=(const LogComponent&) = delete;

  const char* name() const { return name_; }
  bool enabled(LogLevel level) const;
  // Writes one line at `level` (whether or not enabled: callers check).
  void Write(LogLevel level, std::string_view message) const;

 private:
  const char* name_;
  // (configuration generation << 8) | level; 0 before the first look.
  mutable std::atomic<uint64_t> cached_{0};
};

}  // namespace xsilo

// XSILO_LOG(kLog, kDebug, "stored " << bytes << " bytes"): the message is
// built only when the component logs at that level.
#define XSILO_LOG(component, level, ...)                                    \
  do {                                                                      \
    if ((component).enabled(::xsilo::LogLevel::level)) {                    \
      std::ostringstream xsilo_log_stream_;                                 \
      xsilo_log_stream_ << __VA_ARGS__;                                     \
      (component).Write(::xsilo::LogLevel::level, xsilo_log_stream_.str()); \
    }                                                                       \
  } while (false)
