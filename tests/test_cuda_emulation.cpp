// The strict CPU emulation of CUDA, cuBLAS and NCCL (testing/emu_device.h) catches the
// defects it exists for: each test plants one (a missing event wait, a host read of
// device memory, a host read before a synchronisation, an oversized shared-memory
// launch, a zero leading dimension, a reduced-precision reduction, a consumer waiting for
// unrelated collectives, warp matrix calls made by some lanes only, a read of a stored
// fragment without __syncwarp, a misaligned fragment load) and shows that the emulation turns it into a wrong value or an
// error, and that the code as written in nn/ and comm/ passes. Emulated build only.
#define BOOST_TEST_MODULE cuda_emulation
#include <sys/wait.h>

#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <mma.h>
#include <nccl.h>

#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "nn/cpu_device.h"
#include "nn/cuda_device.h"
#include "nn/tensor.h"

using namespace ferry;
using nn::DType;
using nn::Tensor;

namespace {

__global__ void write_ones(float* p, int n) {
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) p[i] = 1.0f;
}

bool check(cudaError_t e) { return e == cudaSuccess; }

// One seed's run of: stream 1 writes ones into `src`, stream 2 copies `src` to `dst`,
// with or without stream 2 waiting for stream 1's event; returns dst[0] read back.
float copy_across_streams(uint64_t seed, bool wait) {
  ferry_emu::emu().set_seed(seed);
  cudaStream_t s1, s2;
  cudaEvent_t written;
  float *src, *dst;
  BOOST_REQUIRE(check(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking)));
  BOOST_REQUIRE(check(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking)));
  BOOST_REQUIRE(check(cudaEventCreateWithFlags(&written, cudaEventDisableTiming)));
  BOOST_REQUIRE(check(cudaMalloc(reinterpret_cast<void**>(&src), 64 * sizeof(float))));
  BOOST_REQUIRE(check(cudaMalloc(reinterpret_cast<void**>(&dst), 64 * sizeof(float))));
  FERRY_LAUNCH(write_ones, 1, 32, 0, s1, src, 64);
  BOOST_REQUIRE(check(cudaGetLastError()));
  BOOST_REQUIRE(check(cudaEventRecord(written, s1)));
  if (wait) BOOST_REQUIRE(check(cudaStreamWaitEvent(s2, written, 0)));
  BOOST_REQUIRE(check(cudaMemcpyAsync(dst, src, 64 * sizeof(float), cudaMemcpyDeviceToDevice, s2)));
  float host[64];
  BOOST_REQUIRE(check(cudaMemcpyAsync(host, dst, sizeof host, cudaMemcpyDeviceToHost, s2)));  // pageable: returns after
  cudaDeviceSynchronize();
  cudaFree(src);
  cudaFree(dst);
  cudaEventDestroy(written);
  return host[0];
}

namespace wmma = nvcuda::wmma;

// A warp stores a fragment of ones into out[16][16]; `divergent`: only lanes 0-15 make the
// store (a *_sync call every lane must make). Each lane then reads one element of its own
// 8 (`synced`: after __syncwarp) into seen[lane].
__global__ void store_ones(float* out, float* seen, bool divergent, bool synced) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 1.0f);
  if (!divergent || threadIdx.x % 32 < 16) wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
  if (synced) __syncwarp();
  seen[threadIdx.x] = out[(threadIdx.x * 8 + 7) % 256];
}

__global__ void load_from(const __nv_bfloat16* p, unsigned ldm) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  wmma::load_matrix_sync(a, p, ldm);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_missing_event_wait_changes_results) {
  int stale = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    BOOST_TEST(copy_across_streams(seed, true) == 1.0f);  // the wait orders the copy: always right
    stale += copy_across_streams(seed, false) != 1.0f;    // without it the copy may run first
  }
  BOOST_TEST_MESSAGE("without the wait " << stale << " of 8 seeds copied before the write");
  BOOST_TEST(stale > 0);
}

BOOST_AUTO_TEST_CASE(a_host_read_before_synchronising_sees_stale_bytes) {
  float* dev = nullptr;
  float* pinned = nullptr;
  cudaStream_t s;
  BOOST_REQUIRE(check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
  BOOST_REQUIRE(check(cudaMalloc(reinterpret_cast<void**>(&dev), 32 * sizeof(float))));
  BOOST_REQUIRE(check(cudaMallocHost(reinterpret_cast<void**>(&pinned), 32 * sizeof(float))));
  pinned[0] = -5.0f;
  FERRY_LAUNCH(write_ones, 1, 32, 0, s, dev, 32);
  BOOST_REQUIRE(check(cudaMemcpyAsync(pinned, dev, 32 * sizeof(float), cudaMemcpyDeviceToHost, s)));
  BOOST_TEST(pinned[0] == -5.0f);  // a pinned destination is written when the stream runs
  BOOST_REQUIRE(check(cudaStreamSynchronize(s)));
  BOOST_TEST(pinned[0] == 1.0f);
  cudaFree(dev);
  cudaFreeHost(pinned);
}

// Fresh device memory is NaN, not zeros: an output a kernel forgot to write shows.
BOOST_AUTO_TEST_CASE(fresh_device_memory_is_poisoned) {
  float* dev = nullptr;
  float host[4];
  BOOST_REQUIRE(check(cudaMalloc(reinterpret_cast<void**>(&dev), sizeof host)));
  BOOST_REQUIRE(check(cudaMemcpyAsync(host, dev, sizeof host, cudaMemcpyDeviceToHost, nullptr)));
  for (float x : host) BOOST_TEST(std::isnan(x));
  cudaFree(dev);
}

BOOST_AUTO_TEST_CASE(a_host_dereference_of_device_memory_faults) {
  float* dev = nullptr;
  BOOST_REQUIRE(check(cudaMalloc(reinterpret_cast<void**>(&dev), 1024)));
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    volatile float x = dev[3];  // the planted defect
    (void)x;
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  BOOST_TEST(WIFSIGNALED(status));
  BOOST_TEST((WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV));
  cudaPointerAttributes a{};
  BOOST_REQUIRE(check(cudaPointerGetAttributes(&a, dev)));
  BOOST_TEST(a.type == cudaMemoryTypeDevice);
  int on_stack = 0;
  BOOST_REQUIRE(check(cudaPointerGetAttributes(&a, &on_stack)));
  BOOST_TEST(a.type == cudaMemoryTypeUnregistered);  // NCCL's host staging path runs on these
  cudaFree(dev);
}

BOOST_AUTO_TEST_CASE(copies_must_stay_inside_their_allocation_and_name_their_direction) {
  float* dev = nullptr;
  std::vector<float> host(64);
  BOOST_REQUIRE(check(cudaMalloc(reinterpret_cast<void**>(&dev), 32 * sizeof(float))));
  BOOST_TEST(cudaMemcpyAsync(dev, host.data(), 64 * sizeof(float), cudaMemcpyHostToDevice, nullptr) ==
             cudaErrorInvalidValue);
  BOOST_TEST(cudaMemcpyAsync(host.data(), dev, 16, cudaMemcpyHostToDevice, nullptr) == cudaErrorInvalidValue);
  cudaFree(dev);
}

BOOST_AUTO_TEST_CASE(the_device_has_a_size) {
  size_t free_bytes = 0, total = 0;
  BOOST_REQUIRE(check(cudaMemGetInfo(&free_bytes, &total)));
  BOOST_TEST(total == ferry_emu::emu().device_bytes());
  BOOST_TEST(free_bytes < total);  // the context's reserve
  void* p = nullptr;
  BOOST_TEST(cudaMalloc(&p, free_bytes + (size_t{1} << 20)) == cudaErrorMemoryAllocation);
}

BOOST_AUTO_TEST_CASE(shared_memory_above_the_limits_fails_the_launch) {
  float* dev = nullptr;
  BOOST_REQUIRE(check(cudaMalloc(reinterpret_cast<void**>(&dev), 128)));
  FERRY_LAUNCH(write_ones, 1, 32, 64 * 1024, nullptr, dev, 32);  // above 48 KiB without opting in
  BOOST_TEST(cudaGetLastError() == cudaErrorInvalidValue);
  BOOST_TEST(cudaFuncSetAttribute(write_ones, cudaFuncAttributeMaxDynamicSharedMemorySize, 240 * 1024) ==
             cudaErrorInvalidValue);  // above H100's 227 KiB
  BOOST_REQUIRE(check(cudaFuncSetAttribute(write_ones, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024)));
  FERRY_LAUNCH(write_ones, 1, 32, 64 * 1024, nullptr, dev, 32);
  BOOST_TEST(cudaGetLastError() == cudaSuccess);
  FERRY_LAUNCH(write_ones, 1, 2048, 0, nullptr, dev, 32);  // more than 1024 threads
  BOOST_TEST(cudaGetLastError() == cudaErrorInvalidConfiguration);
  cudaFree(dev);
}

// Review F13: cuBLAS refuses a leading dimension of 0; the cuda device's GEMM with K = 0
// must not pass one, and gives C = beta C as the CPU device does.
BOOST_AUTO_TEST_CASE(a_gemm_with_k_zero) {
  cublasHandle_t h;
  BOOST_REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  float *a, *c;
  BOOST_REQUIRE(check(cudaMalloc(reinterpret_cast<void**>(&a), 64)));
  BOOST_REQUIRE(check(cudaMalloc(reinterpret_cast<void**>(&c), 64)));
  const float one = 1, zero = 0;
  BOOST_TEST(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 0, &one, a, CUDA_R_32F, 0, a, CUDA_R_32F, 2, &zero, c,
                          CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(c);

  auto gpu = nn::make_cuda_device(size_t{16} << 20);
  nn::CpuDevice cpu(size_t{16} << 20, 1);
  for (double beta : {0.0, 0.5}) {
    std::vector<float> out(6);
    for (nn::Device* d : {static_cast<nn::Device*>(&cpu), gpu.get()}) {
      const Tensor A = Tensor::empty(*d, DType::f32, {3, 0}), B = Tensor::empty(*d, DType::f32, {0, 2}),
                   C = Tensor::empty(*d, DType::f32, {3, 2});
      d->fill(C, 4.0);
      d->gemm(C, A, false, B, false, 1.0, beta);
      d->copy_to_host(out.data(), C);
      for (float x : out) BOOST_TEST(x == static_cast<float>(4.0 * beta));
    }
  }
}

// Review F9: with cuBLAS's default math, a bf16 output may be summed in bf16 partials; the
// cuda device forbids it, so a long bf16 product is rounded once, as the CPU device does.
BOOST_AUTO_TEST_CASE(bf16_products_are_rounded_once) {
  auto gpu = nn::make_cuda_device(size_t{16} << 20);
  nn::CpuDevice cpu(size_t{16} << 20, 1);
  constexpr int64_t K = 2048;
  std::vector<uint16_t> ones(K), halves(K);
  for (int64_t i = 0; i < K; ++i) {
    ones[static_cast<size_t>(i)] = nn::f32_to_bf16(1.0f + static_cast<float>(i % 13) / 128.0f);
    halves[static_cast<size_t>(i)] = nn::f32_to_bf16(0.3f + static_cast<float>(i % 11) / 64.0f);
  }
  std::vector<uint16_t> got_cpu(1), got_gpu(1);
  for (nn::Device* d : {static_cast<nn::Device*>(&cpu), gpu.get()}) {
    const Tensor A = Tensor::empty(*d, DType::bf16, {1, K}), B = Tensor::empty(*d, DType::bf16, {K, 1}),
                 C = Tensor::empty(*d, DType::bf16, {1, 1});
    d->copy_from_host(A, ones.data());
    d->copy_from_host(B, halves.data());
    d->gemm(C, A, false, B, false, 1.0, 0.0);
    d->copy_to_host(d == &cpu ? got_cpu.data() : got_gpu.data(), C);
  }
  BOOST_TEST(got_gpu[0] == got_cpu[0]);
  // The same product through a handle left in the default math mode: split-K partials in
  // bf16 round the output several times, and it differs.
  cublasHandle_t h;
  BOOST_REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  uint16_t *a, *b, *c;
  BOOST_REQUIRE(check(cudaMalloc(reinterpret_cast<void**>(&a), K * 2)));
  BOOST_REQUIRE(check(cudaMalloc(reinterpret_cast<void**>(&b), K * 2)));
  BOOST_REQUIRE(check(cudaMalloc(reinterpret_cast<void**>(&c), 2)));
  BOOST_REQUIRE(check(cudaMemcpyAsync(a, ones.data(), K * 2, cudaMemcpyHostToDevice, nullptr)));
  BOOST_REQUIRE(check(cudaMemcpyAsync(b, halves.data(), K * 2, cudaMemcpyHostToDevice, nullptr)));
  const float one = 1, zero = 0;
  BOOST_REQUIRE(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, K, &one, b, CUDA_R_16BF, 1, a, CUDA_R_16BF, K,
                             &zero, c, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  uint16_t reduced = 0;
  BOOST_REQUIRE(check(cudaMemcpyAsync(&reduced, c, 2, cudaMemcpyDeviceToHost, nullptr)));
  BOOST_TEST_MESSAGE("rounded once " << nn::bf16_to_f32(got_cpu[0]) << ", in bf16 partials "
                                     << nn::bf16_to_f32(reduced));
  BOOST_TEST(reduced != got_cpu[0]);
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
}

// Review F4: finishing one collective makes the compute stream wait for that collective,
// not for those issued after it.
BOOST_AUTO_TEST_CASE(a_consumer_waits_only_for_its_own_collective) {
  static std::unique_ptr<comm::MpiCommunicator> world = comm::MpiCommunicator::world(120);
  auto dev = nn::make_cuda_device(size_t{16} << 20);
  auto nccl = comm::NcclCommunicator::create(*world, nn::cuda_compute_stream(*dev), 60);
  BOOST_REQUIRE(nccl->orders_on_device());
  const int64_t W = nccl->size();
  const Tensor a = Tensor::empty(*dev, DType::f32, {8}), b = Tensor::empty(*dev, DType::f32, {8 * W}),
               c = Tensor::empty(*dev, DType::f32, {8});
  dev->fill(a, 1.0);
  dev->fill(c, 2.0);
  auto& emu = ferry_emu::emu();
  {
    std::lock_guard<std::mutex> lock(emu.mu);
    emu.stalled = true;  // nothing finishes behind the test's back
    emu.record_waits = true;
  }
  emu.take_waits();
  auto gather = nccl->all_gather(a.data(), b.data(), 8, comm::DataType::f32);
  auto later = nccl->all_reduce(c.data(), 8, comm::DataType::f32, comm::ReduceOp::sum);
  nccl->order_consumer(*gather);
  const auto waits = emu.take_waits();
  {
    std::lock_guard<std::mutex> lock(emu.mu);
    emu.stalled = false;
    emu.record_waits = false;
  }
  bool waited_gather = false, waited_later = false;
  for (const auto& w : waits) {
    for (const auto& op : w.ops) {
      waited_gather |= op == "ncclAllGather";
      waited_later |= op == "ncclAllReduce";
    }
  }
  BOOST_TEST(waited_gather);
  BOOST_TEST(!waited_later);
  gather->wait();
  later->wait();
  std::vector<float> got(static_cast<size_t>(8 * W));
  dev->copy_to_host(got.data(), b);
  for (float x : got) BOOST_TEST(x == 1.0f);
}

// Warp matrix functions (testing/emu_wmma.h): a store only half the warp makes is reported
// when the lanes meet; lanes reading a stored tile without __syncwarp read stale values
// (each lane holds and writes only its share of an accumulator), with it the whole tile;
// a load from an address that is not 256-bit aligned ends the kernel's process.
BOOST_AUTO_TEST_CASE(warp_matrix_defects_are_caught) {
  alignas(64) float out[256];
  float seen[32];
  auto run = [&](bool divergent, bool synced) {
    std::fill(std::begin(out), std::end(out), -1.0f);
    std::fill(std::begin(seen), std::end(seen), 0.0f);
    ferry_emu::launch(dim3(1), dim3(32), 0, [&] { store_ones(out, seen, divergent, synced); });
  };
  BOOST_CHECK_EXCEPTION(run(true, true), std::logic_error, [](const std::logic_error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return std::string(e.what()).find("different warp matrix calls") != std::string::npos;
  });
  run(false, false);  // the planted defect: no __syncwarp between the store and the reads
  BOOST_TEST(std::count(std::begin(seen), std::end(seen), -1.0f) > 0);
  run(false, true);
  BOOST_TEST(std::count(std::begin(seen), std::end(seen), 1.0f) == 32);
  alignas(64) __nv_bfloat16 tile[16 * 24] = {};
  ferry_emu::launch(dim3(1), dim3(32), 0, [&] { load_from(tile, 24); });  // aligned, ldm 48 bytes
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    std::signal(SIGABRT, SIG_DFL);  // not Boost.Test's handler: the child is to die of it
    ferry_emu::launch(dim3(1), dim3(32), 0, [&] { load_from(tile + 8, 24); });  // 16 bytes off
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  BOOST_TEST((WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT));  // thrown on a fiber: terminate
}
