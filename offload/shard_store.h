// ShardStore: a set of regions (one per unit and state) of one dtype (fp32, or bf16 / f16
// for a bf16 / fp16 run's parameter shards) kept in one tier:
//   device  tensors in the device arena (counted against device.memory)
//   cpu     tensors in host memory outside the arena
//   nvme    a Storage (io_uring, O_DIRECT) under nvme_path, one file per rank
// Regions on the device and cpu tiers are tensors the caller may use in place. Every tier
// also copies ranges in and out through host buffers (read/write, elements of the
// store's dtype): for nvme these must be 4 KiB aligned with room for the range rounded up
// to quantum() elements (4 KiB: 1024 fp32, 2048 bf16 or f16; PinnedPool buffers are), and
// offsets must be multiples of quantum().
// Threads: one thread at a time. Errors: StorageError from the nvme tier, naming the file.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/device.h"
#include "offload/pinned_pool.h"
#include "offload/storage.h"
#include "offload/tier.h"

namespace ferry::offload {

constexpr int64_t kNvmeBytes = 4096;     // the O_DIRECT unit
constexpr int64_t kNvmeQuantum = 1024;  // fp32 elements in it

class ShardStore {
 public:
  // `name` names the NVMe file (NAME.swp). All regions start zeroed.
  ShardStore(Tier tier, nn::Device& device, nn::Device& host, const std::vector<int64_t>& region_sizes,
             const std::vector<std::string>& nvme_paths, const std::string& name, const offload::AioConfig& aio,
             std::string* warning, const offload::FaultHook& fault = {}, nn::DType dtype = nn::DType::f32);
  Tier tier() const { return tier_; }
  nn::DType dtype() const { return dtype_; }
  int64_t quantum() const { return kNvmeBytes / static_cast<int64_t>(esize_); }  // nvme offsets, elements
  std::string where() const;
  size_t bytes() const;  // what the tier holds
  int64_t size(int region) const { return sizes_.at(static_cast<size_t>(region)); }

  nn::Tensor tensor(int region) const;  // device and cpu tiers; undefined for nvme
  void read(int region, int64_t offset, int64_t n, void* dst);
  void write(int region, int64_t offset, int64_t n, const void* src);
  // nvme: registers the pool's slab as io_uring fixed buffers (transfers from it then skip
  // per-request page pinning). Returns why not, "" on success or on other tiers.
  std::string use_pool(const offload::PinnedPool& pool);

 private:
  Tier tier_;
  nn::DType dtype_;
  size_t esize_;
  std::vector<int64_t> sizes_;
  std::vector<nn::Tensor> tensors_;
  std::vector<uint64_t> offsets_;  // nvme: byte offset of each region
  std::unique_ptr<offload::Storage> storage_;
};

}  // namespace ferry::offload
