// ferry: one program, git-style verbs, parsed by CLI11 (cli.h):
//   ferry train    train the model a configuration describes (cmd_train.cpp; also ferry-train)
//   ferry launch   print how to start `ferry train` on several nodes (cmd_launch.cpp)
//   ferry plan     bytes per rank in every memory tier, and a step-time estimate (cmd_plan.cpp)
//   ferry doctor   check this machine against what a run needs (cmd_doctor.cpp)
//   ferry export   a checkpoint's consolidated weights as safetensors (cmd_export.cpp)
//   ferry plot     loss and throughput curves of a metrics file (cmd_plot.cpp)
//   ferry config   write a ready DeepSpeed ds_config.json or ferry configuration from flags (cmd_config.cpp)
//   ferry bench    the benchmarks: runs the program ferry-bench beside this one (ferry_bench.cpp)
// `ferry --help` lists the verbs, `ferry VERB --help` a verb's options.
// Exit status: 0 done; 1 the input was refused or the run failed; 2 the command line or a
// configuration is wrong (examples/cli.h: the one mapping from what a verb throws).
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "examples/cli.h"
#include "examples/commands.h"

namespace {

// `ferry bench ARGS` is `ferry-bench ARGS`, the program built beside this one: the benchmarks
// (and their Eigen reference GEMMs, peers and reports) stay out of the program that trains,
// so `make run` builds neither. exec keeps the pid, the environment and the exit status, so
// mpiexec and scripts see one program. Returns only when ferry-bench cannot be started.
int run_bench(int argc, char** argv) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path bench = (ec ? std::filesystem::path(argv[0]) : self).parent_path() / "ferry-bench";
  std::vector<char*> args;
  args.push_back(const_cast<char*>("ferry-bench"));
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(bench.c_str(), args.data());
  if (!ferry::cli::secondary_rank()) {
    std::cerr << "ferry bench: cannot start " << bench.string() << ": " << std::strerror(errno)
              << " (the benchmarks are the program ferry-bench, built beside ferry: cmake --build BUILD --target "
                 "ferry-bench)\n";
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry::cli;
  if (argc > 1 && std::strcmp(argv[1], "bench") == 0) return run_bench(argc, argv);
  CLI::App app("ferry: trains transformer LMs with ZeRO sharding over MPI ranks, offload to host memory and NVMe",
               "ferry");
  app.require_subcommand(1);
  std::map<std::string, Run> verbs;
  const auto verb = [&](const char* name, Run (*command)(CLI::App&)) {
    verbs[name] = command(*app.add_subcommand(name));
  };
  verb("train", train_command);
  verb("launch", launch_command);
  verb("plan", plan_command);
  verb("doctor", doctor_command);
  verb("export", export_command);
  verb("plot", plot_command);
  verb("tokenize", tokenize_command);
  verb("config", config_command);
  // Listed by --help; main hands `ferry bench ...` to ferry-bench before parsing.
  app.add_subcommand("bench",
                     "the benchmarks: ferry against a reference measured in the same run (model, attention, comm, "
                     "adam, io, ckpt, step, tokenize; `ferry bench --help`)");
  // CLI11 would call an unknown verb an unexpected argument; say what it is.
  if (argc > 1 && argv[1][0] != '-' && verbs.count(argv[1]) == 0) {
    if (!secondary_rank()) {
      std::cerr << "ferry: unknown verb '" << argv[1] << "' (verbs:";
      for (const auto& [name, run] : verbs) std::cerr << " " << name;
      std::cerr << " bench; run 'ferry --help')\n";
    }
    return 2;
  }
  return parse_and_run(app, argc, argv, [&] { return verbs.at(app.get_subcommands().front()->get_name()); });
}
