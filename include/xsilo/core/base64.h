// Standard base64 (RFC 4648, with padding).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xsilo {

std::string Base64Encode(std::span<const uint8_t> bytes);
// nullopt on a character outside the alphabet or bad padding.
std::optional<std::vector<uint8_t>> Base64Decode(std::string_view text);

}  // namespace xsilo
