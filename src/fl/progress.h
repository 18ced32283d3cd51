// A stderr progress line for activities that last more than a second.
#pragma once

#include <chrono>
#include <string>

namespace xsilo::fl {

// Silent for the first second; then, on a terminal, one line rewritten in
// place (at most every 200 ms); elsewhere a new line at most every 5 s.
class ProgressLine {
 public:
  ProgressLine(bool enabled, std::string label);
  ~ProgressLine() { Done(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  void Update(const std::string& status);
  // Ends the line (if anything was printed). Idempotent.
  void Done();

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  bool tty_;
  bool printed_ = false;
  std::string label_, last_status_;
  Clock::time_point start_, last_print_;
};

std::string HumanBytes(double bytes);

}  // namespace xsilo::fl
