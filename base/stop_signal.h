// SIGTERM and SIGINT (Slurm's preemption notice, Ctrl-C): the first asks the trainer to
// finish the current step, write a checkpoint and exit 0; a second one exits at once with
// status 128 + signal, having removed the scratch files (base/scratch_files.h), unless it
// comes within kDuplicateWindowNs of the first: the same request delivered twice (Slurm
// signals the ranks and mpiexec forwards too; timeout(1) signals its child and its process
// group) must not cost the checkpoint. The handler only
// sets a flag (async-signal-safe); the trainer polls it once per step and agrees with the
// other ranks (mpiexec may signal only some).
#pragma once

#include <cstdint>

namespace ferry {

inline constexpr int64_t kDuplicateWindowNs = 2'000'000'000;

void install_stop_handlers();
int stop_signal();  // 0, or the first signal received
void request_stop(int signal);  // as if `signal` had arrived (tests)

}  // namespace ferry
