// Which GPU a rank uses, and the check that no two ranks of a node share one.
//
// Two launch styles are both common: every rank sees every GPU of its node (plain mpiexec;
// the rank takes the GPU of its local rank) or the launcher binds each rank to its own GPU
// (Slurm --gpus-per-task=1, --gpu-bind, site wrappers setting CUDA_VISIBLE_DEVICES per
// rank; the rank sees one GPU, ordinal 0). Anything else (2 GPUs visible to each of 8 ranks)
// is ambiguous and refused. Because a per-rank binding can be wrong (two ranks given the
// same GPU), the choice is checked after the fact by comparing the GPUs' PCI bus ids over
// the node: the one thing that names a physical GPU whatever CUDA_VISIBLE_DEVICES says.
// No CUDA here: callers pass the device count and the bus id (cudaDeviceGetPCIBusId).
#pragma once

#include <string>

#include "comm/communicator.h"

namespace ferry::comm {

struct GpuChoice {
  int ordinal = -1;     // the CUDA ordinal to use; -1 with a problem
  std::string problem;  // why no GPU can be chosen ("" when ordinal is set)
};

// ordinal = local_rank when gpus >= local_size; 0 when gpus == 1 (a per-rank binding);
// otherwise the problem, naming both counts. Pure; thread safe.
GpuChoice choose_gpu(int gpus, int local_rank, int local_size);

// Collective over `comm` (every rank calls it, in the same place): all-gathers each rank's
// host name and `bus_id` and returns "" when no two ranks on one host have the same bus
// id, else the problem naming both ranks and the bus id (the same text on every rank, so
// every rank can fail with it and none is left waiting). Host buffers: `comm` must move
// host memory (MPI). Throws CommError as the collectives do.
std::string shared_gpu_problem(Communicator& comm, const std::string& bus_id);

}  // namespace ferry::comm
