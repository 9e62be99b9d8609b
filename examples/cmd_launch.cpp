// ferry launch: prints how to start `ferry train` on several nodes (runtime/tools/launch.h).
//   ferry launch slurm --nodes N (--gpus-per-node G | --ranks-per-node R) --time T
//                [--partition P] [--account A] [--job-name J] [--cpus-per-rank C]
//                [--launcher mpiexec|srun] -- --config FILE [ferry train arguments...]
//   ferry launch mpiexec --hosts FILE [--ranks-per-node R] [--cpus-per-rank C]
//                -- --config FILE [ferry train arguments...]
// Prints the sbatch script or the command on stdout. Exit status: 0 printed; 2 the
// command line or the hosts file is wrong (the message names the option or file:line).
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "examples/commands.h"
#include "runtime/tools/launch.h"

namespace ferry::cli {

namespace {

// The options both modes take; `o` must outlive the parse.
void add_common(CLI::App& mode, runtime::LaunchOptions& o) {
  mode.add_option("--ranks-per-node", o.ranks_per_node, "ranks started on each node")->check(at_least(1));
  mode.add_option("--cpus-per-rank", o.cpus_per_rank, "CPU cores per rank (sets device.threads)")
      ->check(at_least(1));
  mode.add_option("--program", o.program, "the ferry (or ferry-train) executable the ranks run (default: this one)");
  mode.add_option("train-args", o.args, "ferry train's arguments, after --: --config FILE ...");
}

}  // namespace

Run launch_command(CLI::App& cmd) {
  namespace fs = std::filesystem;
  auto o = std::make_shared<runtime::LaunchOptions>();
  // The ranks run this very program's train verb: the build's examples/ folder or an
  // install's bin/, at the same path on every node.
  o->program = fs::canonical("/proc/self/exe").string();
  o->verb = "train";
  cmd.description("print the sbatch script or mpiexec command that starts `ferry train` on several nodes");
  cmd.require_subcommand(1);
  CLI::App* slurm = cmd.add_subcommand("slurm", "an sbatch script for a Slurm allocation");
  slurm->add_option("--nodes", o->nodes, "nodes to allocate")->check(at_least(1));
  slurm->add_option("--gpus-per-node", o->ranks_per_node, "GPUs per node, one rank each")
      ->check(at_least(1))
      ->each([o](const std::string&) { o->gpus = true; });
  slurm->add_option("--time", o->time, "the job's time limit (Slurm's format, e.g. 02:00:00)");
  slurm->add_option("--partition", o->partition, "Slurm partition");
  slurm->add_option("--account", o->account, "Slurm account");
  slurm->add_option("--job-name", o->job_name, "Slurm job name");
  slurm->add_option("--launcher", o->launcher, "what starts the ranks in the allocation: mpiexec | srun");
  add_common(*slurm, *o);
  CLI::App* mpiexec = cmd.add_subcommand("mpiexec", "one mpiexec command over a hosts file");
  mpiexec->add_option("--hosts", o->hosts_file, "hosts file: 'host' or 'host:ranks' per line");
  add_common(*mpiexec, *o);
  return [o, slurm] {
    // ferry train takes options only: a word before `--` is a slip, not one of its arguments.
    if (!o->args.empty() && !o->args.front().starts_with("-")) {
      throw UsageError("unexpected argument '" + o->args.front() + "' (ferry train's arguments come after --)");
    }
    o->program = std::filesystem::absolute(o->program).string();
    // The alias program is the verb already.
    if (std::filesystem::path(o->program).filename() == "ferry-train") o->verb.clear();
    try {
      std::cout << (slurm->parsed() ? runtime::slurm_script(*o) : runtime::mpiexec_command(*o));
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    return 0;
  };
}

}  // namespace ferry::cli
