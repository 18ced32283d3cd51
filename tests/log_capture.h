// Captures the library's log lines (xsilo/core/log.h) for a test, instead
// of reading stderr.
#pragma once

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "xsilo/core/log.h"

namespace xsilo {

// While alive, every line written goes to lines() instead of stderr, at the
// levels `spec` sets (XSILO_LOG's syntax). Destroyed, the logger is back to
// what the environment says. One at a time.
class LogCapture {
 public:
  explicit LogCapture(std::string_view spec = "info") {
    const Status s = SetLogSpec(spec);
    if (!s.ok()) std::abort();  // a test's own spec: a typo is the test's bug
    // The sink owns what it writes to: a thread that read the configuration
    // just before the reset may still write after this capture is gone.
    SetLogSink([state = state_](LogLevel, std::string_view, std::string_view line) {
      std::lock_guard<std::mutex> lock(state->mu);
      state->lines.emplace_back(line);
    });
  }
  ~LogCapture() { ResetLogConfiguration(); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<std::string> lines() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->lines;
  }
  // Every line, each ending in '\n'.
  std::string text() const {
    std::string out;
    for (const auto& l : lines()) out += l + "\n";
    return out;
  }

 private:
  struct State {
    std::mutex mu;
    std::vector<std::string> lines;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace xsilo
