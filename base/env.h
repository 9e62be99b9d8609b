// The environment variables ferry reads, each declared once here with its default and
// meaning: ferry's own (FERRY_*: `ferry train --help-config` prints them after the
// configuration keys, docs/config-keys.md is that output, checked by a test) and those other
// programs set that ferry reads (the MPI launchers' rank, CUDA's device list, ...).
// Every read goes through env_value, which refuses a name not declared here
// (std::logic_error), so a new variable is documented where it is added; one that CLI11
// reads as an option's fallback (->envname, FERRY_PEERS_PYTHON) is declared here too.
// Thread-safe for reads: the list is built once; getenv itself is safe while nothing calls
// setenv (ferry calls setenv once, before NCCL starts, for a variable it does not read).
#pragma once

#include <string>
#include <vector>

namespace ferry {

struct EnvVariable {
  std::string name;
  std::string default_value;  // "-": none
  std::string description;
  bool ferrys = true;  // false: set by another program (mpiexec, Slurm, CUDA), read by ferry
};

// Every variable ferry reads, ferry's own first, in the order --help-config prints them.
const std::vector<EnvVariable>& environment_variables();

// getenv(name) for a declared name: nullptr where unset. A name that environment_variables()
// does not declare throws std::logic_error (a programming error, never the user's).
const char* env_value(const char* name);

}  // namespace ferry
