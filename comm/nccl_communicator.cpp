#include "comm/nccl_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

// In the CPU-emulated test build these are testing/cuda_shim's stand-ins (one rank).
#include <cuda_runtime.h>
#include <nccl.h>

#include "base/handle_pool.h"
#include "base/log.h"
#include "comm/gpu_binding.h"
#include "comm/watchdog.h"

namespace ferry::comm {
FERRY_NCCL_ABI_BEGIN

namespace {

[[noreturn]] void throw_cuda(cudaError_t e, const char* call, int line) {
  throw CommError(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                  ") in " + call + " at nccl_communicator.cpp:" + std::to_string(line));
}

[[noreturn]] void throw_nccl(ncclResult_t r, const char* call, int line, ncclComm_t comm) {
  std::string detail = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  throw CommError(std::string("NCCL error ") + ncclGetErrorString(r) + " in " + call +
                  " at nccl_communicator.cpp:" + std::to_string(line) +
                  (detail.empty() ? "" : ": " + detail));
}

#define FERRY_COMM_CUDA_CHECK(call)                         \
  do {                                                      \
    const cudaError_t e_ = (call);                          \
    if (e_ != cudaSuccess) throw_cuda(e_, #call, __LINE__); \
  } while (0)

#define FERRY_NCCL_CHECK(call, comm)                                \
  do {                                                              \
    const ncclResult_t r_ = (call);                                 \
    if (r_ != ncclSuccess) throw_nccl(r_, #call, __LINE__, (comm)); \
  } while (0)

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::f32:
      return ncclFloat32;
    case DataType::f64:
      return ncclFloat64;
    case DataType::i32:
      return ncclInt32;
    case DataType::u8:
      return ncclUint8;
    case DataType::u16:
      return ncclFloat16;  // moved bit for bit, never reduced
  }
  return ncclUint8;
}

bool on_device(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

using EventObj = std::remove_pointer_t<cudaEvent_t>;  // CUevent_st, or the emulation's

// Completion events come from a pool (base/handle_pool.h): creating and destroying one
// per collective costs driver time on the issuing thread (review F18). CUDA allows
// re-recording an event a stream still waits on: a wait binds to the record made before
// it. They keep timing on, so traces can time collectives on the device (review F6).
using EventPool = HandlePool<cudaEvent_t>;

std::shared_ptr<EventPool> make_event_pool() {
  return EventPool::make(
      [] {
        cudaEvent_t e = nullptr;
        FERRY_COMM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
        return e;
      },
      [](cudaEvent_t e) { cudaEventDestroy(e); });
}

class NcclComm final : public NcclCommunicator {
 public:
  NcclComm(MpiCommunicator& world, void* order_after, double timeout_s);
  ~NcclComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  int gpu() const override { return gpu_; }
  void order_before(void* stream) override;
  bool orders_on_device() const override { return order_after_ != nullptr; }
  void order_consumer(const Work& work) override;

 protected:
  void execute(const Op& op, const WorkPtr& work) override;

 private:
  struct Pending {
    std::shared_ptr<EventObj> done;
    WorkPtr work;
    uint64_t watch;
  };
  void poll_loop();
  [[noreturn]] void fail_all(const std::string& message);
  // Logs `message` first (ncclCommAbort may block), aborts the NCCL communicator once,
  // whichever thread (poller, watchdog) gets here first, then ends the job.
  [[noreturn]] void abort_all(const std::string& message);

  int rank_, size_, local_rank_, local_size_, gpu_ = 0;
  cudaStream_t order_after_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t before_ = nullptr;
  ncclComm_t comm_ = nullptr;
  void* barrier_buf_ = nullptr;
  std::unique_ptr<Watchdog> watchdog_;
  std::shared_ptr<EventPool> events_ = make_event_pool();
  std::atomic<bool> aborting_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  bool stop_ = false;
  std::thread poller_;
};

NcclComm::NcclComm(MpiCommunicator& world, void* order_after, double timeout_s)
    : rank_(world.rank()),
      size_(world.size()),
      local_rank_(world.local_rank()),
      local_size_(world.local_size()),
      order_after_(static_cast<cudaStream_t>(order_after)) {
  int gpus = 0;
  FERRY_COMM_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  const GpuChoice choice = choose_gpu(gpus, local_rank_, local_size_);
  if (choice.ordinal < 0) throw CommError("rank " + std::to_string(rank_) + ": NCCL: " + choice.problem);
  gpu_ = choice.ordinal;
  FERRY_COMM_CUDA_CHECK(cudaSetDevice(gpu_));
  // NCCL itself fails obscurely (or hangs) when two ranks share a GPU: refuse first, on
  // every rank, naming both.
  char bus[32] = {};
  FERRY_COMM_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, gpu_));
  if (const std::string p = shared_gpu_problem(world, bus); !p.empty())
    throw CommError("rank " + std::to_string(rank_) + ": NCCL: " + p);
  watchdog_ = std::make_unique<Watchdog>(timeout_s, [this](const std::string& report) {
    const std::string msg =
        "watchdog: rank " + std::to_string(rank_) + " (nccl, GPU " + std::to_string(gpu_) +
        "): " + report +
        "; another rank did not reach this collective or died. Recent collectives:\n" +
        recent_ops() + "Aborting the NCCL communicator and the job.";
    abort_all(msg);
  });
  ncclUniqueId id{};
  if (rank_ == 0) FERRY_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
  world.broadcast(&id, sizeof id, DataType::u8, 0)->wait();
  const uint64_t watch = watchdog_->begin("ncclCommInitRank (rank " + std::to_string(rank_) +
                                          " of " + std::to_string(size_) + ")");
  FERRY_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_), nullptr);
  watchdog_->end(watch);
  FERRY_COMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  FERRY_COMM_CUDA_CHECK(cudaEventCreateWithFlags(&before_, cudaEventDisableTiming));
  FERRY_COMM_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(int)));
  poller_ = std::thread([this] { poll_loop(); });
}

NcclComm::~NcclComm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (poller_.joinable()) poller_.join();
  watchdog_.reset();
  cudaStreamSynchronize(stream_);
  pending_.clear();
  if (comm_) ncclCommDestroy(comm_);
  cudaFree(barrier_buf_);
  cudaEventDestroy(before_);
  cudaStreamDestroy(stream_);
}

void NcclComm::order_before(void* stream) {
  FERRY_COMM_CUDA_CHECK(cudaEventRecord(before_, stream_));
  FERRY_COMM_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), before_, 0));
}

void NcclComm::order_consumer(const Work& work) {
  if (!order_after_) return;
  auto done = std::static_pointer_cast<EventObj>(work.device_marker);
  if (!done) return order_before(order_after_);  // issued elsewhere: wait for the tail
  FERRY_COMM_CUDA_CHECK(cudaStreamWaitEvent(order_after_, done.get(), 0));
}

void NcclComm::execute(const Op& op, const WorkPtr& work) {
  FERRY_COMM_CUDA_CHECK(cudaSetDevice(gpu_));  // the issuing thread may not have chosen it
  if (order_after_) {
    FERRY_COMM_CUDA_CHECK(cudaEventRecord(before_, order_after_));
    FERRY_COMM_CUDA_CHECK(cudaStreamWaitEvent(stream_, before_, 0));
  }
  const size_t esize = data_type_size(op.type);
  const size_t recv_count =
      op.kind == OpKind::all_gather ? op.count * static_cast<size_t>(size_) : op.count;
  const size_t send_count =
      op.kind == OpKind::reduce_scatter ? op.count * static_cast<size_t>(size_) : op.count;
  // Host buffers: staged through stream-ordered device memory.
  void* send = const_cast<void*>(op.send);
  void* recv = op.recv;
  void* send_dev = nullptr;
  void* recv_dev = nullptr;
  const bool has_data = op.kind != OpKind::barrier && op.count > 0;
  const bool in_place = op.kind == OpKind::all_reduce || op.kind == OpKind::broadcast;
  if (has_data && !on_device(recv)) {
    FERRY_COMM_CUDA_CHECK(cudaMallocAsync(&recv_dev, recv_count * esize, stream_));
    if (in_place) {
      FERRY_COMM_CUDA_CHECK(
          cudaMemcpyAsync(recv_dev, recv, recv_count * esize, cudaMemcpyHostToDevice, stream_));
    }
  }
  if (has_data && !in_place && !on_device(send)) {
    FERRY_COMM_CUDA_CHECK(cudaMallocAsync(&send_dev, send_count * esize, stream_));
    FERRY_COMM_CUDA_CHECK(
        cudaMemcpyAsync(send_dev, send, send_count * esize, cudaMemcpyHostToDevice, stream_));
  }
  void* r = recv_dev ? recv_dev : recv;
  void* s = in_place ? r : (send_dev ? send_dev : send);
  const ncclRedOp_t red = op.reduce == ReduceOp::avg ? ncclAvg : ncclSum;
  std::shared_ptr<EventObj> start = events_->take();
  FERRY_COMM_CUDA_CHECK(cudaEventRecord(start.get(), stream_));
  work->device_start = start;
  const uint64_t watch =
      watchdog_->begin("rank " + std::to_string(rank_) + ": nccl " + op.describe());
  work->mark_started();
  switch (op.kind) {
    case OpKind::all_gather:
      if (has_data)
        FERRY_NCCL_CHECK(ncclAllGather(s, r, op.count, nccl_type(op.type), comm_, stream_), comm_);
      break;
    case OpKind::reduce_scatter:
      if (has_data) {
        FERRY_NCCL_CHECK(ncclReduceScatter(s, r, op.count, nccl_type(op.type), red, comm_, stream_),
                         comm_);
      }
      break;
    case OpKind::all_reduce:
      if (has_data)
        FERRY_NCCL_CHECK(ncclAllReduce(r, r, op.count, nccl_type(op.type), red, comm_, stream_),
                         comm_);
      break;
    case OpKind::broadcast:
      if (has_data)
        FERRY_NCCL_CHECK(ncclBroadcast(r, r, op.count, nccl_type(op.type), op.root, comm_, stream_),
                         comm_);
      break;
    case OpKind::barrier:
      FERRY_NCCL_CHECK(
          ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, stream_), comm_);
      break;
  }
  if (recv_dev) {
    // A pageable destination makes this copy wait for the collective: the documented cost
    // of host buffers.
    FERRY_COMM_CUDA_CHECK(
        cudaMemcpyAsync(recv, recv_dev, recv_count * esize, cudaMemcpyDeviceToHost, stream_));
    FERRY_COMM_CUDA_CHECK(cudaFreeAsync(recv_dev, stream_));
  }
  if (send_dev) FERRY_COMM_CUDA_CHECK(cudaFreeAsync(send_dev, stream_));
  std::shared_ptr<EventObj> done = events_->take();
  FERRY_COMM_CUDA_CHECK(cudaEventRecord(done.get(), stream_));
  work->device_marker = done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({done, work, watch});
  }
  cv_.notify_all();
}

// A failed NCCL communicator cannot continue, and under device-side ordering nobody waits
// on the Works: the error ends the job with its message, as the watchdog does.
void NcclComm::fail_all(const std::string& message) {
  std::deque<Pending> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed.swap(pending_);
  }
  for (auto& p : failed) {
    watchdog_->end(p.watch);
    p.work->fail(message);
  }
  abort_all(message + "\nRecent collectives:\n" + recent_ops());
}

void NcclComm::abort_all(const std::string& message) {
  if (aborting_.exchange(true)) {
    // The other thread is aborting already and ends the job; wait for it.
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  log::error(log::Subsys::comm, message);
  if (comm_) ncclCommAbort(comm_);  // the stuck kernels return; the process ends next
  MpiCommunicator::abort_job("rank " + std::to_string(rank_) + ": NCCL communicator aborted (see above)", 1);
}

// Completes Works in issue order as their events fire; checks NCCL's asynchronous error
// state while any are pending. Sleeps on the condition variable when idle; while a
// collective runs, spins briefly, then naps with a growing interval (at most 0.5 ms), so
// a long collective does not cost tens of thousands of wake-ups a second (review F18).
// Device-side consumers never wait for the poller: only host waits see its latency.
void NcclComm::poll_loop() {
  if (cudaSetDevice(gpu_) != cudaSuccess) return;
  std::unique_lock<std::mutex> lock(mu_);
  int idle = 0;
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !pending_.empty(); });
    if (stop_ && pending_.empty()) return;
    Pending front = pending_.front();
    lock.unlock();
    const cudaError_t q = cudaEventQuery(front.done.get());
    if (q == cudaSuccess) {
      lock.lock();
      pending_.pop_front();
      lock.unlock();
      watchdog_->end(front.watch);
      front.work->complete();
      idle = 0;
    } else if (q != cudaErrorNotReady) {
      // Errors are sticky and surface at the next query: the culprit may be any kernel
      // queued before this collective. FERRY_CUDA_SYNC=1 names it.
      fail_all(std::string("rank ") + std::to_string(rank_) + ": a CUDA error (" + cudaGetErrorName(q) + ": " +
               cudaGetErrorString(q) + ", possibly from a compute kernel queued before it) while waiting for " +
               front.work->what() + "; rerun with FERRY_CUDA_SYNC=1 to find the call that failed");
    } else {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess) {
        fail_all("rank " + std::to_string(rank_) + ": NCCL error " + ncclGetErrorString(async) +
                 ": " + ncclGetLastError(comm_));
      } else if (++idle > 64) {
        std::this_thread::sleep_for(std::chrono::microseconds(std::min(500, 10 * (idle - 64))));
      }
    }
    lock.lock();
  }
}

}  // namespace

NcclStatus nccl_status() {
  NcclStatus s;
  s.built = true;
  int gpus = 0;
  const cudaError_t e = cudaGetDeviceCount(&gpus);
  if (e != cudaSuccess) {
    cudaGetLastError();
    s.reason = std::string("no usable GPU: cudaGetDeviceCount says ") + cudaGetErrorString(e);
  } else if (gpus == 0) {
    s.reason = "no GPU: the CUDA runtime sees 0 devices";
  }
  return s;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(MpiCommunicator& world,
                                                           void* order_after, double timeout_s) {
  const NcclStatus s = nccl_status();
  if (!s.reason.empty())
    throw CommError("rank " + std::to_string(world.rank()) + ": NCCL unavailable: " + s.reason);
  return std::make_unique<NcclComm>(world, order_after, timeout_s);
}

FERRY_NCCL_ABI_END
}  // namespace ferry::comm
