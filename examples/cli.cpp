#include "examples/cli.h"

#include <cstdlib>
#include <iostream>
#include <stdexcept>

#include "base/allocator.h"
#include "base/env.h"
#include "base/io_faults.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/config/config.h"

namespace ferry::cli {

namespace {

// The full name of the deepest command that was being parsed: "ferry plan" for an error
// in plan's options.
std::string command_name(const CLI::App& app) {
  const CLI::App* a = &app;
  std::string name = a->get_name();
  while (!a->get_subcommands().empty()) {
    a = a->get_subcommands().front();
    name += " " + a->get_name();
  }
  return name;
}

}  // namespace

bool secondary_rank() {
  for (const char* var : {"PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    const char* v = env_value(var);
    if (v != nullptr && *v != '\0') return std::string(v) != "0";
  }
  return false;
}

int parse_and_run(CLI::App& app, int argc, char** argv, const std::function<Run()>& chosen) {
  keep_freed_memory();
  const bool quiet = secondary_rank();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    if (!quiet) app.exit(e, std::cout, std::cerr);
    return 0;
  } catch (const CLI::CallForAllHelp& e) {
    if (!quiet) app.exit(e, std::cout, std::cerr);
    return 0;
  } catch (const CLI::ParseError& e) {
    if (!quiet) {
      const std::string name = command_name(app);
      std::cerr << name << ": " << e.what() << "\n(run '" << name << " --help' for the options)\n";
    }
    return 2;
  }
  try {
    // Fault injection for trying what a failing disk does to a run (base/io_faults.h).
    const std::string faults = install_io_faults_from_env();
    if (!faults.empty() && !quiet) std::cerr << command_name(app) << ": " << faults << "\n";
  } catch (const std::invalid_argument& e) {
    if (!quiet) std::cerr << command_name(app) << ": " << e.what() << "\n";
    return 2;
  }
  try {
    return chosen()();
  } catch (const UsageError& e) {
    if (!quiet) {
      const std::string name = command_name(app);
      std::cerr << name << ": " << e.what() << "\n(run '" << name << " --help' for the options)\n";
    }
    return 2;
  } catch (const runtime::ConfigError& e) {
    if (!quiet) std::cerr << command_name(app) << ": config error: " << e.what() << "\n";
    return 2;
  } catch (const runtime::CheckpointError& e) {
    if (!quiet && !e.reported_elsewhere) std::cerr << command_name(app) << ": checkpoint refused: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    if (!quiet) std::cerr << command_name(app) << ": " << e.what() << "\n";
    return 1;
  }
}

CLI::Validator at_least(long min) {
  const std::string want = "a whole number >= " + std::to_string(min);
  return CLI::Validator(
      [min, want](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const long n = std::stol(v, &used);
          if (used == v.size() && n >= min) return "";
        } catch (const std::exception&) {
        }
        return "'" + v + "' is not " + want;
      },
      ">=" + std::to_string(min));
}

void add_run_options(CLI::App& cmd, RunOptions& o, bool with_ranks) {
  cmd.add_option("--config", o.config, "the run's configuration (JSON)");
  cmd.add_option("--deepspeed", o.deepspeed,
                 "a DeepSpeed config file (JSON), or an accelerate YAML of distributed_type DEEPSPEED, mapped onto "
                 "ferry's keys");
  cmd.add_option("--fsdp", o.fsdp,
                 "an FSDP config (Hugging Face Trainer fsdp_config JSON, accelerate YAML, or the Trainer's "
                 "words such as \"full_shard offload\"), mapped onto ferry's keys; an accelerate YAML of "
                 "distributed_type DEEPSPEED is read as --deepspeed reads it");
  // One value per --set: KEY=VALUE never swallows the next word.
  cmd.add_option("--set", o.sets, "override one configuration key (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  if (with_ranks) cmd.add_option("--ranks", o.ranks, "ranks of the run (>= 1)")->check(at_least(1));
}

}  // namespace ferry::cli
