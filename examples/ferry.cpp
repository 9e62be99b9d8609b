// ferry: one program, git-style verbs, parsed by CLI11 (cli.h):
//   ferry train    train the model a configuration describes (cmd_train.cpp; also ferry-train)
//   ferry launch   print how to start `ferry train` on several nodes (cmd_launch.cpp)
//   ferry plan     bytes per rank in every memory tier, and a step-time estimate (cmd_plan.cpp)
//   ferry doctor   check this machine against what a run needs (cmd_doctor.cpp)
//   ferry export   a checkpoint's consolidated weights as safetensors (cmd_export.cpp)
//   ferry plot     loss and throughput curves of a metrics file (cmd_plot.cpp)
//   ferry config   write a ready DeepSpeed ds_config.json or ferry configuration from flags (cmd_config.cpp)
//   ferry bench    the benchmarks (benchmarks/bench_cli.cpp)
// `ferry --help` lists the verbs, `ferry VERB --help` a verb's options.
// Exit status: 0 done; 1 the input was refused or the run failed; 2 the command line or a
// configuration is wrong (examples/cli.h: the one mapping from what a verb throws).
#include <iostream>
#include <map>
#include <string>

#include "benchmarks/bench_cli.h"
#include "examples/cli.h"
#include "examples/commands.h"

int main(int argc, char** argv) {
  using namespace ferry::cli;
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
  verbs["bench"] = ferry::bench::bench_command(*app.add_subcommand("bench"));
  // CLI11 would call an unknown verb an unexpected argument; say what it is.
  if (argc > 1 && argv[1][0] != '-' && verbs.count(argv[1]) == 0) {
    if (!secondary_rank()) {
      std::cerr << "ferry: unknown verb '" << argv[1] << "' (verbs:";
      for (const auto& [name, run] : verbs) std::cerr << " " << name;
      std::cerr << "; run 'ferry --help')\n";
    }
    return 2;
  }
  return parse_and_run(app, argc, argv, [&] { return verbs.at(app.get_subcommands().front()->get_name()); });
}
