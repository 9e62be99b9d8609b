// ferry launch: prints how to start `ferry train` on several nodes (runtime/tools/launch.h).
//   ferry launch slurm --nodes N (--gpus-per-node G | --ranks-per-node R) --time T
//                [--partition P] [--account A] [--job-name J] [--cpus-per-rank C] [--log-dir DIR]
//                [--launcher mpiexec|srun] -- --config FILE [ferry train arguments...]
//   ferry launch mpiexec --hosts FILE [--ranks-per-node R] [--cpus-per-rank C] [--log-dir DIR]
//                [--max-restarts N [--min-nodes M] [--launcher-exec SCRIPT]]
//                -- --config FILE [ferry train arguments...]
// Prints the sbatch script or the command on stdout. Exit status: 0 printed; 2 the
// command line or the hosts file is wrong (the message names the option or file:line).
// mpiexec --max-restarts runs the job instead (runtime/tools/restarts.h) and exits with
// its last attempt's status.
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "examples/commands.h"
#include "runtime/tools/launch.h"
#include "runtime/tools/restarts.h"

namespace ferry::cli {

namespace {

// The options both modes take; `o` must outlive the parse.
void add_common(CLI::App& mode, runtime::LaunchOptions& o) {
  mode.add_option("--ranks-per-node", o.ranks_per_node, "ranks started on each node")->check(at_least(1));
  mode.add_option("--cpus-per-rank", o.cpus_per_rank, "CPU cores per rank (sets device.threads)")
      ->check(at_least(1));
  mode.add_option("--log-dir", o.log_dir,
                  "each rank's stdout and stderr in DIR/rankN.out and rankN.err (torchrun's --log-dir); rank 0's "
                  "stdout and every rank's stderr still print here too");
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
  slurm->add_option("--max-restarts", o->max_restarts,
                    "restart the job in its allocation up to N times, each from the latest checkpoint")
      ->check(at_least(0));
  add_common(*slurm, *o);
  CLI::App* mpiexec = cmd.add_subcommand("mpiexec", "one mpiexec command over a hosts file");
  mpiexec->add_option("--hosts", o->hosts_file, "hosts file: 'host' or 'host:ranks' per line");
  auto r = std::make_shared<runtime::RestartOptions>();
  mpiexec->add_option("--max-restarts", o->max_restarts,
                      "run the job here and restart it up to N times after a failure, each from the latest "
                      "checkpoint (torchrun's --max-restarts); without it the command is printed")
      ->check(at_least(0));
  mpiexec->add_option("--min-nodes", r->min_nodes,
                      "with --max-restarts: go on over the hosts that still answer if at least this many do, "
                      "re-sharding the checkpoint (default: every host)")
      ->check(at_least(1));
  mpiexec->add_option("--launcher-exec", r->launcher_exec,
                      "with --max-restarts: what Hydra runs instead of ssh to reach a host (-launcher-exec)");
  mpiexec->add_option("--probe-timeout", r->probe_timeout_s, "with --max-restarts: seconds a host has to answer")
      ->check(at_least(1));
  add_common(*mpiexec, *o);
  return [o, r, slurm, mpiexec] {
    // ferry train takes options only: a word before `--` is a slip, not one of its arguments.
    if (!o->args.empty() && !o->args.front().starts_with("-")) {
      throw UsageError("unexpected argument '" + o->args.front() + "' (ferry train's arguments come after --)");
    }
    o->program = std::filesystem::absolute(o->program).string();
    // The alias program is the verb already.
    if (std::filesystem::path(o->program).filename() == "ferry-train") o->verb.clear();
    try {
      if (mpiexec->parsed() && o->max_restarts >= 0) {
        r->max_restarts = o->max_restarts;
        return runtime::supervise(*o, *r, std::cerr);
      }
      if (mpiexec->parsed() && (r->min_nodes > 0 || !r->launcher_exec.empty())) {
        throw std::invalid_argument("--min-nodes and --launcher-exec go with --max-restarts (which runs the job)");
      }
      std::cout << (slurm->parsed() ? runtime::slurm_script(*o) : runtime::mpiexec_command(*o));
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    return 0;
  };
}

}  // namespace ferry::cli
