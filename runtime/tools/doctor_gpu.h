// ferry doctor --gpu: what only a GPU can answer, measured once on the first GPU machine
// (docs/design/gpu-questions.md). One check per line:
//   gpu       the driver's version and how many GPUs it shows (CUDA_VISIBLE_DEVICES named),
//             or "no GPU: ..." with the reason (no libcuda.so.1, cuInit failed, 0 devices)
//   gpu N     per visible GPU: name, compute capability, free/total memory (cuMemGetInfo
//             in the device's primary context), the opt-in shared memory per block and the
//             largest head size the attention kernels fit in it, at any length (review F5),
//             and whether bf16/f16 attention runs on tensor cores there
//   tf32      NVIDIA_TF32_OVERRIDE: 1 turns ferry's fp32 GEMMs into TF32 (review Q5)
//   mpi+cuda  whether MPI_Init creates CUDA contexts or loads CUDA libraries (review Q1):
//             a 1-rank probe under mpiexec reads each GPU's primary-context state
//             (cuDevicePrimaryCtxGetState, which creates nothing) and the mapped CUDA
//             libraries before and after MPI_Init; MPIR_CVAR_ENABLE_GPU is named
//   nccl      the library version
// Only the driver API is used, through dlopen: the doctor builds and runs without CUDA,
// and the driver API does not depend on which libcudart a build linked.
// Thread safety: none needed (the doctor's main thread). Errors come back as checks.
#pragma once

#include <string>
#include <vector>

#include "runtime/tools/doctor.h"

namespace ferry::runtime {

// `ferry doctor --gpu`'s exit status when the machine has no usable GPU (documented in
// examples/cmd_doctor.cpp and docs/guide/doctor-and-plan.md): the run of the GPU checks did not happen.
inline constexpr int kDoctorNoGpuExit = 3;

struct GpuDoctorOptions {
  std::string libcuda = "libcuda.so.1";  // tests name one that does not exist
  std::string self;                      // this program, re-run under mpiexec for mpi+cuda ("" skips it)
  std::string mpiexec = "mpiexec";
  double mpi_timeout_s = 60;
};

std::vector<DoctorCheck> run_gpu_doctor(const GpuDoctorOptions& o);

// True when the checks say there is no usable GPU (their "gpu" check starts "no GPU").
bool found_no_gpu(const std::vector<DoctorCheck>& checks);

// The pieces, for tests.
// NVIDIA_TF32_OVERRIDE's value (null: unset).
DoctorCheck check_tf32(const char* value);
// The largest head size (at most the kernels' 256) whose attention kernels fit in
// `optin_bytes` of shared memory per block: the largest, backward's dK/dV kernel at 4 warps,
// takes 96 hs + 1088 accumulator elements (nn/cuda/attention.cuh, backward_kv_shared). The
// sequence length does not enter: the kernels are tiled.
long attention_max_head(long optin_bytes, int accumulator_bytes);

// Which kernels device.attention_kernel auto gives bf16/f16 models on a GPU of compute
// capability `major`.x: tensor cores from 8.0 (mma.sync at head sizes 64 and 128, wmma at
// the other heads up to 128; nn/attention_kernel.h), SIMT below.
std::string tensor_core_attention_line(int major);
// Whether a mapped library's file name is CUDA's or NVIDIA's (libcuda*, libcublas*, libnccl*,
// libnvidia-*, ...) or another library's CUDA module (UCX's libuct_cuda, Open MPI's
// *_cuda): what the mpi+cuda probe reports MPI_Init as having loaded. Not a name that merely
// contains "cuda": the first GPU machine's MPI loads ICU's libicudata, which is not.
bool is_cuda_library(const std::string& base);
// The mpi+cuda verdict from the probe's output line (see gpu_mpi_probe_main), its exit
// status, and MPIR_CVAR_ENABLE_GPU's value (null: unset).
DoctorCheck mpi_cuda_verdict(int status, const std::string& probe_output, const char* enable_gpu);

// The probe's body (`ferry doctor --gpu-mpi-probe`, one rank): prints
// "gpu mpi probe: contexts before B after A; new libraries L" where B and A list, per
// GPU, 1 for an active primary context and 0 for none, and L the CUDA libraries that
// MPI_Init mapped ("none"). Returns 0 when it could read both.
int gpu_mpi_probe_main(const std::string& libcuda = "libcuda.so.1");

}  // namespace ferry::runtime
