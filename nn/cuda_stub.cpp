// The cuda device in a build without the CUDA toolkit: unavailable, and saying why.
#include <stdexcept>

#include "nn/cuda_device.h"

namespace ferry::nn {

CudaStatus cuda_status() {
  CudaStatus s;
  s.reason =
      "this build of ferry has no CUDA (the CUDA toolkit was not found when it was configured, or FERRY_CUDA=OFF)";
  return s;
}

std::unique_ptr<Device> make_cuda_device(size_t, int, AttentionKernel) {
  throw std::runtime_error(cuda_status().reason);
}

std::string set_cuda_nf4_gemm(Device&, bool) {
  throw std::invalid_argument("set_cuda_nf4_gemm: not a cuda device");
}

std::string cuda_attention_kernel(Device&, DType, int64_t, std::string*) {
  throw std::invalid_argument("cuda_attention_kernel: not a cuda device");
}

size_t cuda_budget_that_fits(int) { throw std::runtime_error(cuda_status().reason); }

void* cuda_compute_stream(Device&) { throw std::invalid_argument("cuda_compute_stream: not a cuda device"); }

std::string cuda_pci_bus_id(Device&) { throw std::invalid_argument("cuda_pci_bus_id: not a cuda device"); }

std::string cuda_register_host(Device&, void*, size_t) {
  throw std::invalid_argument("cuda_register_host: not a cuda device");
}

void cuda_unregister_host(Device&, void*) noexcept {}

}  // namespace ferry::nn
