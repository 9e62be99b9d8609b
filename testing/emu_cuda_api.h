// The CUDA runtime calls of the emulated GPU (tests only; see testing/emu_device.h for what
// is strict and why). Error codes and their names are the runtime's own, so messages read
// as they would on a GPU.
#pragma once

#include <cstdio>

#include "testing/emu_device.h"

using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
                      cudaErrorInvalidConfiguration = 9, cudaErrorInvalidDevice = 101,
                      cudaErrorInvalidResourceHandle = 400, cudaErrorNotReady = 600;
using cudaStream_t = ferry_emu::Stream*;
using cudaEvent_t = ferry_emu::Event*;
constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2;
constexpr unsigned cudaHostRegisterDefault = 0;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost,
  cudaMemcpyHostToDevice,
  cudaMemcpyDeviceToHost,
  cudaMemcpyDeviceToDevice,
  cudaMemcpyDefault
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};
struct cudaDeviceProp {
  char name[256];
  int major, minor;
  size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin;
  int multiProcessorCount;
};
struct cudaFuncAttributes {
  size_t sharedSizeBytes;
  int maxDynamicSharedSizeBytes, maxThreadsPerBlock;
  int ptxVersion, binaryVersion;  // the emulated code is built for the emulated GPU
};
enum cudaMemoryType {
  cudaMemoryTypeUnregistered,
  cudaMemoryTypeHost,
  cudaMemoryTypeDevice,
  cudaMemoryTypeManaged
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};
using cudaMemPool_t = struct ferry_emu_pool*;
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4 };

namespace ferry_emu {

// The compute capability's major number every emulated GPU reports (an H100's, 9), and its
// opt-in shared memory per block (an H100's): tests set smaller ones to see what needs a
// newer or larger GPU refuse, step aside or shrink its blocks (an A100: 166912 bytes; an
// RTX 4090, sm_89: 101376).
inline int compute_major = 9;
inline size_t shared_optin = Emulator::kSharedOptin;

inline Emulator& emu() { return Emulator::get(); }
inline int& current_device() {
  thread_local int d = 0;
  return d;
}
inline int device_count() {
  const char* n = std::getenv("FERRY_EMU_DEVICES");
  return n ? std::atoi(n) : 1;
}
inline Stream* stream_of(cudaStream_t s) { return s ? s : emu().legacy(); }
inline std::unordered_map<Event*, std::shared_ptr<Event>>& events() {
  static auto* m = new std::unordered_map<Event*, std::shared_ptr<Event>>();
  return *m;
}
inline double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
inline uint64_t enqueue(std::unique_lock<std::mutex>& lock, cudaStream_t s, std::string what,
                        std::function<void()> run) {
  Op op;
  op.what = std::move(what);
  op.run = std::move(run);
  return emu().enqueue(lock, stream_of(s), std::move(op));
}

}  // namespace ferry_emu

inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
  }
  return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
  }
  return "unknown error";
}
inline cudaError_t cudaGetLastError() {
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  return std::exchange(ferry_emu::emu().last_error, cudaSuccess);
}
inline cudaError_t cudaPeekAtLastError() {
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  return ferry_emu::emu().last_error;
}

// ---- devices ---------------------------------------------------------------------------------

inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = ferry_emu::device_count();
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= ferry_emu::device_count()) return cudaErrorInvalidDevice;
  ferry_emu::current_device() = d;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* d) {
  *d = ferry_emu::current_device();
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (d < 0 || d >= ferry_emu::device_count()) return cudaErrorInvalidDevice;
  std::snprintf(p->name, sizeof p->name, "emulated on CPU threads");
  p->major = ferry_emu::compute_major;
  p->minor = 0;
  p->totalGlobalMem = ferry_emu::emu().device_bytes();
  p->sharedMemPerBlock = ferry_emu::Emulator::kSharedDefault;
  p->sharedMemPerBlockOptin = ferry_emu::shared_optin;
  p->multiProcessorCount = 132;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
  if (d < 0 || d >= ferry_emu::device_count()) return cudaErrorInvalidDevice;
  switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = static_cast<int>(ferry_emu::Emulator::kSharedDefault); return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *v = 132; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = static_cast<int>(ferry_emu::shared_optin); return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *v = ferry_emu::compute_major; return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
// Bus ids differ per device; FERRY_EMU_BUS_BASE shifts them, so ranks of one test can be
// given the same or different "physical" GPUs.
inline cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int d) {
  if (d < 0 || d >= ferry_emu::device_count()) return cudaErrorInvalidDevice;
  const char* base = std::getenv("FERRY_EMU_BUS_BASE");
  std::snprintf(id, static_cast<size_t>(len), "0000:%02x:00.0", (base ? std::atoi(base) : 0) + d + 0x18);
  return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  *total = ferry_emu::emu().device_bytes();
  *free_bytes = *total - ferry_emu::Emulator::kContextBytes - ferry_emu::emu().in_use();
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  std::unique_lock<std::mutex> lock(ferry_emu::emu().mu);
  ferry_emu::emu().run_all(lock);
  return cudaSuccess;
}

// ---- memory ------------------------------------------------------------------------------------

inline cudaError_t cudaMalloc(void** p, size_t n) {
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  *p = ferry_emu::emu().allocate(n);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
// cudaFree waits for the device, as on a GPU.
inline cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  std::unique_lock<std::mutex> lock(ferry_emu::emu().mu);
  ferry_emu::emu().run_all(lock);
  return ferry_emu::emu().release(p) ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) {
  return cudaMalloc(p, n);  // the address is fixed now; later work on the stream may use it
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  if (!p) return cudaSuccess;
  std::unique_lock<std::mutex> lock(ferry_emu::emu().mu);
  if (!ferry_emu::emu().device_range(p, 1)) return cudaErrorInvalidValue;
  ferry_emu::enqueue(lock, s, "cudaFreeAsync", [p] { ferry_emu::emu().release(p); });
  return cudaSuccess;
}
inline cudaError_t cudaMallocHost(void** p, size_t n) {
  const size_t page = 4096, bytes = (std::max<size_t>(n, 1) + page - 1) / page * page;
  *p = std::aligned_alloc(page, bytes);
  if (!*p) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  ferry_emu::emu().pinned[static_cast<const char*>(*p)] = bytes;
  return cudaSuccess;
}
inline cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  std::unique_lock<std::mutex> lock(ferry_emu::emu().mu);
  ferry_emu::emu().run_all(lock);
  if (!ferry_emu::emu().pinned.erase(static_cast<const char*>(p))) return cudaErrorInvalidValue;
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaHostRegister(void* p, size_t n, unsigned) {
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  if (!p || !n || ferry_emu::emu().in_heap(p)) return cudaErrorInvalidValue;
  ferry_emu::emu().pinned[static_cast<const char*>(p)] = n;
  return cudaSuccess;
}
inline cudaError_t cudaHostUnregister(void* p) {
  std::unique_lock<std::mutex> lock(ferry_emu::emu().mu);
  ferry_emu::emu().run_all(lock);
  return ferry_emu::emu().pinned.erase(static_cast<const char*>(p)) ? cudaSuccess : cudaErrorInvalidValue;
}
// Host memory is "unregistered" unless pinned, as with the CUDA 11+ runtime.
inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  *a = {};
  a->device = -1;
  if (ferry_emu::emu().in_heap(p)) {
    a->type = cudaMemoryTypeDevice;
    a->device = ferry_emu::current_device();
    a->devicePointer = const_cast<void*>(p);
  } else if (ferry_emu::emu().is_pinned(p)) {
    a->type = cudaMemoryTypeHost;
    a->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int d) {
  static int token;
  if (d < 0 || d >= ferry_emu::device_count()) return cudaErrorInvalidDevice;
  *pool = reinterpret_cast<cudaMemPool_t>(&token);
  return cudaSuccess;
}
inline uint64_t& ferry_emu_pool_threshold() {
  static uint64_t t = 0;
  return t;
}
inline cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr a, void* v) {
  if (!pool || a != cudaMemPoolAttrReleaseThreshold) return cudaErrorInvalidValue;
  ferry_emu_pool_threshold() = *static_cast<uint64_t*>(v);
  return cudaSuccess;
}
inline cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr a, void* v) {
  if (!pool || a != cudaMemPoolAttrReleaseThreshold) return cudaErrorInvalidValue;
  *static_cast<uint64_t*>(v) = ferry_emu_pool_threshold();
  return cudaSuccess;
}

// Copies: checked against the allocations they touch and the direction they claim. A
// pageable source is read at the call (the runtime stages it); a pinned one when the copy
// runs. A pageable destination makes the call return after the copy; a pinned one holds
// stale bytes until the stream is synchronised.
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                                   cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  auto& e = ferry_emu::emu();
  std::unique_lock<std::mutex> lock(e.mu);
  const bool ddst = e.in_heap(dst), dsrc = e.in_heap(src);
  if ((ddst && !e.device_range(dst, n)) || (dsrc && !e.device_range(src, n))) return cudaErrorInvalidValue;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      if (!ddst || dsrc) return cudaErrorInvalidValue;
      if (e.is_pinned(src)) {
        ferry_emu::enqueue(lock, s, "memcpy HtoD", [=] { std::memcpy(dst, src, n); });
      } else {
        auto copy = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                        static_cast<const char*>(src) + n);
        ferry_emu::enqueue(lock, s, "memcpy HtoD", [=] { std::memcpy(dst, copy->data(), n); });
      }
      return cudaSuccess;
    case cudaMemcpyDeviceToHost: {
      if (ddst || !dsrc) return cudaErrorInvalidValue;
      const uint64_t id = ferry_emu::enqueue(lock, s, "memcpy DtoH", [=] { std::memcpy(dst, src, n); });
      if (!e.is_pinned(dst)) e.run_until(lock, id);
      return cudaSuccess;
    }
    case cudaMemcpyDeviceToDevice:
      if (!ddst || !dsrc) return cudaErrorInvalidValue;
      ferry_emu::enqueue(lock, s, "memcpy DtoD", [=] { std::memmove(dst, src, n); });
      return cudaSuccess;
    default:
      return cudaErrorInvalidValue;  // ferry always names the direction
  }
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  std::unique_lock<std::mutex> lock(ferry_emu::emu().mu);
  if (!ferry_emu::emu().device_range(p, n)) return cudaErrorInvalidValue;
  ferry_emu::enqueue(lock, s, "memset", [=] { std::memset(p, v, n); });
  return cudaSuccess;
}
// On the legacy default stream, which non-blocking streams do not wait for.
inline cudaError_t cudaMemset(void* p, int v, size_t n) {
  return cudaMemsetAsync(p, v, n, nullptr);
}

// ---- streams and events ------------------------------------------------------------------------

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  *s = ferry_emu::emu().new_stream();
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}
// Queued work still runs (when needed), as on a GPU.
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return cudaErrorInvalidResourceHandle;
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  s->destroyed = true;
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::unique_lock<std::mutex> lock(ferry_emu::emu().mu);
  ferry_emu::emu().run_stream(lock, ferry_emu::stream_of(s));
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  auto ev = std::make_shared<ferry_emu::Event>();
  ev->flags = flags;
  *e = ev.get();
  ferry_emu::events()[ev.get()] = std::move(ev);
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  return cudaEventCreateWithFlags(e, cudaEventDefault);
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  return ferry_emu::events().erase(e) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::unique_lock<std::mutex> lock(ferry_emu::emu().mu);
  auto it = ferry_emu::events().find(e);
  if (it == ferry_emu::events().end()) return cudaErrorInvalidResourceHandle;
  std::shared_ptr<ferry_emu::Event> ev = it->second;
  ev->not_ready_answers = 0;
  auto marker = std::make_shared<uint64_t>(0);
  ev->marker = ferry_emu::enqueue(lock, s, "", [ev, marker] {
    if (ev->marker == *marker) ev->time_ms = ferry_emu::now_ms();
  });
  *marker = ev->marker;
  return cudaSuccess;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  auto& emu = ferry_emu::emu();
  std::unique_lock<std::mutex> lock(emu.mu);
  if (!ferry_emu::events().count(e)) return cudaErrorInvalidResourceHandle;
  emu.order_wait(ferry_emu::stream_of(s), e->marker);
  if (emu.done(e->marker)) return cudaSuccess;
  emu.note_wait(ferry_emu::stream_of(s), e->marker);
  ferry_emu::Op op;
  op.deps = {e->marker};
  emu.enqueue(lock, ferry_emu::stream_of(s), std::move(op));
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  std::unique_lock<std::mutex> lock(ferry_emu::emu().mu);
  if (!ferry_emu::events().count(e)) return cudaErrorInvalidResourceHandle;
  ferry_emu::emu().run_until(lock, e->marker);
  return cudaSuccess;
}
inline cudaError_t cudaEventQuery(cudaEvent_t e) {
  std::unique_lock<std::mutex> lock(ferry_emu::emu().mu);
  if (!ferry_emu::events().count(e)) return cudaErrorInvalidResourceHandle;
  return ferry_emu::emu().progressed(lock, e->marker, e->not_ready_answers) ? cudaSuccess
                                                                            : cudaErrorNotReady;
}
inline cudaError_t cudaStreamQuery(cudaStream_t s) {
  std::unique_lock<std::mutex> lock(ferry_emu::emu().mu);
  int answers = 0;
  return ferry_emu::emu().progressed(lock, ferry_emu::emu().last_of(ferry_emu::stream_of(s)), answers)
             ? cudaSuccess
             : cudaErrorNotReady;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  if (!ferry_emu::events().count(a) || !ferry_emu::events().count(b)) return cudaErrorInvalidResourceHandle;
  if ((a->flags | b->flags) & cudaEventDisableTiming) return cudaErrorInvalidResourceHandle;
  if (!a->marker || !b->marker) return cudaErrorInvalidResourceHandle;
  if (!ferry_emu::emu().done(a->marker) || !ferry_emu::emu().done(b->marker)) return cudaErrorNotReady;
  *ms = static_cast<float>(b->time_ms - a->time_ms);
  return cudaSuccess;
}

// ---- kernels -----------------------------------------------------------------------------------

template <class K>
cudaError_t cudaFuncSetAttribute(K kernel, cudaFuncAttribute a, int value) {
  if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<size_t>(value) > ferry_emu::shared_optin)
    return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  ferry_emu::emu().max_dynamic_shared[reinterpret_cast<const void*>(kernel)] = value;
  return cudaSuccess;
}
// Static shared memory is not known to the emulation (__shared__ arrays are plain statics):
// sharedSizeBytes is 0, so the limits below apply to the dynamic part alone.
template <class K>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, K kernel) {
  std::lock_guard<std::mutex> lock(ferry_emu::emu().mu);
  auto& m = ferry_emu::emu().max_dynamic_shared;
  auto it = m.find(reinterpret_cast<const void*>(kernel));
  attr->sharedSizeBytes = 0;
  attr->maxDynamicSharedSizeBytes =
      it == m.end() ? static_cast<int>(ferry_emu::Emulator::kSharedDefault) : it->second;
  attr->maxThreadsPerBlock = 1024;
  attr->ptxVersion = attr->binaryVersion = ferry_emu::compute_major * 10;
  return cudaSuccess;
}
