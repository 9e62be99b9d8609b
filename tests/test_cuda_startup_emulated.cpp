// The cuda device's and NCCL's start and memory handling on the strict CPU emulation
// (testing/cuda_emulation.h), for the GPU review's F1, F2, F11, F12, F14, F15, F16 (issue 27).
// Some cases need the emulated GPU set up through the environment before anything is
// allocated (FERRY_EMU_DEVICE_BYTES, FERRY_CUDA_SYNC) or several ranks (mpiexec with
// per-rank FERRY_EMU_BUS_BASE): tests/CMakeLists.txt runs those as their own ctest entries,
// selected with --run_test; FERRY_TEST_GPU_CHOICE tells the NCCL case what to expect.
#define BOOST_TEST_MODULE cuda_startup_emulated
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "comm/gpu_binding.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "nn/cuda_device.h"
#include "nn/tensor.h"

using namespace ferry;
using nn::DType;
using nn::Tensor;

namespace {

comm::MpiCommunicator& mpi_world() {
  static std::unique_ptr<comm::MpiCommunicator> world = comm::MpiCommunicator::world(60);
  return *world;
}

cudaStream_t compute_of(nn::Device& d) {
  return static_cast<cudaStream_t>(nn::cuda_compute_stream(d));
}

// The last op queued on the device's compute stream, and whether an op has run.
uint64_t last_compute_op(nn::Device& d) {
  auto& e = ferry_emu::emu();
  std::lock_guard<std::mutex> lock(e.mu);
  return e.last_of(ferry_emu::stream_of(compute_of(d)));
}

bool ran(uint64_t op) {
  auto& e = ferry_emu::emu();
  std::lock_guard<std::mutex> lock(e.mu);
  return e.done(op);
}

// Whether every op queued on the device's compute stream so far has run.
bool compute_idle(nn::Device& d) {
  auto& e = ferry_emu::emu();
  std::lock_guard<std::mutex> lock(e.mu);
  return e.done(e.last_of(ferry_emu::stream_of(compute_of(d))));
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

// ---- F1: which GPU a rank takes ----

BOOST_AUTO_TEST_CASE(gpu_choice_per_rank_binding_or_all_visible) {
  BOOST_TEST(comm::choose_gpu(8, 3, 8).ordinal == 3);  // every GPU visible: the local rank's
  BOOST_TEST(comm::choose_gpu(8, 1, 2).ordinal == 1);
  BOOST_TEST(comm::choose_gpu(1, 5, 8).ordinal == 0);  // one visible: the launcher bound it
  const comm::GpuChoice two = comm::choose_gpu(2, 3, 8);  // ambiguous: refused
  BOOST_TEST(two.ordinal == -1);
  BOOST_TEST(has(two.problem, "8 ranks on this node but 2 GPU(s)"));
  BOOST_TEST(comm::choose_gpu(0, 0, 1).ordinal == -1);
}

// Run at 2 ranks by ctest (gpu_choice_emulated_*): one emulated GPU per rank (a per-rank
// binding), with distinct bus ids (FERRY_TEST_GPU_CHOICE=distinct: NCCL starts) or the same
// one (=shared: every rank refuses, naming both ranks and the bus id); or two GPUs visible
// to both ranks (=all: rank i takes GPU i).
BOOST_AUTO_TEST_CASE(nccl_gpu_choice_over_ranks) {
  const std::string expect = env("FERRY_TEST_GPU_CHOICE");
  if (expect.empty()) return;  // a multi-rank case; see tests/CMakeLists.txt
  comm::MpiCommunicator& world = mpi_world();
  BOOST_TEST_REQUIRE(world.size() == 2);
  if (expect == "shared") {
    BOOST_CHECK_EXCEPTION(comm::NcclCommunicator::create(world, nullptr, 60), comm::CommError,
                          [](const comm::CommError& e) {
                            BOOST_TEST_MESSAGE(e.what());
                            return has(e.what(), "ranks 0 and 1") && has(e.what(), "0000:18:00.0");
                          });
    return;
  }
  auto nccl = comm::NcclCommunicator::create(world, nullptr, 60);
  BOOST_TEST(nccl->gpu() == (expect == "all" ? world.local_rank() : 0));
  int current = -1;
  cudaGetDevice(&current);
  BOOST_TEST(current == nccl->gpu());
  nccl->barrier()->wait();
}

// ---- F2: device.memory against the GPU's free memory; the slab after NCCL ----

// ctest runs it with FERRY_EMU_DEVICE_BYTES=1073741824: 512 MiB free after the context.
BOOST_AUTO_TEST_CASE(a_budget_above_free_memory_is_refused_naming_the_key) {
  size_t free_bytes = 0, total = 0;
  cudaMemGetInfo(&free_bytes, &total);
  if (total != (size_t{1} << 30)) return;  // the 80 GiB default: see tests/CMakeLists.txt
  try {
    nn::make_cuda_device(size_t{256} << 20);
    BOOST_FAIL("a 256 MiB budget was accepted with 512 MiB free and a 352 MiB reserve");
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    BOOST_TEST_MESSAGE(m);
    BOOST_TEST(has(m, "key 'device.memory'"));
    BOOST_TEST(has(m, std::to_string(free_bytes) + " bytes"));  // the free bytes
    BOOST_TEST(has(m, "352.00 MiB"));                            // the reserve
    BOOST_TEST(!has(m, "cudaMalloc"));
  }
  // What fits is accepted, and the slab is carved only at the first allocation (after a
  // communicator the trainer starts in between has taken its memory).
  auto dev = nn::make_cuda_device(size_t{64} << 20);
  size_t after_make = 0;
  cudaMemGetInfo(&after_make, &total);
  BOOST_TEST(free_bytes - after_make < (size_t{64} << 20));
  const Tensor t = Tensor::empty(*dev, DType::f32, {16});
  size_t after_alloc = 0;
  cudaMemGetInfo(&after_alloc, &total);
  BOOST_TEST(after_make - after_alloc >= (size_t{64} << 20));
}

// An op's scratch counts against the budget: a mixed-dtype GEMM's f32 copies show in the
// peak and a budget too small for them is OutOfDeviceMemory, not a driver failure.
BOOST_AUTO_TEST_CASE(gemm_scratch_counts_against_the_budget) {
  auto dev = nn::make_cuda_device(size_t{8} << 20);
  const Tensor a = Tensor::empty(*dev, DType::bf16, {64, 64}), b = Tensor::empty(*dev, DType::f32, {64, 64}),
               c = Tensor::empty(*dev, DType::f32, {64, 64});
  dev->fill(a, 1);
  dev->fill(b, 1);
  dev->reset_peak();
  const size_t before = dev->memory().in_use;
  dev->gemm(c, a, false, b, false, 1, 0);  // a is widened to f32: 16 KiB of scratch
  BOOST_TEST(dev->memory().peak >= before + 64 * 64 * 4);
  BOOST_TEST(dev->memory().in_use == before);
  dev->synchronize();
}

// ---- F14: the default pool keeps its memory ----

BOOST_AUTO_TEST_CASE(the_default_pool_keeps_what_it_maps) {
  auto dev = nn::make_cuda_device(size_t{8} << 20);
  cudaMemPool_t pool = nullptr;
  BOOST_TEST(cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess);
  uint64_t threshold = 0;
  BOOST_TEST(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold) == cudaSuccess);
  BOOST_TEST(threshold == UINT64_MAX);
}

// ---- F12: copy_into_new neither reuses a busy block nor waits on the host ----

// A block freed while work that used it is still queued is passed over when an idle
// block fits: first fit would hand it back, and the copy would wait for that work.
BOOST_AUTO_TEST_CASE(allocation_prefers_a_block_no_queued_work_uses) {
  auto dev = nn::make_cuda_device(size_t{8} << 20);
  Tensor a = Tensor::empty(*dev, DType::f32, {256});
  const Tensor keep = Tensor::empty(*dev, DType::f32, {256});  // a's block stays apart
  dev->fill(a, 1);  // queued, not run (the streams are lazy)
  const uint64_t fill = last_compute_op(*dev);
  void* freed = a.data();
  a = Tensor();
  const Tensor x = Tensor::empty(*dev, DType::f32, {256});
  // Reused only where the fence was found to have fired (the emulation's event queries
  // let the device progress now and then).
  BOOST_TEST((x.data() != freed || ran(fill)));
  dev->synchronize();
}

// copy_into_new queues the copy behind the block's fence and returns: the host does not
// wait for the work queued before the fence, and a pageable source may be reused at once.
BOOST_AUTO_TEST_CASE(copy_into_new_does_not_wait_on_the_host) {
  auto dev = nn::make_cuda_device(size_t{17} << 20);
  std::vector<float> src(size_t{6} << 18, 3.f);  // 6 MiB: only the freed block fits it
  Tensor big = Tensor::empty(*dev, DType::f32, {static_cast<int64_t>(src.size())});
  const Tensor rest = Tensor::empty(*dev, DType::f32, {static_cast<int64_t>(size_t{10} << 18)});
  dev->fill(big, 7);
  const uint64_t fill = last_compute_op(*dev);
  void* reused = big.data();
  big = Tensor();
  const Tensor dst = Tensor::empty(*dev, DType::f32, {static_cast<int64_t>(src.size())});
  BOOST_TEST_REQUIRE(dst.data() == reused);
  BOOST_TEST(!ran(fill));
  dev->copy_into_new(dst, src.data());
  BOOST_TEST(!ran(fill));  // the host did not wait for the fence
  std::fill(src.begin(), src.end(), 9.f);  // pageable: staged at the call
  std::vector<float> back(src.size());
  dev->copy_to_host(back.data(), dst);
  BOOST_TEST(back.front() == 3.f);  // after the fill (the device-side wait), from the call's bytes
  BOOST_TEST(back.back() == 3.f);
}

// A page-locked source is read when the copy runs (the contract: keep it until the host
// next waits for the device), so the call returned before the copy ran.
BOOST_AUTO_TEST_CASE(copy_into_new_from_pinned_memory_returns_before_the_copy) {
  auto dev = nn::make_cuda_device(size_t{8} << 20);
  float* pinned = nullptr;
  BOOST_TEST_REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), 64 * sizeof(float)) == cudaSuccess);
  std::fill(pinned, pinned + 64, 1.f);
  const Tensor t = Tensor::empty(*dev, DType::f32, {64});
  dev->copy_into_new(t, pinned);
  std::fill(pinned, pinned + 64, 2.f);  // what the queued copy will read
  std::vector<float> back(64);
  dev->copy_to_host(back.data(), t);
  BOOST_TEST(back[0] == 2.f);
  // copy_from_host keeps its contract: the host may reuse a pinned source on return.
  dev->copy_from_host(t, pinned);
  std::fill(pinned, pinned + 64, 4.f);
  dev->copy_to_host(back.data(), t);
  BOOST_TEST(back[0] == 2.f);
  cudaFreeHost(pinned);
}

// ---- F11: a free from another thread ----

// The freeing thread is switched to the device's GPU (events belong to the current one),
// and the freed block is reused correctly after it.
BOOST_AUTO_TEST_CASE(a_free_on_another_thread_uses_the_devices_gpu) {
  setenv("FERRY_EMU_DEVICES", "2", 1);
  {
    auto dev = nn::make_cuda_device(size_t{8} << 20, 1);
    Tensor t = Tensor::empty(*dev, DType::f32, {64});
    dev->fill(t, 3);
    int seen = -1;
    std::thread([&] {
      t = Tensor();  // frees on this thread, whose current GPU is 0
      cudaGetDevice(&seen);
    }).join();
    BOOST_TEST(seen == 1);
    BOOST_TEST(dev->memory().in_use == 0u);
    const Tensor u = Tensor::empty(*dev, DType::f32, {64});
    const std::vector<float> v(64, 6.f);
    dev->copy_into_new(u, v.data());
    std::vector<float> back(64);
    dev->copy_to_host(back.data(), u);
    BOOST_TEST(back[63] == 6.f);
  }
  cudaSetDevice(0);
  unsetenv("FERRY_EMU_DEVICES");
}

// ---- F15: FERRY_CUDA_SYNC=1 ----

// ctest runs it with FERRY_CUDA_SYNC=1 (read once per process): every op has run when it
// returns.
BOOST_AUTO_TEST_CASE(cuda_sync_waits_after_every_op) {
  if (env("FERRY_CUDA_SYNC") != "1") return;
  auto dev = nn::make_cuda_device(size_t{8} << 20);
  const Tensor t = Tensor::empty(*dev, DType::f32, {64}), u = Tensor::empty(*dev, DType::f32, {64});
  dev->fill(t, 1);
  BOOST_TEST(compute_idle(*dev));
  dev->copy(u, t);
  BOOST_TEST(compute_idle(*dev));
  const Tensor c = Tensor::empty(*dev, DType::f32, {8, 8});
  dev->gemm(c, t.reshape({8, 8}), false, u.reshape({8, 8}), false, 1, 0);
  BOOST_TEST(compute_idle(*dev));
}
