#pragma once

namespace xsilo {
inline constexpr const char* kVersion = "0.1.0";
}  // namespace xsilo
