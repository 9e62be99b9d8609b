// The cuda device's entry points (nn/cuda_device.h): whether a GPU is there, the factory,
// the budget that fits, and what other rooms ask of a made device (its compute stream, PCI
// bus id, attention kernel, host memory registration).
#include "nn/cuda/device_impl.h"

#include <stdexcept>

namespace ferry::nn {
FERRY_CUDA_ABI_BEGIN

CudaStatus cuda_status() {
  CudaStatus s;
  s.built = true;
  const cudaError_t e = cudaGetDeviceCount(&s.gpus);
  if (e != cudaSuccess) {
    s.gpus = 0;
    s.reason = std::string("no usable GPU: cudaGetDeviceCount says ") + cudaGetErrorString(e);
    cudaGetLastError();  // clear it: later calls must not inherit this error
  } else if (s.gpus == 0) {
    s.reason = "no GPU: the CUDA runtime sees 0 devices";
  }
  return s;
}

std::unique_ptr<Device> make_cuda_device(size_t capacity_bytes, int ordinal, AttentionKernel attention) {
  const CudaStatus s = cuda_status();
  if (!s.available()) throw std::runtime_error("the cuda device is unavailable: " + s.reason);
  if (ordinal < 0 || ordinal >= s.gpus) {
    throw std::runtime_error("the cuda device: GPU " + std::to_string(ordinal) +
                             " does not exist (" + std::to_string(s.gpus) + " visible)");
  }
  return std::make_unique<cuda_dev::CudaDevice>(capacity_bytes, ordinal, attention);
}

void* cuda_compute_stream(Device& device) {
  auto* d = dynamic_cast<cuda_dev::CudaDevice*>(&device);
  if (!d)
    throw std::invalid_argument("cuda_compute_stream: " + device.name() + " is not a cuda device");
  return d->compute_stream();
}

namespace {
cuda_dev::CudaDevice& cuda_device_of(Device& device, const char* what) {
  auto* d = dynamic_cast<cuda_dev::CudaDevice*>(&device);
  if (!d) throw std::invalid_argument(std::string(what) + ": " + device.name() + " is not a cuda device");
  return *d;
}
}  // namespace

size_t cuda_budget_that_fits(int ordinal) {
  if (const CudaStatus st = cuda_status(); !st.available()) throw std::runtime_error(st.reason);
  FERRY_CUDA_CHECK(cudaSetDevice(ordinal));
  size_t free_bytes = 0, total = 0;
  FERRY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  constexpr size_t kRounding = 4u << 20;  // the slab's fixed room (CudaDevice's constructor)
  // What a device takes as it starts, before its slab is carved (cuBLAS's handle and
  // workspace, the error words, the first kernels' images): measured at about 150 MiB on
  // an H100; 1 GiB leaves a margin for other GPUs and drivers.
  constexpr size_t kStartup = 1ull << 30;
  if (free_bytes <= cuda_dev::kReserve + kRounding + kStartup) return 0;
  // capacity + capacity / 64 + kRounding <= free - kReserve - kStartup
  return (free_bytes - cuda_dev::kReserve - kRounding - kStartup) / 65 * 64;
}

std::string cuda_pci_bus_id(Device& device) {
  cuda_dev::CudaDevice& d = cuda_device_of(device, "cuda_pci_bus_id");
  char id[32] = {};
  FERRY_CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof id, d.ordinal()));
  return id;
}

std::string set_cuda_nf4_gemm(Device& device, bool fused) {
  cuda_dev::CudaDevice& d = cuda_device_of(device, "set_cuda_nf4_gemm");
  FERRY_CUDA_CHECK(cudaSetDevice(d.ordinal()));
  const char* why = fused ? cuda::nf4_gemm_obstacle() : nullptr;
  d.set_nf4_fused(fused && why == nullptr);
  return why == nullptr ? "" : std::string("the fused NF4 GEMM needs ") + why;
}

std::string cuda_attention_kernel(Device& device, DType act, int64_t head_size, std::string* why) {
  cuda_dev::CudaDevice& d = cuda_device_of(device, "cuda_attention_kernel");
  FERRY_CUDA_CHECK(cudaSetDevice(d.ordinal()));
  const char* tc = cuda::tensor_core_attention_obstacle(act, DType::f32, head_size);
  const AttentionKernel k = d.attention_kernel();
  const std::string tc_why = tc != nullptr ? std::string("tensor cores need ") + tc : "";
  // Where the kernels asked for cannot run, the name is what auto would fall back to.
  const AttentionKernel fallback = tc == nullptr ? AttentionKernel::tensor_cores : AttentionKernel::simt;
  if (k == AttentionKernel::simt || k == AttentionKernel::tensor_cores) {
    if (why != nullptr) *why = tc_why;
    return std::string(attention_kernel_name(k == AttentionKernel::simt ? k : fallback));
  }
  const char* mma = cuda::mma_attention_obstacle(act, DType::f32, head_size);
  if (why != nullptr) {
    // auto falling to SIMT says what the tensor cores need; otherwise what mma needs.
    *why = mma == nullptr ? "" : k == AttentionKernel::automatic && tc != nullptr ? tc_why : std::string("mma needs ") + mma;
  }
  return std::string(attention_kernel_name(mma == nullptr ? AttentionKernel::mma : fallback));
}

std::string cuda_register_host(Device& device, void* ptr, size_t bytes) {
  cuda_dev::CudaDevice& d = cuda_device_of(device, "cuda_register_host");
  // The calling thread's current GPU decides where the registration's mappings go.
  cudaError_t e = cudaSetDevice(d.ordinal());
  if (e == cudaSuccess) e = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
  if (e == cudaSuccess) return "";
  cudaGetLastError();  // not left for the next launch check to misreport
  return std::string("cudaHostRegister of ") + std::to_string(bytes) + " bytes failed: " +
         cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

void cuda_unregister_host(Device& device, void* ptr) noexcept {
  auto* d = dynamic_cast<cuda_dev::CudaDevice*>(&device);
  if (!d || cudaSetDevice(d->ordinal()) != cudaSuccess || cudaHostUnregister(ptr) != cudaSuccess)
    cudaGetLastError();
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn
