// ferry launch: the command lines and batch scripts that start `ferry train` on several
// nodes, printed for the user to read, keep and submit (nothing is run).
//   slurm:   an sbatch script; inside the allocation either MPICH's mpiexec (Hydra finds
//            the nodes through Slurm and starts ranks with srun) or srun itself with PMI
//            (--launcher srun, where the MPI library was built with Slurm's PMI).
//   mpiexec: one mpiexec command over a hosts file ("host" or "host:ranks" per line).
// With --max-restarts the slurm script restarts the job in its allocation from the latest
// checkpoint; `ferry launch mpiexec --max-restarts` runs the job itself (restarts.h).
// Paths to the program and to --config/--deepspeed files are made absolute: every node
// must see them at the same path (a shared file system or an identical install).
// Errors (std::invalid_argument) name the option or the hosts file and line.
#pragma once

#include <string>
#include <vector>

namespace ferry::runtime {

struct LaunchOptions {
  int nodes = 1;
  int ranks_per_node = 1;         // --gpus-per-node (one rank per GPU) or --ranks-per-node
  bool gpus = false;              // --gpus-per-node given: request GPUs from Slurm
  int cpus_per_rank = 0;          // 0: not requested; OMP_NUM_THREADS follows Slurm's value
  std::string time, partition, account, job_name = "ferry", output = "ferry-%j.out";
  std::string launcher = "mpiexec";  // slurm only: mpiexec | srun
  std::string hosts_file;            // mpiexec only
  std::string program;               // absolute path of ferry (or of ferry-train, with verb "")
  std::string verb = "train";        // the program's verb, first on its command line ("": none)
  std::vector<std::string> args;     // the train verb's arguments
  int max_restarts = -1;             // slurm: >= 0 wraps mpiexec/srun in a restart loop
  std::string log_dir;               // each rank's stdout and stderr there (--set log.rank_logs; made absolute)
};

// The arguments the launcher adds to ferry train's (--cpus-per-rank, --log-dir), after them.
std::vector<std::string> launcher_train_args(const LaunchOptions& o);

struct HostEntry {
  std::string host;
  int ranks = 0;  // 0: not given in the file (ranks_per_node applies)
  int ranks_or(int ranks_per_node) const { return ranks > 0 ? ranks : ranks_per_node; }
};
std::vector<HostEntry> read_hosts_file(const std::string& path);

std::string slurm_script(const LaunchOptions& o);
std::string mpiexec_command(const LaunchOptions& o);

// Single-quotes `s` for a POSIX shell where it holds anything but [A-Za-z0-9_./:=,+-@%].
std::string shell_quote(const std::string& s);

}  // namespace ferry::runtime
