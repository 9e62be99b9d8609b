// ferry-launch: prints how to start ferry-train on several nodes (runtime/tools/launch.h).
//   ferry-launch slurm --nodes N (--gpus-per-node G | --ranks-per-node R) --time T
//                [--partition P] [--account A] [--job-name J] [--cpus-per-rank C]
//                [--launcher mpiexec|srun] -- --config FILE [ferry-train arguments...]
//   ferry-launch mpiexec --hosts FILE [--ranks-per-node R] [--cpus-per-rank C]
//                -- --config FILE [ferry-train arguments...]
// Prints the sbatch script or the command on stdout. Exit status: 0 printed; 2 the
// command line or the hosts file is wrong (the message names the option or file:line).
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "runtime/tools/launch.h"

namespace {

void usage(std::ostream& os) {
  os << "usage: ferry-launch slurm --nodes N (--gpus-per-node G | --ranks-per-node R) --time T [--partition P]\n"
        "                    [--account A] [--job-name J] [--cpus-per-rank C] [--launcher mpiexec|srun]\n"
        "                    -- --config FILE [ferry-train arguments...]\n"
        "       ferry-launch mpiexec --hosts FILE [--ranks-per-node R] [--cpus-per-rank C]\n"
        "                    -- --config FILE [ferry-train arguments...]\n";
}

int positive(const std::string& option, const std::string& value) {
  try {
    size_t used = 0;
    const int v = std::stoi(value, &used);
    if (used == value.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(option + " must be a positive integer, got '" + value + "'");
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  using ferry::runtime::LaunchOptions;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--help" || mode == "-h") {
    usage(std::cout);
    return 0;
  }
  if (mode != "slurm" && mode != "mpiexec") {
    std::cerr << "ferry-launch: expected 'slurm' or 'mpiexec', got '" << mode << "'\n";
    usage(std::cerr);
    return 2;
  }
  LaunchOptions o;
  // ferry-train beside this program (the build's examples/ folder, or an install's bin/).
  o.program = (fs::canonical("/proc/self/exe").parent_path() / "ferry-train").string();
  try {
    int i = 2;
    for (; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--") {
        ++i;
        break;
      }
      if (i + 1 >= argc) throw std::invalid_argument("option '" + arg + "' needs a value (or is unknown)");
      const std::string value = argv[++i];
      if (arg == "--nodes") o.nodes = positive(arg, value);
      else if (arg == "--gpus-per-node") o.ranks_per_node = positive(arg, value), o.gpus = true;
      else if (arg == "--ranks-per-node") o.ranks_per_node = positive(arg, value);
      else if (arg == "--cpus-per-rank") o.cpus_per_rank = positive(arg, value);
      else if (arg == "--time") o.time = value;
      else if (arg == "--partition") o.partition = value;
      else if (arg == "--account") o.account = value;
      else if (arg == "--job-name") o.job_name = value;
      else if (arg == "--launcher") o.launcher = value;
      else if (arg == "--hosts") o.hosts_file = value;
      else if (arg == "--program") o.program = fs::absolute(value).string();
      else throw std::invalid_argument("unknown option '" + arg + "'");
    }
    for (; i < argc; ++i) o.args.emplace_back(argv[i]);
    std::cout << (mode == "slurm" ? ferry::runtime::slurm_script(o) : ferry::runtime::mpiexec_command(o));
  } catch (const std::invalid_argument& e) {
    std::cerr << "ferry-launch " << mode << ": " << e.what() << "\n";
    usage(std::cerr);
    return 2;
  }
  return 0;
}
