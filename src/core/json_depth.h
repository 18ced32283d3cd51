// Private: a bound on the nesting of untrusted JSON before it is parsed.
// nlohmann builds the whole tree of a document before a caller can refuse
// it: a 63 MiB header of "[[[...]]]" cost a receiver 2.6 GB
// (docs/reliability.md, "Load, faults and malformed input at scale").
#pragma once

#include <string_view>

namespace xsilo::core_detail {

// The deepest nesting this codebase's headers use is 3 (a message's
// params); a document nested deeper than this is refused unparsed.
inline constexpr int kMaxJsonDepth = 64;

// Whether no array or object in `text` is nested deeper than max_depth.
// Brackets inside strings (with their escapes) do not count. Linear, no
// allocation; says nothing about whether the text is valid JSON.
inline bool JsonDepthAtMost(std::string_view text, int max_depth = kMaxJsonDepth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

}  // namespace xsilo::core_detail
