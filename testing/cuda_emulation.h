// A CPU emulation of the CUDA runtime and cuBLAS calls the cuda device makes, for tests on
// machines without a GPU (FERRY_CUDA_EMULATION; never part of ferry's libraries).
//
// It lets tests compile nn/cuda/*.cu and nn/cuda/device_*.cpp unchanged with g++ and
// run them: each kernel runs its blocks one after another, each block's threads as fibers
// that meet at barriers for __syncthreads and per warp of 32 for __shfl_down_sync,
// __shfl_xor_sync, __ballot_sync and __syncwarp, with
// __shared__ arrays shared by the block's threads (static, as blocks do not overlap). So
// the index arithmetic, the shared-memory use, the reductions and their barriers, the
// row-major <-> column-major GEMM mapping, the widening, the flags and the arena all
// execute as written. The GPU around the kernels is strict (testing/emu_device.h): device
// memory apart from host memory, lazy streams run in a seeded order, events, the launch
// and shared-memory limits, cuBLAS's argument checks (testing/emu_cublas.h), NCCL between
// ranks over MPI (testing/nccl_emulation.h). What it cannot show: timing, memory
// coalescing, races between blocks, anything about the real driver or the real cuBLAS
// (its GEMM is a loop in double over column-major operands, cublasGemmEx's documented
// semantics). Kernels run one at a time; 1-D blocks, multiples of 32 threads. Not for
// sanitizer builds (ASan needs fiber annotations for stack switches; they are left out).
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "nn/dtype.h"
#include "testing/emu_fiber.h"

// Unqualified math in the kernels gets the float overloads, as CUDA's device math does.
using std::cos;
using std::exp;
using std::log;
using std::pow;
using std::sin;
using std::sqrt;
using std::tanh;

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

namespace ferry_emu {

// A block's threads are fibers (testing/emu_fiber.h) on the calling thread: each runs until it reaches
// a barrier, and a barrier opens once every thread it concerns (the block, or the 32 lanes
// of a warp) has reached it. Threads that wait at different barriers, or finish while
// others wait, are a kernel bug in CUDA too (a hang or undefined behaviour): reported.
struct Fiber {
  enum State { ready, at_block, at_warp, done };
  FiberContext context;
  std::unique_ptr<char[]> stack;
  State state = done;
};

constexpr size_t kFiberStack = size_t{256} << 10;  // kernels keep a few scalars and small loops

struct Warp {
  double lanes[32] = {};
};

inline dim3 thread_index, block_index, block_dim, grid_dim;
inline std::vector<Fiber> fibers;
inline unsigned current = 0;
inline FiberContext scheduler;
inline const std::function<void()>* kernel_body = nullptr;
inline Warp* warps = nullptr;
inline unsigned char* dynamic_shared_memory = nullptr;

// Warp matrix functions (testing/emu_wmma.h) must be called by all 32 lanes of a warp with
// the same arguments. Each lane's calls since the warp last met are logged here and
// compared whenever its lanes meet (a warp barrier, __syncthreads, the block's end).
struct WmmaCall {
  int op;
  const void* p;
  unsigned ldm;
  int layout;
  bool operator==(const WmmaCall&) const = default;
};
inline std::vector<std::vector<WmmaCall>> wmma_calls;  // per thread of the block

inline void wmma_called(WmmaCall c) {
  const unsigned t = thread_index.x;
  if (wmma_calls.size() <= t) wmma_calls.resize(t + 1);
  wmma_calls[t].push_back(c);
}

inline void check_wmma_calls(unsigned warp) {
  if (wmma_calls.size() < (warp + 1) * 32) wmma_calls.resize((warp + 1) * 32);
  for (unsigned l = 1; l < 32; ++l) {
    if (!(wmma_calls[warp * 32 + l] == wmma_calls[warp * 32])) {
      throw std::logic_error("cuda emulation: lanes 0 and " + std::to_string(l) + " of warp " + std::to_string(warp) +
                             " in block (" + std::to_string(block_index.x) + ", " + std::to_string(block_index.y) +
                             ", " + std::to_string(block_index.z) +
                             ") made different warp matrix calls (a *_sync call every lane must make alike)");
    }
  }
  for (unsigned l = 0; l < 32; ++l) wmma_calls[warp * 32 + l].clear();
}

inline unsigned char* dynamic_shared() {
  return dynamic_shared_memory;
}

// A fiber's whole life: the kernel's body, then back to the scheduler for good.
inline void fiber_main() {
  (*kernel_body)();
  fibers[current].state = Fiber::done;
  fiber_switch(fibers[current].context, scheduler);
  __builtin_unreachable();
}

inline void wait_at(Fiber::State barrier) {
  Fiber& f = fibers[current];
  f.state = barrier;
  fiber_switch(f.context, scheduler);
}

// Runs one block to completion.
inline void run_block(unsigned n) {
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = fibers[t];
    fiber_start(f.context, f.stack.get(), kFiberStack, fiber_main);
    f.state = Fiber::ready;
  }
  while (true) {
    for (unsigned t = 0; t < n; ++t) {
      if (fibers[t].state != Fiber::ready) continue;
      current = t;
      thread_index = dim3(t);
      fiber_switch(scheduler, fibers[t].context);
    }
    unsigned done = 0, at_block = 0;
    bool opened = false;
    for (unsigned w = 0; w < n / 32; ++w) {
      unsigned waiting = 0;
      for (unsigned l = 0; l < 32; ++l) waiting += fibers[w * 32 + l].state == Fiber::at_warp;
      if (waiting == 32) {
        check_wmma_calls(w);
        for (unsigned l = 0; l < 32; ++l) fibers[w * 32 + l].state = Fiber::ready;
        opened = true;
      }
    }
    if (opened) continue;
    for (unsigned t = 0; t < n; ++t) {
      done += fibers[t].state == Fiber::done;
      at_block += fibers[t].state == Fiber::at_block;
    }
    if (done == n || at_block == n) {
      for (unsigned w = 0; w < n / 32; ++w) check_wmma_calls(w);
    }
    if (done == n) return;
    if (at_block == n) {
      for (unsigned t = 0; t < n; ++t) fibers[t].state = Fiber::ready;
      continue;
    }
    throw std::logic_error("cuda emulation: the threads of block (" +
                           std::to_string(block_index.x) + ", " + std::to_string(block_index.y) +
                           ", " + std::to_string(block_index.z) + ") wait at different barriers (" +
                           std::to_string(at_block) + " at __syncthreads, " + std::to_string(done) +
                           " finished)");
  }
}

inline void launch(dim3 grid, dim3 block, size_t shared_bytes,
                   const std::function<void()>& kernel) {
  if (block.y != 1 || block.z != 1 || block.x == 0 || block.x % 32 != 0) {
    throw std::invalid_argument("cuda emulation: 1-D blocks of a multiple of 32 threads only");
  }
  block_dim = block;
  grid_dim = grid;
  kernel_body = &kernel;
  wmma_calls.clear();  // a kernel that threw may have left calls behind
  std::vector<unsigned char> shared(shared_bytes + 64);
  dynamic_shared_memory =
      shared.data() + (64 - reinterpret_cast<uintptr_t>(shared.data()) % 64) % 64;
  auto warp_list = std::make_unique<Warp[]>(block.x / 32);
  warps = warp_list.get();
  while (fibers.size() < block.x) {
    fibers.emplace_back();
    fibers.back().stack = std::make_unique<char[]>(kFiberStack);
  }
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        block_index = dim3(x, y, z);
        // A GPU's shared memory holds what earlier blocks left, NaN patterns included: a
        // kernel that reads before it writes meets NaN here rather than zeros.
        std::memset(dynamic_shared_memory, 0xFF, shared_bytes);
        run_block(block.x);
      }
}

}  // namespace ferry_emu

#define threadIdx ::ferry_emu::thread_index
#define blockIdx ::ferry_emu::block_index
#define blockDim ::ferry_emu::block_dim
#define gridDim ::ferry_emu::grid_dim
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define FERRY_DYNAMIC_SHARED(name) unsigned char* name = ::ferry_emu::dynamic_shared()
#define FERRY_LAUNCH(kernel, grid, block, smem, stream, ...)                                \
  ::ferry_emu::launch_on((stream), reinterpret_cast<const void*>(&kernel), #kernel, dim3(grid), \
                         dim3(block), (smem), [=] { kernel(__VA_ARGS__); })

inline void __syncthreads() {
  ::ferry_emu::wait_at(::ferry_emu::Fiber::at_block);
}

template <class T>
T __shfl_down_sync(unsigned, T v, int offset) {
  const unsigned lane = threadIdx.x % 32;
  ::ferry_emu::Warp& w = ::ferry_emu::warps[threadIdx.x / 32];
  w.lanes[lane] = static_cast<double>(v);  // exact for float and double
  ::ferry_emu::wait_at(::ferry_emu::Fiber::at_warp);
  const unsigned from = lane + static_cast<unsigned>(offset);
  const T r = from < 32 ? static_cast<T>(w.lanes[from]) : v;
  ::ferry_emu::wait_at(::ferry_emu::Fiber::at_warp);  // every lane has read before any writes again
  return r;
}

template <class T>
T __shfl_xor_sync(unsigned, T v, int mask) {
  const unsigned lane = threadIdx.x % 32;
  ::ferry_emu::Warp& w = ::ferry_emu::warps[threadIdx.x / 32];
  w.lanes[lane] = static_cast<double>(v);
  ::ferry_emu::wait_at(::ferry_emu::Fiber::at_warp);
  const T r = static_cast<T>(w.lanes[(lane ^ static_cast<unsigned>(mask)) % 32]);
  ::ferry_emu::wait_at(::ferry_emu::Fiber::at_warp);
  return r;
}

// Bit i set where lane i's predicate holds, every lane getting the same mask (all 32 lanes
// take part: the kernels pass the full mask).
inline unsigned __ballot_sync(unsigned, int predicate) {
  const unsigned lane = threadIdx.x % 32;
  ::ferry_emu::Warp& w = ::ferry_emu::warps[threadIdx.x / 32];
  w.lanes[lane] = predicate != 0 ? 1.0 : 0.0;
  ::ferry_emu::wait_at(::ferry_emu::Fiber::at_warp);
  unsigned mask = 0;
  for (unsigned i = 0; i < 32; ++i) mask |= w.lanes[i] != 0.0 ? 1u << i : 0u;
  ::ferry_emu::wait_at(::ferry_emu::Fiber::at_warp);
  return mask;
}

inline int __popc(unsigned x) {
  return __builtin_popcount(x);
}

// The warp's lanes meet: shared-memory writes before it are seen by every lane after it.
inline void __syncwarp(unsigned = 0xffffffffu) {
  ::ferry_emu::wait_at(::ferry_emu::Fiber::at_warp);
}

inline int atomicCAS(int* address, int compare, int value) {
  std::atomic_ref<int> a(*address);
  a.compare_exchange_strong(compare, value);
  return compare;  // the old value, as CUDA returns it
}

struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  return ferry::nn::bf16_to_f32(h.bits);
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return {ferry::nn::f32_to_bf16(f)};
}
inline float __half2float(__half h) {
  return ferry::nn::f16_to_f32(h.bits);
}
inline __half __float2half_rn(float f) {
  return {ferry::nn::f32_to_f16(f)};
}
// One float32 rounding each, never contracted into an FMA with a neighbour (CUDA's own
// guarantee for these intrinsics; here the volatile store makes the compiler round there).
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float __fadd_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}

#include "testing/emu_cuda_api.h"
#include "testing/emu_cublas.h"

namespace ferry_emu {

// Checks a launch as the runtime does (a bad one sets the error cudaGetLastError returns
// and queues nothing), then queues the kernel on its stream.
inline void launch_on(cudaStream_t s, const void* key, const char* name, dim3 grid, dim3 block,
                      size_t shared_bytes, std::function<void()> body) {
  auto& e = emu();
  std::unique_lock<std::mutex> lock(e.mu);
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    e.last_error = cudaErrorInvalidConfiguration;
    return;
  }
  auto it = e.max_dynamic_shared.find(key);
  const size_t limit = it == e.max_dynamic_shared.end() ? Emulator::kSharedDefault
                                                        : static_cast<size_t>(it->second);
  if (shared_bytes > limit) {
    e.last_error = cudaErrorInvalidValue;
    return;
  }
  if (block.y != 1 || block.z != 1 || block.x % 32 != 0)
    throw std::invalid_argument("cuda emulation: 1-D blocks of a multiple of 32 threads only");
  Op op;
  op.what = name;
  op.run = [grid, block, shared_bytes, body = std::move(body)] { launch(grid, block, shared_bytes, body); };
  e.enqueue(lock, stream_of(s), std::move(op));
}

}  // namespace ferry_emu
