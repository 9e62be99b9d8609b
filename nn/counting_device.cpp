#include "nn/counting_device.h"

#include <sys/mman.h>

#include <new>

#include "nn/op_checks.h"

namespace ferry::nn {

namespace {

constexpr const char* kDev = "counting";

size_t mapped_bytes(size_t bytes) { return (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096; }

void same(const char* op, const Tensor& a, const Tensor& b) { checks::same_shape(kDev, op, a, b); }

void same_numel(const char* op, const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) checks::fail(kDev, op, a.describe() + " vs " + b.describe());
}

// A [N, C] operand against a per-channel [C] one.
void channels(const char* op, const Tensor& rows, const Tensor& per_channel) {
  if (per_channel.defined() && per_channel.numel() != rows.dim(-1)) {
    checks::fail(kDev, op, rows.describe() + " with " + per_channel.describe());
  }
}

// Per-row statistics [N] of a [N, C] tensor.
void per_row(const char* op, const Tensor& rows, const Tensor& stats) {
  if (stats.defined() && stats.numel() != checks::rows_of(rows)) {
    checks::fail(kDev, op, rows.describe() + " with statistics " + stats.describe());
  }
}

}  // namespace

CountingDevice::CountingDevice(std::string label, size_t capacity_bytes, bool host_accessible, DeviceKind kind)
    : label_(std::move(label)), host_accessible_(host_accessible), kind_(kind) {
  stats_.capacity = capacity_bytes;
}

std::string CountingDevice::name() const { return "counting " + label_ + " (cap " + format_bytes(stats_.capacity) + ")"; }

void* CountingDevice::allocate(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > stats_.capacity - stats_.in_use) throw OutOfDeviceMemory(name(), bytes, stats_.in_use, stats_.capacity);
    stats_.in_use += bytes;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
    ++allocations_;
  }
  // Address space only: MAP_NORESERVE commits nothing, and no page exists until written.
  void* p = mmap(nullptr, mapped_bytes(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use -= bytes;
    throw std::bad_alloc();
  }
  return p;
}

void CountingDevice::deallocate(void* ptr, size_t bytes) noexcept {
  munmap(ptr, mapped_bytes(bytes));
  std::lock_guard<std::mutex> lock(mu_);
  stats_.in_use -= bytes;
}

MemoryStats CountingDevice::memory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CountingDevice::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak = stats_.in_use;
}

size_t CountingDevice::allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}

void CountingDevice::copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype()) checks::fail(kDev, "copy", dst.describe() + " <- " + src.describe());
  same_numel("copy", dst, src);
}

void CountingDevice::cast(const Tensor& dst, const Tensor& src) { same_numel("cast", dst, src); }

void CountingDevice::gemm(const Tensor& c, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, double,
                          double) {
  checks::gemm(kDev, c, a, trans_a, b, trans_b);
}

void CountingDevice::add_bias(const Tensor& out, const Tensor& bias) { channels("add_bias", out, bias); }
void CountingDevice::bias_backward(const Tensor& dbias, const Tensor& dout) { channels("bias_backward", dout, dbias); }

void CountingDevice::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  same_numel("add", out, a);
  same_numel("add", out, b);
}

void CountingDevice::accumulate(const Tensor& dst, const Tensor& src) { same_numel("accumulate", dst, src); }

void CountingDevice::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor&, const Tensor&,
                                       int64_t) {
  if (tokens.dtype() != DType::i32 || tokens.numel() != checks::rows_of(out)) {
    checks::fail(kDev, "embedding_forward", out.describe() + " from tokens " + tokens.describe());
  }
}

void CountingDevice::embedding_backward(const Tensor& dwte, const Tensor&, const Tensor& dout, const Tensor& tokens,
                                        int64_t) {
  if (tokens.numel() != checks::rows_of(dout) || dwte.dim(-1) != dout.dim(-1)) {
    checks::fail(kDev, "embedding_backward", dwte.describe() + " from " + dout.describe());
  }
}

void CountingDevice::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                       const Tensor& weight, const Tensor& bias) {
  same("layernorm_forward", out, inp);
  per_row("layernorm_forward", inp, mean);
  per_row("layernorm_forward", inp, rstd);
  channels("layernorm_forward", inp, weight);
  channels("layernorm_forward", inp, bias);
}

void CountingDevice::layernorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                        const Tensor& dout, const Tensor& inp, const Tensor&, const Tensor& mean,
                                        const Tensor& rstd) {
  same("layernorm_backward", dinp, inp);
  same("layernorm_backward", dout, inp);
  channels("layernorm_backward", inp, dweight);
  channels("layernorm_backward", inp, dbias);
  per_row("layernorm_backward", inp, mean);
  per_row("layernorm_backward", inp, rstd);
}

void CountingDevice::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t n_head,
                                       int64_t n_kv_head, const Tensor& doc_start) {
  checks::attention(kDev, "attention_forward", out, lse, qkv, n_head, n_kv_head == 0 ? n_head : n_kv_head);
  checks::doc_start(kDev, "attention_forward", doc_start, qkv);
}

void CountingDevice::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                        const Tensor& lse, int64_t n_head, int64_t n_kv_head,
                                        const Tensor& doc_start) {
  same("attention_backward", dqkv, qkv);
  same("attention_backward", dout, out);
  checks::attention(kDev, "attention_backward", dout, lse, qkv, n_head, n_kv_head == 0 ? n_head : n_kv_head);
  checks::doc_start(kDev, "attention_backward", doc_start, qkv);
}

void CountingDevice::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                                     double) {
  same("rmsnorm_forward", out, inp);
  per_row("rmsnorm_forward", inp, rstd);
  channels("rmsnorm_forward", inp, weight);
}

void CountingDevice::rmsnorm_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                                      const Tensor&, const Tensor& rstd) {
  same("rmsnorm_backward", dinp, inp);
  same("rmsnorm_backward", dout, inp);
  channels("rmsnorm_backward", inp, dweight);
  per_row("rmsnorm_backward", inp, rstd);
}

void CountingDevice::swiglu_forward(const Tensor& out, const Tensor& gate_up) {
  if (checks::rows_of(out) != checks::rows_of(gate_up) || 2 * out.dim(-1) != gate_up.dim(-1)) {
    checks::fail(kDev, "swiglu_forward", out.describe() + " from " + gate_up.describe());
  }
}

void CountingDevice::swiglu_backward(const Tensor& dgate_up, const Tensor& gate_up, const Tensor& dout) {
  same("swiglu_backward", dgate_up, gate_up);
  swiglu_forward(dout, gate_up);
}

void CountingDevice::rope_forward(const Tensor& out, const Tensor& inp, int64_t T, int64_t heads, int64_t head_dim,
                                  const Rope&) {
  checks::rope(kDev, "rope_forward", out, inp, T, heads, head_dim);
}

void CountingDevice::rope_backward(const Tensor& dinp, const Tensor& dout, int64_t T, int64_t heads, int64_t head_dim,
                                   const Rope&) {
  checks::rope(kDev, "rope_backward", dinp, dout, T, heads, head_dim);
}

void CountingDevice::gelu_forward(const Tensor& out, const Tensor& inp) { same("gelu_forward", out, inp); }

void CountingDevice::gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  same("gelu_backward", dinp, inp);
  same("gelu_backward", dout, inp);
}

void CountingDevice::softmax_cross_entropy_forward(const Tensor& losses, const Tensor& probs, const Tensor& logits,
                                                   const Tensor& targets) {
  same("softmax_cross_entropy_forward", probs, logits);
  per_row("softmax_cross_entropy_forward", logits, losses);
  per_row("softmax_cross_entropy_forward", logits, targets);
}

void CountingDevice::softmax_cross_entropy_backward(const Tensor& dlogits, const Tensor& probs, const Tensor& targets,
                                                    double) {
  same_numel("softmax_cross_entropy_backward", dlogits, probs);
  per_row("softmax_cross_entropy_backward", probs, targets);
}

void CountingDevice::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                           const AdamWStep&) {
  same_numel("adamw", param, grad);
  same_numel("adamw", param, m);
  same_numel("adamw", param, v);
}

}  // namespace ferry::nn
