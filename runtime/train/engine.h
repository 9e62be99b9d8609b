// The engine of one rank, assembled from the configuration in one place: the devices, the
// communicators that partition and replicate state, the pinned staging pool, the sharded
// units, the optimizer state and the update worker. The trainer (runtime/train/trainer.h)
// runs its loop on one; `ferry plan`'s dry run (runtime/tools/plan_dry_run.cpp) builds the
// same one on counting parts, so that the plan measures what a run allocates.
//
// Why here and not in runtime/zero: the assembly reads the whole Config (device.type, the
// model, comm.timeout, schedule) and the placement of runtime/train/state_layout.h; zero's
// parts take configuration sections only (runtime/config/sections.h).
//
// Two kinds (EngineKind):
//  - run: the rank's devices (device.type cpu: a CpuDevice with the device.memory cap;
//    cuda: this rank's GPU through comm/gpu_binding.h, the cpu device then an uncapped
//    host), the world's splits over MPI for hybrid sharding and hpZ, NCCL over them on a
//    GPU, a page-locked pool for nvme tiers, and an UpdateWorker thread.
//  - count: nn::CountingDevice for the device and the host, comm::CountingCommunicator as
//    rank 0 of the shard group, a pool and nvme storage that only count; no worker, no log
//    line, nothing initialised.
//
// Order of construction: (run: the world's size against config.world_size) devices -> the
// world's splits -> the model -> `hooks.model_ready` -> pinned pool ->
// placement -> NCCL (it starts before the GPU's slab is carved, so the slab sees what NCCL
// took) -> ShardedUnits (each unit's initial weights through `hooks.init_unit`) -> hpZ node
// and replica communicators -> OptimizerState (fp32 masters through `hooks.init_unit` on
// the host, one unit at a time) -> UpdateWorker. Members are declared so that each goes
// before what it uses (the hpZ and replica communicators outlive the units that hold
// them, built after them though they are). The worker is destroyed first: its queued
// jobs finish while what they use still exists; an owner whose jobs use its own members
// calls finish_updates() before those go (Trainer's destructor does).
//
// Threads: built, used and destroyed on one thread (the rank's main thread, the Device
// contract); the worker's jobs run on its thread. Collective: a run engine's constructor
// communicates over `world` (splits, NCCL, the shared-GPU check), so every rank builds it
// at the same point.
// Errors: std::invalid_argument naming the key (device.type, device.attention_kernel, a
// layout that needs MPI); nn::OutOfDeviceMemory when the states do not fit; what the
// hooks throw.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <ostream>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "nn/cpu_device.h"
#include "nn/model.h"
#include "offload/cpu_adam.h"
#include "offload/pinned_pool.h"
#include "runtime/config/config.h"
#include "runtime/zero/optimizer_state.h"
#include "runtime/zero/sharded_units.h"
#include "runtime/zero/update_worker.h"

namespace ferry::runtime {

size_t peak_resident_bytes();  // this process's high-water mark of resident memory

// One rank's model-state memory per tier, as placed by the configuration.
struct TierMemory {
  size_t device_cap = 0, device_peak = 0, device_in_use = 0;  // the device arena
  size_t host_pinned = 0;  // the pinned staging pool
  size_t host_states = 0;  // gradient shards, optimizer state and parameters kept in host memory
  size_t nvme = 0;         // parameter and optimizer-state bytes in nvme files
  nlohmann::json to_json() const;
};

enum class EngineKind { run, count };

class Engine;

struct EngineHooks {
  // After the devices, the communicators and the model exist, before any state is
  // allocated (the trainer opens model.init_from's folder here).
  std::function<void(Engine&)> model_ready;
  // The initial weights of `unit` into `full` (a tensor of the unit's real length, on any
  // device). Absent: the state keeps what it was allocated with (zeros; nothing at all on
  // counting devices), as a checkpoint or the dry run needs.
  std::function<void(Engine&, int unit, const nn::Tensor& full)> init_unit;
  // Bytes [begin, begin + n) of the NF4 blobs of tensor `tensor` of `unit`
  // (ShardedUnits::QuantizedInit). Absent: zeros, as above.
  std::function<void(Engine&, int unit, size_t tensor, int64_t begin, int64_t n, uint8_t* dst)> init_quantized;
};

class Engine {
 public:
  // kind run: `world` is the job's communicator (the MPI one for hybrid sharding, hpZ and
  // device.type cuda; a FakeCommunicator otherwise), its size config.world_size.
  Engine(const Config& config, comm::Communicator& world, const EngineHooks& hooks);
  // kind count: rank 0 of `ranks`, on counting devices with no cap (the plan judges the
  // fit). The configuration's storage is switched to count only (offload.aio.count_only).
  Engine(const Config& config, int ranks);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  EngineKind kind() const { return kind_; }
  const Config& config() const { return cfg_; }
  nn::Device& compute() const { return *compute_; }  // where the model computes
  nn::Device& host() const { return *host_; }        // host memory outside the arena
  nn::Device* gpu() const { return gpu_.get(); }     // device.type cuda only
  nn::Model& model() const { return *model_; }
  comm::Communicator& world() const { return *world_; }
  // The communicator that partitions state: the shard group (hybrid sharding) or the world.
  comm::Communicator& group() const { return *group_; }
  bool hybrid() const { return group_mpi_ != nullptr; }
  int hpz_size() const { return node_ ? node_->size() : 1; }  // 1: no hpZ node copies
  comm::NcclCommunicator* nccl() const { return nccl_.get(); }  // the states on the GPU
  offload::PinnedPool* pool() const { return pool_.get(); }     // null without nvme staging
  ShardedUnits& units() const { return *units_; }
  OptimizerState& optimizer() const { return *opt_; }
  UpdateWorker& worker() const { return *worker_; }  // kind run only, until finish_updates()
  // Waits for the worker's queued updates (their errors dropped) and ends its thread; for
  // an owner whose queued jobs use its own members, before those go. Never throws.
  void finish_updates() noexcept { worker_.reset(); }
  size_t loaded_rss() const { return loaded_rss_; }  // peak resident bytes once the weights were in place

  TierMemory memory_by_tier() const;
  // "where the state lives: ..." and one line per state (weights, gradients, Adam, hpZ
  // copies, NCCL, mixed precision, the pinned pool), as ferry train's header prints them.
  void describe_states(std::ostream& out) const;

 private:
  void build_devices(const Config& c);
  void build_states(const EngineHooks& hooks);

  const EngineKind kind_;
  Config cfg_;
  std::unique_ptr<comm::Communicator> own_world_;  // kind count: the counting shard group
  comm::Communicator* world_ = nullptr;
  // The state device: on a cpu run the arena of the model states (device.memory); host
  // memory without a cap when the model computes on a GPU.
  std::unique_ptr<nn::Device> arena_;
  std::unique_ptr<nn::Device> gpu_;
  nn::Device* compute_ = nullptr;   // gpu_ or arena_
  std::unique_ptr<nn::Device> host_;
  nn::CpuDevice* host_cpu_ = nullptr;  // host_ on a run (pinning), null when counting
  // Hybrid sharding (zero_optimization.shard_group_size): this rank's shard group and its
  // replicas (the ranks of the same index in the other groups), over MPI.
  std::unique_ptr<comm::MpiCommunicator> group_mpi_, replica_mpi_;
  comm::Communicator* group_ = nullptr;
  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<offload::PinnedPool> pool_;
  // device.type cuda: the units' collectives on the GPU; replicas there where the reduced
  // shards live on the device.
  std::unique_ptr<comm::NcclCommunicator> nccl_, replica_nccl_;
  // hpZ (zero_optimization.zero_hpz_partition_size): this rank's node group, over MPI (a
  // counting one when counting) and over NCCL on a GPU.
  std::unique_ptr<comm::Communicator> node_;
  std::unique_ptr<comm::NcclCommunicator> node_nccl_;
  // After every communicator it uses: destroyed before them.
  std::unique_ptr<ShardedUnits> units_;
  size_t loaded_rss_ = 0;
  offload::CpuAdam adam_;
  std::unique_ptr<OptimizerState> opt_;
  std::unique_ptr<UpdateWorker> worker_;  // last: destroyed first
};

}  // namespace ferry::runtime
