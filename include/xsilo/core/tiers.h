// The model-size tiers of the paper (shared/data/link-profiles.json).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace xsilo {

struct ModelTier {
  std::string_view name;
  std::string_view model;  // the model the paper used at this size
  uint64_t parameters;     // float32 parameters
};

inline constexpr std::array<ModelTier, 4> kModelTiers = {{
    {"small", "ResNet56", 591322},
    {"medium", "MobileNetV3", 5152518},
    {"big", "DistilBERT", 66362880},
    {"large", "ViT-Large", 307432234},
}};

inline std::optional<ModelTier> FindTier(std::string_view name) {
  for (const auto& t : kModelTiers) {
    if (t.name == name) return t;
  }
  return std::nullopt;
}

}  // namespace xsilo
