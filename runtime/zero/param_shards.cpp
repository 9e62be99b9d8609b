#include "runtime/zero/param_shards.h"

#include "base/log.h"
#include "offload/staged_copy.h"

namespace ferry::runtime {

using nn::DType;
using nn::Tensor;

// With nvme, the first units' shards up to max_in_cpu elements stay in host memory; the
// rest go to the configured tier.
ParamShards::ParamShards(nn::Device& device, const std::vector<Partition>& parts,
                         const std::vector<std::string>& names, int rank, const Placement& place)
    : dev_(device), parts_(parts), names_(names), place_(place) {
  const size_t n = parts.size();
  std::vector<int64_t> main_sizes, cpu_sizes;
  std::vector<bool> in_cpu(n, false);
  int64_t cached = 0;
  for (size_t u = 0; u < n; ++u) {
    const int64_t shard = parts[u].shard;
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
                                                  place_.aio, &warning, place_.fault);
  if (!cpu_sizes.empty()) {
    params_cpu_ = std::make_unique<offload::ShardStore>(offload::Tier::cpu, dev_, *place_.host, cpu_sizes,
                                                        std::vector<std::string>{}, "", place_.aio, nullptr);
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

void ParamShards::init(int unit, const Tensor& full) {
  const Partition& p = parts_.at(static_cast<size_t>(unit));
  std::vector<float> host;  // a GPU's shard comes through host memory once, at start
  const float* src = nullptr;
  if (!dev_.host_accessible()) {
    host.resize(static_cast<size_t>(p.shard));
    if (p.shard > 0) dev_.copy_to_host(host.data(), full.view(p.begin(), {p.shard}));
    src = host.data();
  } else {
    src = full.data_as<float>() + p.begin();
  }
  offload::write_staged(store(unit), region(unit), src, p.shard, place_.pool);
}

Tensor ParamShards::fetch(int unit) {
  if (!on_nvme(unit)) return resident(unit);
  const int64_t n = parts_.at(static_cast<size_t>(unit)).shard;
  Tensor shard = Tensor::empty(dev_, DType::f32, {n});
  Tracer::Span span(tracer_, Activity::param_read, names_.at(static_cast<size_t>(unit)), static_cast<uint64_t>(n) * 4);
  offload::read_staged(store(unit), region(unit), shard.data_as<float>(), n, *place_.pool);
  return shard;
}

void ParamShards::read_into(int unit, float* buf) {
  const int64_t n = parts_.at(static_cast<size_t>(unit)).shard;
  Tracer::Span span(tracer_, Activity::param_read, names_.at(static_cast<size_t>(unit)), static_cast<uint64_t>(n) * 4);
  store(unit).read(region(unit), 0, n, buf);
}

void ParamShards::read(int unit, int64_t offset, int64_t n, float* buf) { store(unit).read(region(unit), offset, n, buf); }

void ParamShards::write(int unit, int64_t offset, int64_t n, const float* buf) {
  Tracer::Span span(on_nvme(unit) ? tracer_ : nullptr, Activity::param_write, names_.at(static_cast<size_t>(unit)),
                    static_cast<uint64_t>(n) * 4);
  store(unit).write(region(unit), offset, n, buf);
}

int64_t ParamShards::buffer_elements() const {
  return place_.pool ? static_cast<int64_t>(place_.pool->buffer_size() / 4) : 0;
}

ParamShards::Bytes ParamShards::bytes() const {
  Bytes b;
  b.total = params_->bytes();
  if (params_->tier() == offload::Tier::cpu) b.host += params_->bytes();
  if (params_->tier() == offload::Tier::nvme) b.nvme += params_->bytes();
  if (params_cpu_) b.total += params_cpu_->bytes(), b.host += params_cpu_->bytes();
  return b;
}

}  // namespace ferry::runtime
