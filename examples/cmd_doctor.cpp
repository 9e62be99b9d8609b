// ferry doctor [--config FILE [--deepspeed DS.json | --fsdp FSDP] [--set key=value ...]] [--ranks N] [--ranks-per-node R]
// Checks MPI, io_uring, the nvme folders, RLIMIT_MEMLOCK, host memory, CUDA and NCCL
// against what the configuration needs (runtime/tools/doctor.h).
// ferry doctor --gpu: the GPU checks only (runtime/tools/doctor_gpu.h): each visible GPU,
// NVIDIA_TF32_OVERRIDE, whether MPI_Init touches CUDA, NCCL.
// Exit status: 0 nothing would stop a run; 1 a check failed; 2 the command line or the
// configuration is wrong; 3 (--gpu only) there is no usable GPU here, so nothing was checked.
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "examples/commands.h"
#include "runtime/config/config.h"
#include "runtime/tools/doctor.h"
#include "runtime/tools/doctor_gpu.h"

namespace ferry::cli {

namespace {

struct DoctorArgs {
  RunOptions run;
  int per_node = 0;
  bool mpi_probe = false;
  bool gpu = false;
  bool gpu_mpi_probe = false;
};

int gpu_doctor() {
  using namespace ferry::runtime;
  GpuDoctorOptions o;
  o.self = std::filesystem::canonical("/proc/self/exe").string();
  const std::vector<DoctorCheck> checks = run_gpu_doctor(o);
  std::cout << format_checks(checks);
  if (found_no_gpu(checks)) {
    std::cout << "ferry doctor --gpu: no GPU on this machine: the GPU checks did not run (exit "
              << kDoctorNoGpuExit << ")\n";
    return kDoctorNoGpuExit;
  }
  for (const DoctorCheck& k : checks)
    if (k.status == DoctorCheck::fail) return 1;
  return 0;
}

int doctor(const DoctorArgs& a) {
  using namespace ferry::runtime;
  if (a.mpi_probe) return mpi_probe_main();
  if (a.gpu_mpi_probe) return gpu_mpi_probe_main();
  if (a.gpu) return gpu_doctor();
  Config c;
  DoctorOptions o;
  if (!a.run.config.empty()) {
    c = load_config(a.run.config, a.run.sets, a.run.ranks, a.run.deepspeed, a.run.fsdp);
    o.config = &c;
  }
  o.ranks_per_node = a.per_node > 0 ? a.per_node : a.run.ranks;
  o.self = std::filesystem::canonical("/proc/self/exe").string();
  const std::vector<DoctorCheck> checks = run_doctor(o);
  std::cout << format_checks(checks);
  for (const DoctorCheck& k : checks)
    if (k.status == DoctorCheck::fail) return 1;
  return 0;
}

}  // namespace

Run doctor_command(CLI::App& cmd) {
  auto a = std::make_shared<DoctorArgs>();
  cmd.description("check MPI, io_uring, the nvme folders, locked-memory limits, host memory, CUDA and NCCL for a run");
  add_run_options(cmd, a->run, /*with_ranks=*/true);
  cmd.add_option("--ranks-per-node", a->per_node, "ranks on this node (default: --ranks)")
      ->check(at_least(0));
  // The doctor starts itself under mpiexec with this flag (runtime/tools/doctor.cpp): the
  // probe's side, not for users, so it is left out of --help.
  cmd.add_flag("--gpu", a->gpu,
               "check the GPUs instead: each GPU's name, memory and shared memory limit, NVIDIA_TF32_OVERRIDE, "
               "whether MPI_Init touches CUDA, NCCL (exit 3: no GPU here)");
  cmd.add_flag("--mpi-probe", a->mpi_probe, "")->group("");
  cmd.add_flag("--gpu-mpi-probe", a->gpu_mpi_probe, "")->group("");
  return [a] { return doctor(*a); };
}

}  // namespace ferry::cli
