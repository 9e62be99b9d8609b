// ferry's verbs. Each adds its options (and its own sub-commands, if any) to `cmd`, an
// empty CLI::App that the caller owns and keeps alive, and returns what runs the verb once
// the command line has parsed (cli::parse_and_run). The options are held by the returned
// Run, so `cmd` may be a sub-command of `ferry` or a program's top-level App (ferry-train).
// The bench verb lives in benchmarks/bench_cli.h, in the program ferry-bench (ferry_bench.cpp).
#pragma once

#include "examples/cli.h"

namespace ferry::cli {

Run train_command(CLI::App& cmd);   // cmd_train.cpp
Run launch_command(CLI::App& cmd);  // cmd_launch.cpp
Run plan_command(CLI::App& cmd);    // cmd_plan.cpp
Run doctor_command(CLI::App& cmd);  // cmd_doctor.cpp
Run export_command(CLI::App& cmd);  // cmd_export.cpp
Run plot_command(CLI::App& cmd);    // cmd_plot.cpp
Run tokenize_command(CLI::App& cmd);  // cmd_tokenize.cpp
Run config_command(CLI::App& cmd);  // cmd_config.cpp

}  // namespace ferry::cli
