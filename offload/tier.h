// The tiers a state can live in (ZeRO-Infinity's), as a type: the configuration's words
// ("none", "cpu", "nvme" of zero_optimization.offload_optimizer/offload_param.device) are
// read into it once, where the configuration is read (runtime/config/config_schema.cpp),
// and written back from it only where a word is shown; everything between compares Tiers.
// Header only, no dependencies: runtime/config's sections and offload's stores both use it.
#pragma once

#include <optional>
#include <ostream>
#include <string_view>

namespace ferry::offload {

enum class Tier {
  device,  // the device arena ("none": not offloaded)
  cpu,     // host memory (page-locked on a GPU run)
  nvme,    // files under nvme_path, staged through the pinned pool
};

// The configuration's word for a tier: "none", "cpu" or "nvme".
constexpr const char* tier_word(Tier t) {
  switch (t) {
    case Tier::device: return "none";
    case Tier::cpu: return "cpu";
    case Tier::nvme: return "nvme";
  }
  return "?";
}

// The tier a configuration word names; nullopt for any other word (the caller's error
// names its key or flag and the allowed words).
constexpr std::optional<Tier> tier_from_word(std::string_view word) {
  for (Tier t : {Tier::device, Tier::cpu, Tier::nvme}) {
    if (word == tier_word(t)) return t;
  }
  return std::nullopt;
}

inline std::ostream& operator<<(std::ostream& os, Tier t) { return os << tier_word(t); }  // tests' messages

}  // namespace ferry::offload
