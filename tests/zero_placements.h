// Every placement of ZeRO's states a stage allows, as the `zero_optimization` block of a
// trainer configuration: the optimizer in device memory, cpu memory or on nvme (from stage
// 1), and at stage 3 the parameters too; nvme files under `nvme`, parameter buffers small
// (4096 elements) so that a tiny model still spans several. For the tests that run one
// model through all of them and expect the same losses.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ferry::test {

// (label such as "optimizer cpu, parameters nvme", zero_optimization block), stage's own first.
inline std::vector<std::pair<std::string, nlohmann::json>> zero_placements(int stage, const std::string& nvme) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  for (const char* opt : {"none", "cpu", "nvme"}) {
    for (const char* par : {"none", "cpu", "nvme"}) {
      if (stage < 3 && std::string(par) != "none") continue;
      if (stage == 0 && std::string(opt) != "none") continue;
      out.emplace_back(std::string("optimizer ") + opt + ", parameters " + par,
                       nlohmann::json{{"stage", stage},
                                      {"offload_optimizer", {{"device", opt}, {"nvme_path", nvme}}},
                                      {"offload_param", {{"device", par}, {"nvme_path", nvme}, {"buffer_size", 4096}}}});
    }
  }
  return out;
}

}  // namespace ferry::test
