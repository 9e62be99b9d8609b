// ferry doctor: checks, before a run, what would stop it or slow it down on this machine,
// and says how to fix each problem:
//   mpi       a 2-rank loopback all-reduce through mpiexec (the program re-run as ranks)
//   io_uring  a ring can be created (kernels or containers may forbid it: pread/pwrite then)
//   nvme      for each nvme_path of the configuration: a folder that exists and takes
//             files, O_DIRECT writes and reads that round-trip, free space for the
//             offloaded state of every rank on this node. A missing folder is ok when
//             `ferry train` can create it (its nearest existing ancestor is a writable
//             folder: the O_DIRECT and space checks run there), a failure naming why
//             otherwise (a file or a dangling link in the way, an ancestor not writable).
//             The doctor creates no folder (the O_DIRECT probe's file is removed).
//   memlock   RLIMIT_MEMLOCK against the pinned pool the configuration needs
//   memory    available host memory against the host state, pinned pools and (CPU
//             device) arenas of every rank on this node
//   cuda      driver version and GPU count (libcuda, loaded if present; the GPU's own
//             checks are `ferry doctor --gpu`, runtime/tools/doctor_gpu.h)
//   nccl      library version (libnccl, loaded if present)
// Each check is ok, warn (the run works, slower or without a feature) or fail (the run
// would stop); the process exits non-zero when one fails.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/config/config.h"

namespace ferry::runtime {

struct DoctorCheck {
  enum Status { ok, warn, fail } status = ok;
  std::string name, detail, fix;  // fix: "" when nothing is to be done
};

struct DoctorOptions {
  const Config* config = nullptr;  // null: the machine only
  int ranks_per_node = 1;          // ranks of the run on this node (memory, space, pinning)
  std::string self;                // this program's path, re-run under mpiexec for the MPI check
  std::string mpiexec = "mpiexec";
  double mpi_timeout_s = 60;
};

std::vector<DoctorCheck> run_doctor(const DoctorOptions& o);
// One check per line: "[ ok ] name: detail", "[FAIL] name: detail\n       fix: ...".
std::string format_checks(const std::vector<DoctorCheck>& checks);

// The pieces, for tests: the available space (bytes) needed vs found; a round trip of
// 4 KiB through O_DIRECT in `dir` ("" = fine, else what failed).
DoctorCheck check_space(const std::string& dir, unsigned long long needed, unsigned long long available);
std::string o_direct_round_trip(const std::string& dir);
// For an nvme_path `dir` that is not a folder: "" when `ferry train` can create it (its
// parents too), with `ancestor` set to the nearest existing folder above it; else why it
// cannot ("exists and is not a folder", "/x is not a folder", "cannot create folders in
// /x: Permission denied"). Looks only: creates nothing.
std::string folder_to_create(const std::string& dir, std::string& ancestor);

// Runs `command` through sh with stderr joined to stdout: its exit status (128 + signal
// when killed) and its output.
std::pair<int, std::string> run_command(const std::string& command);

// The MPI probe's rank body: an all-reduce of (rank + 1) over the world; returns 0 when
// the sum is right (rank 0 prints "mpi probe: N ranks, sum S").
int mpi_probe_main();

}  // namespace ferry::runtime
