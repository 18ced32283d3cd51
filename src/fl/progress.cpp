#include "fl/progress.h"

#include <unistd.h>

#include <cstdio>

namespace xsilo::fl {

ProgressLine::ProgressLine(bool enabled, std::string label)
    : enabled_(enabled),
      tty_(isatty(STDERR_FILENO) != 0),
      label_(std::move(label)),
      start_(Clock::now()) {}

void ProgressLine::Update(const std::string& status) {
  if (!enabled_) return;
  last_status_ = status;
  const auto now = Clock::now();
  if (now - start_ < std::chrono::seconds(1)) return;
  const auto every = tty_ ? std::chrono::milliseconds(200) : std::chrono::milliseconds(5000);
  if (printed_ && now - last_print_ < every) return;
  const double s = std::chrono::duration<double>(now - start_).count();
  if (tty_) {
    std::fprintf(stderr, "\r\033[K  %s: %s (%.1f s)", label_.c_str(), status.c_str(), s);
  } else {
    std::fprintf(stderr, "  %s: %s (%.1f s)\n", label_.c_str(), status.c_str(), s);
  }
  std::fflush(stderr);
  printed_ = true;
  last_print_ = now;
}

void ProgressLine::Done() {
  if (!enabled_ || !printed_) return;
  if (tty_) {
    const double s = std::chrono::duration<double>(Clock::now() - start_).count();
    std::fprintf(stderr, "\r\033[K  %s: %s, done in %.1f s\n", label_.c_str(), last_status_.c_str(),
                 s);
    std::fflush(stderr);
  }
  printed_ = false;
  enabled_ = false;
}

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

}  // namespace xsilo::fl
