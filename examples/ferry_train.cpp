// ferry-train: `ferry train` as a program of its own, for the command lines, scripts and
// job files written for it. A separate small executable rather than a symlink dispatching
// on argv[0]: launchers may copy or rename the binary they start (srun --bcast names its
// copy slurm_bcast_<job>...), and a real file installs and copies like any other.
// Options, output and exit status are exactly `ferry train`'s (cmd_train.cpp).
#include "examples/cli.h"
#include "examples/commands.h"

int main(int argc, char** argv) {
  CLI::App app("", "ferry-train");  // train_command sets the description
  const ferry::cli::Run run = ferry::cli::train_command(app);
  return ferry::cli::parse_and_run(app, argc, argv, [&] { return run; });
}
