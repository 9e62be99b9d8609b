#include "base/env.h"

#include <cstdlib>
#include <stdexcept>

namespace ferry {

const std::vector<EnvVariable>& environment_variables() {
  // Never destroyed: the log reads its variables on first use, which can be on an exit path
  // after static destructors have run.
  static const auto* vars = new std::vector<EnvVariable>{
      {"FERRY_LOG", "warn",
       "diagnostic lines on stderr up to this level: error, warn, info (what was set up where), debug (per step), "
       "trace (per unit); each line prefixed [ferry host:pid rank LEVEL subsystem]"},
      {"FERRY_LOG_SUBSYS", "all",
       "subsystems whose info/debug/trace lines print, comma-separated, ^name excludes: init, config, comm, offload, "
       "sched, optim, ckpt, train"},
      {"FERRY_CUDA_SYNC", "0",
       "1: on GPUs, wait for the device and check for an error after every op and every NCCL collective, so an "
       "asynchronous fault names the op that caused it (slow; for debugging)"},
      {"FERRY_IO_FAULTS", "-",
       "SEED:PROBABILITY[:KINDS[:PATH-PREFIX]] fails that share of the file operations under the prefix (kinds eio, "
       "enospc, short, torn, delay; base/io_faults.h): what a failing disk does to a run"},
      {"FERRY_PEERS_PYTHON", "-",
       "a Python with torch (scripts/make_peers_env.sh): ferry bench measures PyTorch and DeepSpeed beside ferry "
       "with it (as --peers or --python)"},
      {"FERRY_FAULT_SKIP_COLLECTIVE", "-", "tests only: RANK:SEQ makes that rank skip that collective (watchdog test)"},
      {"FERRY_FAULT_KILL_IN_CHECKPOINT", "-", "tests only: RANK:STEP kills that rank while it writes that checkpoint"},
      {"PMI_RANK", "-", "set by MPICH's mpiexec: a rank other than 0 prints no help or command-line errors", false},
      {"OMPI_COMM_WORLD_RANK", "-", "set by Open MPI's mpirun: as PMI_RANK", false},
      {"SLURM_PROCID", "-", "set by srun: as PMI_RANK", false},
      {"CUDA_VISIBLE_DEVICES", "-", "CUDA's list of the GPUs a process sees: ferry doctor --gpu reports it", false},
      {"MPIR_CVAR_ENABLE_GPU", "-",
       "MPICH's switch for its GPU support: ferry doctor --gpu checks whether MPI_Init touches CUDA", false},
      {"NVIDIA_TF32_OVERRIDE", "-", "NVIDIA's switch for TF32 in cuBLAS: ferry doctor --gpu reports it", false},
  };
  return *vars;
}

const char* env_value(const char* name) {
  for (const EnvVariable& v : environment_variables()) {
    if (v.name == name) return std::getenv(name);
  }
  throw std::logic_error(std::string("env_value: ") + name + " is not declared in base/env.cpp");
}

}  // namespace ferry
