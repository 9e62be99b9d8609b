#include "runtime/zero/param_shards.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "base/log.h"
#include "offload/staged_copy.h"

namespace ferry::runtime {

using nn::DType;
using nn::Tensor;

namespace {

// Aligned host scratch for one range in the store's dtype (nvme wants 4 KiB alignment
// and room for the rounded-up tail).
struct Scratch {
  explicit Scratch(size_t bytes) : p(std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096)) {
    if (!p) throw std::bad_alloc();
  }
  ~Scratch() { std::free(p); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* p;
};

}  // namespace

// With nvme, the first units' shards up to max_in_cpu elements stay in host memory; the
// rest go to the configured tier.
ParamShards::ParamShards(nn::Device& device, const std::vector<UnitPartition>& parts,
                         const std::vector<std::string>& names, int rank, const Placement& place, DType compute)
    : dev_(device), names_(names), place_(place) {
  for (const UnitPartition& p : parts) sizes_.push_back(p.stored());
  if ((place_.params != offload::Tier::device || place_.low_precision_on_device) && nn::is_low_precision(compute)) {
    dtype_ = compute;
  }
  const size_t n = parts.size();
  std::vector<int64_t> main_sizes, cpu_sizes;
  std::vector<bool> in_cpu(n, false);
  int64_t cached = 0;
  for (size_t u = 0; u < n; ++u) {
    const int64_t shard = sizes_[u];
    if (place_.params == offload::Tier::nvme && cached + shard <= place_.max_in_cpu) {
      in_cpu[u] = true;
      cached += shard;
      cpu_sizes.push_back(shard);
    } else {
      main_sizes.push_back(shard);
    }
  }
  std::string warning;
  params_ = std::make_unique<offload::ShardStore>(place_.params, dev_, place_.host ? *place_.host : dev_, main_sizes,
                                                  place_.param_paths, "ferry-params-rank" + std::to_string(rank),
                                                  place_.aio, &warning, place_.fault, dtype_);
  if (!cpu_sizes.empty()) {
    params_cpu_ = std::make_unique<offload::ShardStore>(offload::Tier::cpu, dev_, *place_.host, cpu_sizes,
                                                        std::vector<std::string>{}, "", place_.aio, nullptr,
                                                        offload::FaultHook{}, dtype_);
  }
  int main_index = 0, cpu_index = 0;
  for (size_t u = 0; u < n; ++u) {
    home_.emplace_back(in_cpu[u] ? params_cpu_.get() : params_.get(), in_cpu[u] ? cpu_index++ : main_index++);
  }
  if (!warning.empty()) log::warn(log::Subsys::offload, "parameters: " + warning);
  if (place_.params == offload::Tier::nvme) {
    const std::string why = params_->use_pool(*place_.pool);
    if (!why.empty()) log::warn(log::Subsys::offload, "parameters: no fixed buffers: " + why);
  }
}

void ParamShards::init(int unit, const Tensor& shard) {
  const int64_t n = sizes_.at(static_cast<size_t>(unit));
  if (n == 0) return;
  if (shard.numel() != n) throw std::invalid_argument("ParamShards::init: " + shard.describe() + " for a shard of " + std::to_string(n));
  // The shard in the store's dtype (rounded by the device, as every gather of the fp32
  // shard would round it), then through host memory into the store, once, at start.
  Tensor slice = shard;
  if (dtype_ != slice.dtype()) {
    const Tensor low = Tensor::empty(dev_, dtype_, {n});
    dev_.cast(low, slice);
    slice = low;
  }
  const size_t esize = nn::dtype_size(dtype_);
  const size_t bytes = static_cast<size_t>(n) * esize;
  std::unique_ptr<Scratch> host;
  const char* src = nullptr;
  if (!dev_.host_accessible()) {
    host = std::make_unique<Scratch>(bytes);
    dev_.copy_to_host(host->p, slice);
    src = static_cast<const char*>(host->p);
  } else {
    src = static_cast<const char*>(slice.data());
  }
  if (!on_nvme(unit)) return store(unit).write(region(unit), 0, n, src);
  offload::PooledBuffer staging(*place_.pool);
  const int64_t piece = buffer_elements();
  for (int64_t k = 0; k < n; k += piece) {
    const int64_t len = std::min(piece, n - k);
    // Through the pool: a count-only pool (the plan's dry run) moves nothing, so a plan of a
    // 25-billion-parameter model does not fault in and copy 100 GB of its initial weights.
    place_.pool->copy(staging.get(), src + static_cast<size_t>(k) * esize, static_cast<size_t>(len) * esize);
    store(unit).write(region(unit), k, len, staging.get());
  }
}

Tensor ParamShards::fetch(int unit) {
  const Tensor home = on_nvme(unit) ? Tensor{} : resident(unit);
  if (home.defined() && (dev_.host_accessible() || &home.device() == &dev_)) return home;
  const int64_t n = sizes_.at(static_cast<size_t>(unit));
  Tensor shard = Tensor::empty(dev_, dtype_, {n});
  if (!on_nvme(unit)) {
    // Host memory, page-locked on a GPU run: up as a shard; ops issued next see it. The
    // optimizer rewrites the host shard only after this unit's gradient has come down,
    // which is after every kernel that read this copy.
    upload(unit, shard, home.data());
    return shard;
  }
  const size_t esize = nn::dtype_size(dtype_);
  Tracer::Span span(tracer_, Activity::param_read, names_.at(static_cast<size_t>(unit)), static_cast<uint64_t>(n) * esize);
  // Not read ahead (the prefetcher's path is the usual one): through one pool buffer at a
  // time; on a GPU each piece is uploaded and waited for before the buffer is reused.
  offload::PooledBuffer buf(*place_.pool);
  for (int64_t k = 0; k < n; k += buffer_elements()) {
    const int64_t len = std::min(buffer_elements(), n - k);
    store(unit).read(region(unit), k, len, buf.get());
    if (dev_.host_accessible()) {
      place_.pool->copy(static_cast<char*>(shard.data()) + static_cast<size_t>(k) * esize, buf.get(),
                        static_cast<size_t>(len) * esize);
    } else {
      upload(unit, shard.view(k, {len}), buf.get())->wait();
    }
  }
  return shard;
}

nn::TransferPtr ParamShards::upload(int unit, const Tensor& dst, const void* src) {
  nn::TransferPtr t = dev_.upload(dst, src);
  if (tracer_) {
    const nn::Transfer::Span s = t->span();
    tracer_->record_device(Activity::upload, names_.at(static_cast<size_t>(unit)), s.begin, s.end, dst.nbytes());
  }
  return t;
}

void ParamShards::read_into(int unit, void* buf, Tracer::Clock::time_point queued) {
  const int64_t n = sizes_.at(static_cast<size_t>(unit));
  Tracer::Span span(tracer_, Activity::param_read, names_.at(static_cast<size_t>(unit)),
                    static_cast<uint64_t>(n) * nn::dtype_size(dtype_));
  span.set_queued(queued);
  store(unit).read(region(unit), 0, n, buf);
}

void ParamShards::read(int unit, int64_t offset, int64_t n, float* buf) {
  if (dtype_ == DType::f32) return store(unit).read(region(unit), offset, n, buf);
  // bf16 or f16: through aligned scratch (nvme's rules), then widened.
  Scratch low(static_cast<size_t>(n) * 2 + 4096);
  store(unit).read(region(unit), offset, n, low.p);
  const auto* h = static_cast<const uint16_t*>(low.p);
  if (dtype_ == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) buf[i] = nn::bf16_to_f32(h[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) buf[i] = nn::f16_to_f32(h[i]);
  }
}

void ParamShards::write(int unit, int64_t offset, int64_t n, const float* buf) {
  if (dtype_ == DType::f32) {
    Tracer::Span span(on_nvme(unit) ? tracer_ : nullptr, Activity::param_write, names_.at(static_cast<size_t>(unit)),
                      static_cast<uint64_t>(n) * 4);
    return store(unit).write(region(unit), offset, n, buf);
  }
  Scratch low(static_cast<size_t>(n) * 2 + 4096);
  auto* h = static_cast<uint16_t*>(low.p);
  if (dtype_ == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) h[i] = nn::f32_to_bf16(buf[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) h[i] = nn::f32_to_f16(buf[i]);
  }
  write_rounded(unit, offset, n, h);
}

void ParamShards::write_rounded(int unit, int64_t offset, int64_t n, const uint16_t* buf) {
  if (dtype_ == DType::f32) throw std::logic_error("ParamShards::write_rounded on fp32 shards");
  Tracer::Span span(on_nvme(unit) ? tracer_ : nullptr, Activity::param_write, names_.at(static_cast<size_t>(unit)),
                    static_cast<uint64_t>(n) * 2);
  if (!on_nvme(unit)) return store(unit).write(region(unit), offset, n, buf);
  Scratch aligned(static_cast<size_t>(n) * 2 + 4096);  // O_DIRECT: aligned, room for the rounded tail
  std::memcpy(aligned.p, buf, static_cast<size_t>(n) * 2);
  store(unit).write(region(unit), offset, n, aligned.p);
}

int64_t ParamShards::buffer_elements() const {
  return place_.pool ? static_cast<int64_t>(place_.pool->buffer_size() / nn::dtype_size(dtype_)) : 0;
}

int64_t ParamShards::quantum() const { return params_->quantum(); }

ParamShards::Bytes ParamShards::bytes() const {
  Bytes b;
  b.total = params_->bytes();
  if (params_->tier() == offload::Tier::cpu) b.host += params_->bytes();
  if (params_->tier() == offload::Tier::nvme) b.nvme += params_->bytes();
  if (params_cpu_) b.total += params_cpu_->bytes(), b.host += params_cpu_->bytes();
  return b;
}

}  // namespace ferry::runtime
