// The fused ops of nn/device_ops.h on the cuda device against the CPU device, which runs
// their unfused default: linear_forward as one cuBLASLt call with a bias or GELU+bias
// epilogue, and the cases that fall back to the unfused ops. test_fused_ops runs on a GPU
// (skipped without one); test_fused_ops_emulated runs the same on the CPU emulation of CUDA
// and also counts the launches each case takes.
#define BOOST_TEST_MODULE fused_ops
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "nn/cpu_device.h"
#include "nn/cuda_device.h"
#include "nn/rng.h"
#include "cuda_precondition.h"
#include "device_values.h"

#ifdef FERRY_CUDA_EMULATION
#include <cuda_runtime.h>  // the emulation's (testing/cuda_shim): its record of each launch
#endif

using namespace ferry;
using nn::DType;
using nn::Tensor;
using test::download;
using test::random_values;
using test::upload;
using test::worst;

namespace {

struct Case {
  std::string what;
  DType dtype;
  int64_t M, K, N;
  bool bias, gelu;
  bool fuses;  // what linear_forward_fuses must say
};

}  // namespace

BOOST_AUTO_TEST_CASE(linear_forward_matches_the_unfused_ops_on_the_cpu_device,
                     *boost::unit_test::precondition(test::CudaPresent{})) {
  auto gpu = nn::make_cuda_device(size_t{1} << 30);
  nn::CpuDevice cpu(size_t{1} << 30);
  const std::vector<Case> cases = {
      {"bf16, bias", DType::bf16, 37, 48, 40, true, false, true},
      {"bf16, bias and GELU", DType::bf16, 37, 48, 64, true, true, true},
      {"bf16, GELU without bias", DType::bf16, 9, 32, 16, false, true, true},
      {"bf16, no bias: a plain GEMM", DType::bf16, 9, 32, 24, false, false, true},
      {"f16, bias and GELU", DType::f16, 17, 64, 32, true, true, true},
      {"bf16, GELU at a width not a multiple of 8: unfused", DType::bf16, 12, 32, 20, true, true, false},
      {"f32: unfused (cuBLAS, no TF32)", DType::f32, 12, 32, 24, true, true, false},
  };
#ifdef FERRY_CUDA_EMULATION
  auto& emu = ferry_emu::emu();
#endif
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      const auto xv = random_values(c.M * c.K, 1, 1.0), wv = random_values(c.N * c.K, 2, 0.2),
                 bv = random_values(c.N, 3, 0.5);
      std::vector<float> results[2];
      [[maybe_unused]] int64_t launches = 0;
      for (int side = 0; side < 2; ++side) {
        nn::Device& dev = side == 0 ? static_cast<nn::Device&>(cpu) : *gpu;
        const Tensor x = upload(dev, c.dtype, {c.M, c.K}, xv), w = upload(dev, c.dtype, {c.N, c.K}, wv);
        const Tensor b = c.bias ? upload(dev, c.dtype, {c.N}, bv) : Tensor{};
        const Tensor out = Tensor::empty(dev, c.dtype, {c.M, c.N});
        const Tensor pre = c.gelu ? Tensor::empty(dev, c.dtype, {c.M, c.N}) : Tensor{};
        BOOST_TEST(nn::linear_forward_fuses(out, x, w, b, pre) == c.fuses);
        dev.synchronize();
#ifdef FERRY_CUDA_EMULATION
        if (side == 1) {
          emu.set_record_order(true);
          emu.take_order();
        }
#endif
        dev.linear_forward(out, x, w, b, pre);
        dev.synchronize();
#ifdef FERRY_CUDA_EMULATION
        if (side == 1) {
          for (const auto& o : emu.take_order()) launches += o.what.empty() || o.what.rfind("cudaFree", 0) == 0 ? 0 : 1;
          emu.set_record_order(false);
        }
#endif
        results[side] = download(dev, out);
        if (c.gelu) {
          const auto p = download(dev, pre);
          results[side].insert(results[side].end(), p.begin(), p.end());
        }
      }
      // One rounding fewer on the fused path (bias and GELU on the f32 product): within
      // two units of a 16-bit type's last place.
      const double tol = c.dtype == DType::f32 ? 1e-5 : c.dtype == DType::bf16 ? 2.0 * 0.0078125 : 2.0 * 0.0009765625;
      BOOST_TEST(worst(results[1], results[0]) <= tol);
#ifdef FERRY_CUDA_EMULATION
      const int64_t unfused = 1 + (c.bias ? 1 : 0) + (c.gelu ? 1 : 0);
      BOOST_TEST(launches == (c.fuses ? 1 : unfused));
#endif
    }
  }
}

BOOST_AUTO_TEST_CASE(linear_forward_refuses_a_bias_of_the_wrong_length,
                     *boost::unit_test::precondition(test::CudaPresent{})) {
  auto gpu = nn::make_cuda_device(size_t{1} << 30);
  const Tensor x = Tensor::empty(*gpu, DType::bf16, {4, 8}), w = Tensor::empty(*gpu, DType::bf16, {16, 8});
  const Tensor out = Tensor::empty(*gpu, DType::bf16, {4, 16}), b = Tensor::empty(*gpu, DType::bf16, {8});
  BOOST_CHECK_THROW(gpu->linear_forward(out, x, w, b), std::invalid_argument);
}
