#include "runtime/train/engine.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include <sys/resource.h>

#include "base/log.h"
#include "comm/counting_communicator.h"
#include "comm/gpu_binding.h"
#include "nn/counting_device.h"
#include "nn/cuda_device.h"
#include "runtime/train/state_layout.h"

namespace ferry::runtime {

using nn::DType;
using nn::Tensor;

// The names below are file-local but not in an anonymous namespace of their own name:
// tests/trainer_emulated.cpp compiles this file in one translation unit with trainer.cpp.
namespace engine_detail {

// The layouts that split the world into groups, and NCCL (bootstrapped over MPI), need the
// MPI communicator: ferry train's; a test's FakeCommunicator gets this error naming `what`.
comm::MpiCommunicator& need_mpi(comm::Communicator& c, const std::string& what) {
  auto* mpi = dynamic_cast<comm::MpiCommunicator*>(&c);
  if (!mpi) throw std::invalid_argument(what + " needs the MPI communicator (run under ferry train)");
  return *mpi;
}

// device.type cuda: this rank's GPU (comm/gpu_binding.h: its local rank's where it sees
// every GPU of the node, its only one under a per-rank binding), with the device.memory
// budget; two ranks of a node on one GPU are refused on every rank. Collective over comm.
std::unique_ptr<nn::Device> make_gpu(const Config& c, comm::Communicator& comm) {
  const nn::CudaStatus s = nn::cuda_status();
  if (!s.available()) {
    throw std::invalid_argument("key 'device.type': cuda, but the cuda device is unavailable: " + s.reason);
  }
  const comm::GpuChoice choice = comm::choose_gpu(s.gpus, comm.local_rank(), comm.local_size());
  if (choice.ordinal < 0) throw std::invalid_argument("key 'device.type': cuda with " + choice.problem);
  const nn::AttentionKernel attention = nn::parse_attention_kernel(c.device.attention_kernel).value();
  auto gpu = nn::make_cuda_device(c.device.memory, choice.ordinal, attention);
  // tensor_cores or mma where they cannot run: refused now, not at the first forward.
  if (attention == nn::AttentionKernel::tensor_cores || attention == nn::AttentionKernel::mma) {
    const int64_t head = c.model.n_embd / c.model.n_head;
    std::string why;
    nn::cuda_attention_kernel(*gpu, c.zero.compute, head, &why);
    if (!why.empty()) {
      throw std::invalid_argument("key 'device.attention_kernel': " + std::string(nn::attention_kernel_name(attention)) +
                                  ", but " + why + " (this model: " +
                                  std::string(nn::dtype_name(c.zero.compute)) + " activations, head size " +
                                  std::to_string(head) + ")");
    }
  }
  if (c.device.nf4_gemm == "fused") {
    const std::string why = nn::set_cuda_nf4_gemm(*gpu, true);
    if (!why.empty()) throw std::invalid_argument("key 'device.nf4_gemm': fused, but " + why);
  }
  if (comm.size() > 1) {
    if (const std::string p = comm::shared_gpu_problem(comm, nn::cuda_pci_bus_id(*gpu)); !p.empty())
      throw std::invalid_argument("key 'device.type': cuda, but " + p);
  }
  return gpu;
}

// device.threads = 0: the node's cores shared among the ranks on it, as DeepSpeed's
// launcher sets OMP_NUM_THREADS; ranks that each took every core would fight for them.
int compute_threads(const Config& c, const comm::Communicator& comm) {
  if (c.device.threads > 0) return c.device.threads;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, comm.local_size()));
}

}  // namespace engine_detail

size_t peak_resident_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

nlohmann::json TierMemory::to_json() const {
  return {{"device_cap", device_cap}, {"device_peak", device_peak}, {"device_in_use", device_in_use},
          {"host_pinned", host_pinned}, {"host_states", host_states}, {"nvme", nvme}};
}

Engine::Engine(const Config& config, comm::Communicator& world, const EngineHooks& hooks)
    : kind_(EngineKind::run), cfg_(config), world_(&world), adam_(config.optimizer) {
  if (cfg_.world_size != world.size()) {
    throw std::invalid_argument("Trainer: the config was resolved for world size " + std::to_string(cfg_.world_size) +
                                " but the communicator has " + std::to_string(world.size()) + " ranks");
  }
  const bool cuda = cfg_.device.type == "cuda";
  auto arena = std::make_unique<nn::CpuDevice>(cuda ? SIZE_MAX : cfg_.device.memory,
                                               engine_detail::compute_threads(cfg_, world));
  const int threads = arena->threads();
  arena_ = std::move(arena);
  if (cuda) gpu_ = engine_detail::make_gpu(cfg_, world);
  compute_ = gpu_ ? gpu_.get() : arena_.get();
  auto host = std::make_unique<nn::CpuDevice>(SIZE_MAX, threads);
  host_cpu_ = host.get();
  host_ = std::move(host);
  group_ = world_;
  if (const int g = cfg_.zero.shard_group_size; g > 0) {
    comm::MpiCommunicator& mpi = engine_detail::need_mpi(world, "zero_optimization.shard_group_size");
    group_mpi_ = mpi.split(world.rank() / g, world.rank());
    replica_mpi_ = mpi.split(world.rank() % g, world.rank());
    group_ = group_mpi_.get();
  }
  model_ = make_model(cfg_, *compute_);
  if (hooks.model_ready) hooks.model_ready(*this);
  build_states(hooks);
}

Engine::Engine(const Config& config, int ranks)
    : kind_(EngineKind::count), cfg_(config), adam_(config.optimizer) {
  cfg_.offload.aio.count_only = true;
  // Of the kind the run computes on: where the two differ (DeviceOps::nf4_gemm, the CPU
  // multiplying NF4 without a panel), the plan counts what that device allocates.
  auto arena = std::make_unique<nn::CountingDevice>("device", SIZE_MAX, true,
                                                   cfg_.device.type == "cuda" ? nn::DeviceKind::cuda : nn::DeviceKind::cpu);
  arena->set_nf4_fused(cfg_.device.type == "cuda" && cfg_.device.nf4_gemm == "fused");
  arena_ = std::move(arena);
  host_ = std::make_unique<nn::CountingDevice>("host memory", SIZE_MAX, true);
  compute_ = arena_.get();
  // Hybrid sharding: state is partitioned over the shard group, not the world.
  const int group = cfg_.zero.stage > 0 && cfg_.zero.shard_group_size > 0 ? cfg_.zero.shard_group_size : ranks;
  own_world_ = std::make_unique<comm::CountingCommunicator>(0, group);
  world_ = group_ = own_world_.get();
  model_ = make_model(cfg_, *compute_);
  build_states({});
}

// One path on every device (ZeRO-Infinity's): the units live on the compute device and
// their collectives run where it computes (NCCL on a GPU, the communicator on the CPU
// device); offloaded shards live in host memory (page-locked on a GPU, so uploads and
// downloads overlap) or on NVMe, and only shards cross between them.
void Engine::build_states(const EngineHooks& hooks) {
  const bool run = kind_ == EngineKind::run;
  const int rank = world_->rank();
  const OffloadConfig& off = cfg_.offload;
  Tiers tiers = state_tiers(off);
  if (cfg_.zero.stage != 3) tiers.params = offload::Tier::device;  // sharded, hence offloaded, only at stage 3
  const std::vector<nn::UnitSpec> layout = model_->units();
  if (auto po = staging_pool_options(off, tiers, layout, group_->size(), group_->rank())) {
    offload::HostRegistration reg;
    if (!run) {
      po->pin = false;
      po->count_only = true;
    } else if (nn::Device* gpu = gpu_.get()) {
      // Registered for DMA with this rank's GPU on GPU runs only (after make_gpu chose and
      // set it): a CPU run on a GPU node must not make a CUDA context on GPU 0.
      reg.add = [gpu](void* p, size_t n) { return nn::cuda_register_host(*gpu, p, n); };
      reg.remove = [gpu](void* p) { nn::cuda_unregister_host(*gpu, p); };
    }
    pool_ = std::make_unique<offload::PinnedPool>(*po, std::move(reg));
  }
  bool clamped = false;
  Placement place = state_placement(cfg_, tiers, host_.get(), pool_.get(), &clamped);
  place.file_rank = rank;
  if (run && clamped && rank == 0) {
    log::warn(log::Subsys::sched, "schedule.prefetch_depth " + std::to_string(cfg_.schedule.prefetch_depth) +
                                      " needs offload_param.buffer_count >= " +
                                      std::to_string(cfg_.schedule.prefetch_depth + 1) + "; prefetching " +
                                      std::to_string(place.prefetch_depth) + " units ahead");
  }
  comm::Communicator* shard_comm = group_;
  if (gpu_) {
    comm::MpiCommunicator& mpi =
        group_mpi_ ? *group_mpi_ : engine_detail::need_mpi(*world_, "device.type cuda (NCCL starts over MPI)");
    // NCCL starts before the device's slab is carved (at its first allocation), so the
    // slab's check of free GPU memory sees what NCCL took. NCCL 2.22+ connects lazily, at
    // the first collective of each kind, unless told otherwise: it is told (where the
    // user has not chosen), so its buffers exist now and are not taken from under a full
    // budget in the middle of a run.
    setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    nccl_ = comm::NcclCommunicator::create(mpi, nn::cuda_compute_stream(*gpu_), cfg_.comm_timeout_s);
    shard_comm = nccl_.get();
    nn::Device* gpu = gpu_.get();
    nn::CpuDevice::Pinning pin;
    pin.pin = [gpu](void* p, size_t n) { return nn::cuda_register_host(*gpu, p, n); };
    pin.unpin = [gpu](void* p) { nn::cuda_unregister_host(*gpu, p); };
    host_cpu_->set_pinning(std::move(pin));
  }
  // The hooks are called during construction only: `hooks` outlives every call.
  std::function<void(int, const Tensor&)> init = [](int, const Tensor&) {};
  if (hooks.init_unit) init = [this, &hooks](int u, const Tensor& full) { hooks.init_unit(*this, u, full); };
  ShardedUnits::QuantizedInit quantized;
  if (hooks.init_quantized) {
    quantized = [this, &hooks](int u, size_t t, int64_t begin, int64_t n, uint8_t* dst) {
      hooks.init_quantized(*this, u, t, begin, n, dst);
    };
  }
  units_ = std::make_unique<ShardedUnits>(*compute_, *shard_comm, layout, cfg_.zero, init, place, quantized);
  if (const int h = cfg_.zero.hpz_partition_size; h > 1 && cfg_.zero.stage == 3) {
    if (!run) {
      node_ = std::make_unique<comm::CountingCommunicator>(0, h);
      units_->set_node_copies(node_.get());
    } else {
      std::unique_ptr<comm::MpiCommunicator> node =
          engine_detail::need_mpi(*world_, "zero_optimization.zero_hpz_partition_size").split(rank / h, rank);
      if (gpu_) {
        node_nccl_ = comm::NcclCommunicator::create(*node, nn::cuda_compute_stream(*gpu_), cfg_.comm_timeout_s);
        units_->set_node_copies(node_nccl_.get());
      } else {
        units_->set_node_copies(node.get());
      }
      node_ = std::move(node);
    }
  }
  if (replica_mpi_) {
    // The replicas meet where the reduced shards live: host memory (CPU device, or a GPU
    // with the optimizer offloaded) over MPI, device memory over NCCL.
    if (!units_->grad_device().host_accessible()) {
      replica_nccl_ = comm::NcclCommunicator::create(*replica_mpi_, nn::cuda_compute_stream(*gpu_), cfg_.comm_timeout_s);
      units_->set_replicas(replica_nccl_.get());
    } else {
      units_->set_replicas(replica_mpi_.get());
    }
  }
  if (run) loaded_rss_ = peak_resident_bytes();
  // 16-bit parameter shards keep rounded weights: the fp32 master starts from the
  // initialisation itself, made again on the host for one unit at a time.
  std::function<void(int, float*)> master_init = [](int, float*) {};
  if (hooks.init_unit) {
    master_init = [this, &hooks](int u, float* dst) {
      const UnitPartition& s = units_->spans_of(u);
      const Partition& p = s.trained;
      if (!units_->trains(u) || p.shard == 0) return;  // nothing of it in the optimizer: no init to read
      const Tensor full = Tensor::empty(*host_, DType::f32, {std::max(s.gathered(), p.padded)});
      host_->fill(full, 0.0);
      hooks.init_unit(*this, u, full.view(0, {s.numel}));
      // The trainable span's shard, zero past it (a frozen span may follow within its padding).
      std::memset(dst, 0, static_cast<size_t>(p.shard) * 4);
      std::memcpy(dst, full.data_as<float>() + p.begin(), static_cast<size_t>(p.owned_real()) * 4);
    };
  }
  std::string warning;
  opt_ = std::make_unique<OptimizerState>(tiers.optimizer, *units_, *compute_, *host_, adam_, off, pool_.get(),
                                          run ? rank : 0, run ? &warning : nullptr, master_init);
  if (!run) return;
  if (!warning.empty()) log::warn(log::Subsys::optim, "optimizer state: " + warning);
  log::info(log::Subsys::optim, "optimizer state: " + nn::format_bytes(opt_->bytes()) + " in " + opt_->where());
  if (pool_) {
    log::info(log::Subsys::offload, "pinned pool: " + std::to_string(pool_->buffer_count()) + " x " +
                                        nn::format_bytes(pool_->buffer_size()) +
                                        (pool_->pinned() ? ", page-locked" : ", not page-locked"));
  }
  // The update overlaps compute on its own thread when it touches only host memory: CPU
  // Adam over host shards. An optimizer on a GPU queues kernels, and stages 1-2 (or
  // stage 3 with parameters on the GPU) write the updated range into device memory, which
  // only this thread may do (the Device contract): those updates run inline.
  // Its cores and OpenMP team: docs/design/zero.md "Cores: compute, I/O and Adam".
  const bool host_update = compute_->host_accessible() || (tiers.optimizer != offload::Tier::device &&
                                                           units_->stage() == 3 && tiers.params != offload::Tier::device);
  worker_ = std::make_unique<UpdateWorker>(
      model_->num_units(), update_worker_options(cfg_.schedule.overlap_offload && host_update, gpu_ != nullptr,
                                                 cfg_.schedule.adam_threads, world_->local_rank(), world_->local_size()));
  if (gpu_ && rank == 0 && !host_cpu_->pinning_problem().empty()) {
    log::warn(log::Subsys::offload, "host state memory is not page-locked (" + host_cpu_->pinning_problem() +
                                        "): copies to and from the GPU are staged and do not overlap");
  }
  units_->set_update_worker(worker_.get());
  opt_->set_read_ahead(cfg_.schedule.overlap_offload);
}

Engine::~Engine() = default;

TierMemory Engine::memory_by_tier() const {
  const StateBytes sb = units_->state_bytes();
  TierMemory m;
  m.device_cap = compute_->memory().capacity;
  m.device_peak = compute_->memory().peak;
  m.device_in_use = compute_->memory().in_use;
  m.host_pinned = pool_ ? pool_->bytes() : 0;
  m.host_states = sb.gradients_host + (opt_->tier() == offload::Tier::cpu ? opt_->bytes() : 0) + sb.weights_host;
  m.nvme = (opt_->tier() == offload::Tier::nvme ? opt_->bytes() : 0) + sb.weights_nvme;
  return m;
}

void Engine::describe_states(std::ostream& out) const {
  const StateBytes sb = units_->state_bytes();
  static const char* kStage[] = {"0: everything replicated, gradients all-reduced (DDP)",
                                 "1: Adam state sharded, weights and gradients replicated",
                                 "2: Adam state and gradients sharded, weights replicated",
                                 "3: Adam state, gradients and weights sharded; a unit's weights gathered only while it runs"};
  const auto& off = cfg_.offload;
  std::string cached;  // nvme with offload_param.max_in_cpu: the shards kept in memory
  if (sb.weights_host > 0) cached.append(", ").append(nn::format_bytes(sb.weights_host)).append(" of them in host memory (max_in_cpu)");
  const std::string arena = "the device arena";
  const offload::Tier params = cfg_.zero.stage == 3 ? off.param_device : offload::Tier::device;
  const std::string weights_at = params == offload::Tier::nvme  ? "nvme (" + off.param_paths[0] + ")" + cached
                                 : params == offload::Tier::cpu ? std::string("host memory")
                                                                : arena;
  out << "where the state lives: " << world_->size() << " rank(s), ZeRO stage " << kStage[cfg_.zero.stage]
      << (group_mpi_ ? ", hybrid: sharded within " + std::to_string(world_->size() / group_->size()) + " groups of " +
                           std::to_string(group_->size()) + " ranks, replicated across them"
                     : std::string())
      << (node_ ? ", hpZ: a node copy of the weights over groups of " + std::to_string(node_->size()) +
                      " ranks serves the gathers after each unit's first"
                : std::string())
      << "; per rank (device: " << compute_->name() << "):\n"
      << (!units_->owned_rounded()                          ? "  fp32 weights                 "
          : units_->owned_dtype() == nn::DType::f16 ? "  fp16 weight shards           "
                                                    : "  bf16 weight shards           ")
      << nn::format_bytes(sb.weights) << "  in " << weights_at << "\n"
      << "  fp32 gradients               " << nn::format_bytes(sb.gradients) << "  in "
      << (units_->placement().grads_on_host ? "host memory (shards)" : arena) << "\n"
      << "  Adam " << (opt_->aliased() ? "m, v (master = weights)" : "master, m, v           ") << "  "
      << nn::format_bytes(opt_->bytes()) << "  in " << opt_->where()
      << (nccl_ ? (opt_->tier() == offload::Tier::device ? ", updated on the GPU" : ", CPU Adam on the host") : "")
      << "\n";
  if (sb.node_copies > 0) {
    out << "  hpZ node copies              " << nn::format_bytes(sb.node_copies) << "  in " << arena
        << ", made by each unit's first gather of a step\n";
  }
  if (nccl_) out << "  collectives                  NCCL on GPU " << nccl_->gpu() << ", ordered by CUDA events\n";
  if (nn::is_low_precision(cfg_.zero.compute)) {
    const std::string low = cfg_.fp16 ? "fp16" : "bf16";  // DeepSpeed's names
    out << "  " << (low + " compute weights" + std::string(29, ' ')).substr(0, 29)
        << (cfg_.zero.stage < 3 ? nn::format_bytes(sb.compute_copy) + "  in " + arena + ", refreshed from the fp32 weights after each update"
                                : units_->owned_rounded()
                                    ? (gpu_ && opt_->tier() == offload::Tier::device
                                           ? "kept as " + low + " shards (device Adam's master cast), all-gathered per unit, freed after use"
                                           : "kept as " + low + " shards (CPU Adam's copy-out), all-gathered per unit, freed after use")
                                    : "cast from each fp32 shard and all-gathered per unit, freed after use")
        << "\n  " << low << " activations; fp32 gradients, reductions, master weights and Adam state"
        << (cfg_.fp16 ? "; dynamic loss scaling" : "") << "\n";
  }
  if (pool_) {
    out << "  pinned staging pool          " << nn::format_bytes(pool_->bytes()) << "  (" << pool_->buffer_count()
        << " x " << nn::format_bytes(pool_->buffer_size()) << (pool_->pinned() ? ", page-locked)" : ", NOT page-locked)")
        << "\n";
  }
}

}  // namespace ferry::runtime
