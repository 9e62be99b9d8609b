#include "offload/shard_store.h"

#include <cstring>
#include <stdexcept>

namespace ferry::offload {

using nn::DType;
using nn::Tensor;

namespace {
int64_t round_up(int64_t n, int64_t q) { return (n + q - 1) / q * q; }
}  // namespace

ShardStore::ShardStore(Tier tier, nn::Device& device, nn::Device& host, const std::vector<int64_t>& sizes,
                       const std::vector<std::string>& nvme_paths, const std::string& name,
                       const offload::AioConfig& aio, std::string* warning, const offload::FaultHook& fault,
                       nn::DType dtype)
    : tier_(tier), dtype_(dtype), esize_(nn::dtype_size(dtype)), sizes_(sizes) {
  if (dtype_ != DType::f32 && !nn::is_low_precision(dtype_)) {
    throw std::invalid_argument("ShardStore: fp32, bf16 or f16 regions");
  }
  if (tier_ != Tier::nvme) {
    nn::Device& d = tier_ == Tier::device ? device : host;
    for (int64_t n : sizes_) {
      tensors_.push_back(Tensor::empty(d, dtype_, {n}));
      d.fill(tensors_.back(), 0.0);
    }
    return;
  }
  uint64_t total = 0;
  for (int64_t n : sizes_) {
    offsets_.push_back(total);
    total += static_cast<uint64_t>(round_up(std::max<int64_t>(n, 1), quantum())) * esize_;
  }
  offload::StorageOptions o;
  o.paths = nvme_paths;
  o.name = name;
  o.capacity = std::max<uint64_t>(total, 4096);
  o.aio = aio;
  o.fault = fault;
  storage_ = offload::make_storage(o, warning);
  // Zero every region once, through one aligned buffer: the files may hold an old run.
  const size_t chunk = 4 << 20;
  void* zeros = std::aligned_alloc(4096, chunk);
  std::memset(zeros, 0, chunk);
  for (uint64_t off = 0; off < storage_->capacity(); off += chunk) {
    storage_->write(off, zeros, static_cast<size_t>(std::min<uint64_t>(chunk, storage_->capacity() - off)));
  }
  std::free(zeros);
}

std::string ShardStore::use_pool(const offload::PinnedPool& pool) {
  if (!storage_) return "";
  try {
    storage_->register_buffers(pool.regions());
  } catch (const offload::StorageError& e) {
    return e.what();
  }
  return "";
}

std::string ShardStore::where() const {
  if (tier_ == Tier::nvme) return "nvme: " + storage_->describe();
  return tier_ == Tier::device ? "the device arena" : "host memory";
}

size_t ShardStore::bytes() const {
  size_t b = 0;
  for (int64_t n : sizes_) b += static_cast<size_t>(n) * esize_;
  return b;
}

Tensor ShardStore::tensor(int region) const {
  if (tier_ == Tier::nvme) return Tensor{};
  return tensors_.at(static_cast<size_t>(region));
}

void ShardStore::read(int region, int64_t offset, int64_t n, void* dst) {
  const auto r = static_cast<size_t>(region);
  if (offset < 0 || n < 0 || offset + n > sizes_.at(r)) throw std::out_of_range("ShardStore::read out of its region");
  if (tier_ != Tier::nvme) {
    if (n > 0) tensors_[r].device().copy_to_host(dst, tensors_[r].view(offset, {n}));  // a GPU's too
    return;
  }
  if (offset % quantum()) throw std::invalid_argument("ShardStore::read: nvme offsets are multiples of 4 KiB");
  storage_->read(offsets_[r] + static_cast<uint64_t>(offset) * esize_, dst, static_cast<size_t>(round_up(n, quantum())) * esize_);
}

void ShardStore::write(int region, int64_t offset, int64_t n, const void* src) {
  const auto r = static_cast<size_t>(region);
  if (offset < 0 || n < 0 || offset + n > sizes_.at(r)) throw std::out_of_range("ShardStore::write out of its region");
  if (tier_ != Tier::nvme) {
    if (n > 0) tensors_[r].device().copy_from_host(tensors_[r].view(offset, {n}), src);
    return;
  }
  if (offset % quantum()) throw std::invalid_argument("ShardStore::write: nvme offsets are multiples of 4 KiB");
  // The rounded-up tail lands in the region's own padding (regions are 4 KiB multiples).
  storage_->write(offsets_[r] + static_cast<uint64_t>(offset) * esize_, src, static_cast<size_t>(round_up(n, quantum())) * esize_);
}

}  // namespace ferry::offload
