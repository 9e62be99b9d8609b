// SIGTERM and SIGINT (Slurm's preemption notice, Ctrl-C): the first asks the trainer to
// finish the current step, write a checkpoint and exit 0; a second one exits at once with
// status 128 + signal. The handler only sets a flag (async-signal-safe); the trainer polls
// it once per step and agrees with the other ranks (mpiexec may signal only some).
#pragma once

namespace ferry::runtime {

void install_stop_handlers();
int stop_signal();  // 0, or the first signal received
void request_stop(int signal);  // as if `signal` had arrived (tests)

}  // namespace ferry::runtime
