// The cuda device's copies and ordering: host<->device copies and the offload path's
// uploads and downloads on their own streams, ordered by events; device-to-device copies;
// synchronize, the kernels' value-error flags, and the device clock for traces
// (nn/cuda_device.h, "Streams").
#include "nn/cuda/device_impl.h"

#include <stdexcept>
#include <type_traits>

namespace ferry::nn::cuda_dev {
FERRY_CUDA_ABI_BEGIN

void CudaDevice::after_compute(cudaStream_t s) {
  FERRY_CUDA_CHECK(cudaEventRecord(compute_done_, compute_));
  FERRY_CUDA_CHECK(cudaStreamWaitEvent(s, compute_done_, 0));
}

void CudaDevice::copy_from_host(const Tensor& dst, const void* src) {
  FERRY_CUDA_CHECK(cudaEventRecord(compute_done_, compute_));
  upload_on(dst, src, compute_done_, /*hold_src=*/false);
  debug_sync("copy_from_host");
}

// Waits only for the last use of dst's block before it was freed, so the copy overlaps
// the queued kernels that do not touch it (StagedUnits' next unit, the next batch), and
// the host does not wait for that fence: a pageable source has been staged by the runtime
// when cudaMemcpyAsync returns; a page-locked one is read when the copy runs, which the
// header's contract covers (the caller keeps it until the device is next waited for).
void CudaDevice::copy_into_new(const Tensor& dst, const void* src) {
  FencePtr fence;
  upload_on(dst, src, pending_fence(dst, fence), /*hold_src=*/true);
  debug_sync("copy_into_new");
}

cudaEvent_t CudaDevice::pending_fence(const Tensor& dst, FencePtr& keep) {
  std::lock_guard<std::mutex> lock(mu_);
  keep = arena_ ? arena_->fence_of(dst.data()) : nullptr;
  if (keep && keep->done) keep = nullptr;  // fired already: nothing to wait for
  return keep ? keep->event : nullptr;
}

namespace {

// An upload's or download's completion: an event recorded after the copy on its stream.
class CudaTransfer final : public Transfer {
 public:
  using Event = std::shared_ptr<std::remove_pointer_t<cudaEvent_t>>;
  CudaTransfer(Event begin, Event event, const char* what)
      : begin_(std::move(begin)), event_(std::move(event)), what_(what) {}
  Span span() const override { return {begin_, event_}; }
  bool done() override {
    if (done_) return true;
    const cudaError_t q = cudaEventQuery(event_.get());
    if (q == cudaErrorNotReady) return false;
    if (q != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(std::string("cuda device: ") + what_ + " failed: " + cudaGetErrorString(q));
    }
    return done_ = true;
  }
  void wait() override {
    if (done_) return;
    const cudaError_t e = cudaEventSynchronize(event_.get());
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error(std::string("cuda device: ") + what_ + " failed: " + cudaGetErrorString(e));
    }
    done_ = true;
  }

 private:
  Event begin_, event_;  // timing events around the copy on its stream
  const char* what_;
  bool done_ = false;
};

}  // namespace

// Like copy_into_new, but the host never waits (not even to stage a pageable source: the
// caller keeps `src` unchanged until done()), and the caller gets the completion.
TransferPtr CudaDevice::upload(const Tensor& dst, const void* src) {
  FencePtr fence;
  if (cudaEvent_t wait = pending_fence(dst, fence)) FERRY_CUDA_CHECK(cudaStreamWaitEvent(h2d_, wait, 0));
  auto begin = marks_->take();
  FERRY_CUDA_CHECK(cudaEventRecord(begin.get(), h2d_));
  FERRY_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, dst.nbytes(), cudaMemcpyHostToDevice, h2d_));
  to_device_ += dst.nbytes();
  auto done = marks_->take();
  FERRY_CUDA_CHECK(cudaEventRecord(done.get(), h2d_));
  FERRY_CUDA_CHECK(cudaStreamWaitEvent(compute_, done.get(), 0));
  debug_sync("upload");
  return std::make_shared<CudaTransfer>(std::move(begin), std::move(done), "upload");
}

// On the device-to-host stream after `after` (a collective's completion event) or after
// the compute work issued so far.
TransferPtr CudaDevice::download(void* dst, const Tensor& src, const std::shared_ptr<void>& after) {
  if (after) {
    FERRY_CUDA_CHECK(cudaStreamWaitEvent(d2h_, static_cast<cudaEvent_t>(after.get()), 0));
  } else {
    after_compute(d2h_);
  }
  auto begin = marks_->take();
  FERRY_CUDA_CHECK(cudaEventRecord(begin.get(), d2h_));
  FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.nbytes(), cudaMemcpyDeviceToHost, d2h_));
  to_host_ += src.nbytes();
  auto done = marks_->take();
  FERRY_CUDA_CHECK(cudaEventRecord(done.get(), d2h_));
  debug_sync("download");
  return std::make_shared<CudaTransfer>(std::move(begin), std::move(done), "download");
}

void CudaDevice::upload_on(const Tensor& dst, const void* src, cudaEvent_t wait, bool hold_src) {
  if (wait) FERRY_CUDA_CHECK(cudaStreamWaitEvent(h2d_, wait, 0));
  FERRY_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, dst.nbytes(), cudaMemcpyHostToDevice, h2d_));
  to_device_ += dst.nbytes();
  FERRY_CUDA_CHECK(cudaEventRecord(copy_done_, h2d_));
  FERRY_CUDA_CHECK(cudaStreamWaitEvent(compute_, copy_done_, 0));
  if (hold_src) return;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, src) != cudaSuccess) {
    cudaGetLastError();
    a.type = cudaMemoryTypeHost;  // unknown: wait, the safe side
  }
  // The caller may reuse `src` once this returns.
  if (a.type == cudaMemoryTypeHost) FERRY_CUDA_CHECK(cudaEventSynchronize(copy_done_));
}

void CudaDevice::copy_to_host(void* dst, const Tensor& src) {
  after_compute(d2h_);
  FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.nbytes(), cudaMemcpyDeviceToHost, d2h_));
  to_host_ += src.nbytes();
  FERRY_CUDA_CHECK(cudaStreamSynchronize(d2h_));
  debug_sync("copy_to_host");
  check_errors();  // a value read back after a flagged op must not hide its error
}

void CudaDevice::copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype() || dst.numel() != src.numel()) {
    fail(kDev, "copy", dst.describe() + " <- " + src.describe());
  }
  FERRY_CUDA_CHECK(
      cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, compute_));
  debug_sync("copy");
}

void CudaDevice::synchronize() {
  FERRY_CUDA_CHECK(cudaStreamSynchronize(compute_));
  FERRY_CUDA_CHECK(cudaStreamSynchronize(h2d_));
  FERRY_CUDA_CHECK(cudaStreamSynchronize(d2h_));
  check_errors();
}

// One read of every slot, only when a flagging op ran since the last: the step loop pays
// it at the host read it makes anyway (the loss), not after every op (review F7).
void CudaDevice::check_errors() {
  if (!flags_pending_.exchange(false)) return;
  FERRY_CUDA_CHECK(cudaMemcpyAsync(err_host_, err_, kErrorBytes, cudaMemcpyDeviceToHost, compute_));
  to_host_ += kErrorBytes;
  FERRY_CUDA_CHECK(cudaStreamSynchronize(compute_));
  for (int slot = 0; slot < kErrorSlots; ++slot) {
    const int* e = err_host_ + 3 * slot;
    if (e[0] == 0) continue;
    const int index = e[1], value = e[2];
    const std::string range = std::to_string(flag_limit_[slot]);
    FERRY_CUDA_CHECK(cudaMemsetAsync(err_, 0, kErrorBytes, compute_));
    if (slot == kTokenSlot) {
      throw std::out_of_range("embedding_forward: token " + std::to_string(value) + " at position " +
                              std::to_string(index) + " is outside the vocabulary [0, " + range + ")");
    }
    throw std::out_of_range("softmax_cross_entropy: target " + std::to_string(value) + " at row " +
                            std::to_string(index) + " is outside [0, " + range + ")");
  }
}

DeviceClock::Mark CudaDevice::mark() {
  auto e = marks_->take();
  FERRY_CUDA_CHECK(cudaEventRecord(e.get(), compute_));
  return e;
}

DeviceClock::Mark CudaDevice::passed_mark() {
  DeviceClock::Mark m = mark();
  FERRY_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(m.get())));
  return m;
}

double CudaDevice::seconds_between(const DeviceClock::Mark& a, const DeviceClock::Mark& b) {
  float ms = 0;
  const cudaError_t e =
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a.get()), static_cast<cudaEvent_t>(b.get()));
  if (e != cudaSuccess) {
    cudaGetLastError();  // not passed yet (cudaErrorNotReady): asked again later
    return std::nan("");
  }
  return ms / 1e3;
}

FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda_dev
