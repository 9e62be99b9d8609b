// ferry-train: trains the model a configuration describes.
//   ferry-train --config FILE [--set key.path=value ...]
//   ferry-train --help-config
// Exit status: 0 done; 1 the run failed (out of device memory, bad data, non-finite loss);
// 2 the configuration or the command line is wrong.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "nn/device.h"
#include "runtime/allocator.h"
#include "runtime/config.h"
#include "runtime/trainer.h"
#include "runtime/version.h"

namespace {

void usage(std::ostream& os) {
  os << "usage: ferry-train --config FILE [--set key.path=value ...]\n"
        "       ferry-train --help-config     (every configuration key, its default and meaning)\n";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry;
  std::string config_path;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--config" || arg == "--set") && i + 1 < argc) {
      (arg == "--config" ? config_path = argv[++i] : overrides.emplace_back(argv[++i]));
    } else if (arg.starts_with("--set=")) {
      overrides.push_back(arg.substr(6));
    } else if (arg == "--help-config") {
      std::cout << runtime::describe_knobs();
      return 0;
    } else if (arg == "--help" || arg == "-h") {
      usage(std::cout);
      return 0;
    } else {
      std::cerr << "ferry-train: unknown argument '" << arg << "'\n";
      usage(std::cerr);
      return 2;
    }
  }
  if (config_path.empty()) {
    usage(std::cerr);
    return 2;
  }
  runtime::Config config;
  try {
    config = runtime::load_config(config_path, overrides);
  } catch (const runtime::ConfigError& e) {
    std::cerr << "ferry-train: config error: " << e.what() << "\n";
    return 2;
  }
  std::cout << "ferry " << kVersion << " | allocator " << runtime::allocator_name() << "\n"
            << "resolved config (" << config_path << (overrides.empty() ? "" : " + --set") << "):\n"
            << config.resolved.dump(2) << "\n";
  try {
    comm::SingleProcessCommunicator comm;
    runtime::Trainer trainer(config, comm, std::cout);
    trainer.run();
  } catch (const nn::OutOfDeviceMemory& e) {
    std::cerr << "ferry-train: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ferry-train: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
