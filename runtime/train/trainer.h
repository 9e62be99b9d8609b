// The training loop on one rank: micro-batches with gradient accumulation, global-norm
// clipping, AdamW (offload::CpuAdam), the learning-rate schedule, periodic validation,
// metrics, and a sample generated at the end. The rank's devices, communicators, states
// and update worker are its Engine's (runtime/train/engine.h): the trainer keeps the loop.
//
// Data parallel over comm's ranks with ZeRO stages 0-3 (ShardedUnits): each rank reads its
// own slice of the global batch; the optimizer updates the range its stage gives it.
// Placement follows zero_optimization.offload_optimizer / offload_param: by default every
// state lives in the device arena; offloaded states live in host memory or on NVMe
// (staged through a pinned pool). Activations are allocated in the arena per micro-batch.
// device.type cuda: the model computes on the rank's GPU (its local rank), and NCCL
// (started over comm, which must then be the MPI communicator) gathers and reduce-scatters
// on it. Without offload every state lives in the GPU arena and AdamW runs on the device;
// with offload the shards live in page-locked host memory or on NVMe and only they cross
// PCIe: stage 3's parameter shards up for each gather, this rank's reduced gradient down
// for CPU Adam (runtime/zero/sharded_units.h).
// Only rank 0 writes to `out` and the metrics file; every rank must call the same methods
// in the same order (they communicate).
// Errors: ConfigError-style problems surface as std::runtime_error naming the key or
// file; a non-finite loss or gradient norm stops the run naming the step; a refused
// checkpoint throws CheckpointError.
// Checkpoints: with checkpoint.dir set, run() saves every checkpoint.every_steps steps, at
// the end, and after the step in which a stop signal arrived (then it returns early).
// Schedule (docs/design/zero.md, "The overlapped step"): each unit's gradient norm and AdamW
// update run on an UpdateWorker as soon as its gradient is final. Without clipping the
// update starts at once, during backward; with clipping it waits for the global norm (one
// scalar all-reduce after backward) and then runs in forward order while train_step
// returns and the next step's forward begins, which waits only for the unit it needs.
// evaluate(), sample() and the checkpoint methods wait for pending updates first.
#pragma once

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "base/trace.h"
#include "comm/communicator.h"
#include "nn/model.h"
#include "offload/cpu_adam.h"
#include "runtime/config/config.h"
#include "runtime/hf/hf_weights.h"
#include "runtime/hf/peft.h"
#include "runtime/train/data.h"
#include "runtime/train/engine.h"
#include "runtime/train/loss_scaler.h"
#include "runtime/train/metrics.h"
#include "runtime/train/monitors.h"
#include "runtime/zero/optimizer_state.h"
#include "runtime/zero/sharded_units.h"
#include "runtime/zero/traced_units.h"
#include "runtime/zero/update_worker.h"

namespace ferry::runtime {

struct StepStats {
  int64_t step = 0;  // 1-based
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;
  double tflops = 0;  // achieved model TFLOP/s of the whole job (run_flops_per_token x tokens / wall)
  size_t device_peak_bytes = 0;
  bool stop = false;  // some rank received SIGTERM/SIGINT (base/stop_signal.h)
  double loss_scale = 1;  // fp16: the scale this step's backward used
  bool skipped = false;   // fp16: the gradients overflowed; no update was made
  StepBreakdown time;  // this rank's seconds per activity and the step's wall time
  // Bytes this rank copied host -> device and device -> host during the step (PCIe on a
  // GPU; 0 on the CPU device): docs/design/zero.md, "Bytes over PCIe", gives the minimum.
  uint64_t to_device_bytes = 0, to_host_bytes = 0;
};

struct TrainReport {
  std::vector<StepStats> steps;
  std::vector<std::pair<int64_t, double>> val_losses;  // (step, loss)
  double unigram_baseline = 0;
  std::string sample;
  size_t device_peak_bytes = 0;
  int64_t resumed_from = 0;    // steps already done by the checkpoint the run resumed from
  std::string last_checkpoint;  // "" when none was written
  bool stopped = false;         // ended early on a stop signal
};

// "0.512 s: compute 0.401, param_read 0.120, adam 0.050 (overlap 1.11)": the activities
// that took time, for the step line.
std::string describe_breakdown(const StepBreakdown& b);
// A validation loss against the unigram baseline, for the run's last line: "12.3% below",
// "44.8% above" (never a negative figure), "equal to it".
std::string compare_to_baseline(double loss, double baseline);

// The data of a run: data.path in data.format through data.tokenizer ("auto": the
// model.init_from folder's tokenizer.json when there is one), records ending with the EOS
// that folder names (config.json's eos_token_id, else tokenizer_config.json's eos_token).
// Throws ConfigError naming the tokenizer file for one that is refused or that makes ids
// outside model.vocab_size.
DataOptions data_options(const Config& c);

class Trainer {
 public:
  // Loads the data, then builds the engine, which allocates every model state: a model
  // that does not fit throws nn::OutOfDeviceMemory here, before any step.
  Trainer(const Config& config, comm::Communicator& comm, std::ostream& out);
  ~Trainer();

  // Trains train.steps steps (from a resume checkpoint where checkpoint.resume names one).
  // `started`, when given, is called on every rank once the starting point is settled (the
  // checkpoint loaded, or none), before the first step, with the steps already done:
  // ferry train writes the run's configuration to the run folder there, so that a refused
  // resume leaves that folder as it was.
  TrainReport run(const std::function<void(int64_t resumed_from)>& started = {});

  StepStats train_step(int64_t step);  // step is 0-based

  // Checkpoints (runtime/ckpt/checkpoint.h), both collective. save_checkpoint writes the state
  // after `steps_done` steps into checkpoint.dir and returns its directory;
  // load_checkpoint restores one (saved at any world size) and returns its step count.
  std::string save_checkpoint(int64_t steps_done, double lr);
  int64_t load_checkpoint(const std::string& step_dir);
  double evaluate();
  // Waits for the optimizer updates still running on the update thread (with clipping, a
  // step's updates and its commit run after train_step returns) and rethrows their first
  // error: call it before reading optimizer() state between steps.
  void sync_updates() { engine_->worker().drain(); }
  std::string sample(int64_t n_tokens, double temperature, uint64_t seed);

  // The engine the loop runs on (runtime/train/engine.h) and its parts.
  Engine& engine() const { return *engine_; }
  nn::Model& model() const { return engine_->model(); }
  ShardedUnits& units() const { return engine_->units(); }
  OptimizerState& optimizer() const { return engine_->optimizer(); }
  const offload::PinnedPool* pinned_pool() const { return engine_->pool(); }  // null without nvme staging
  // Where the model computes: the cpu device, or the cuda device (device.type cuda).
  nn::Device& device() const { return engine_->compute(); }
  Tracer& tracer() { return *tracer_; }
  TierMemory memory_by_tier() const { return engine_->memory_by_tier(); }

 private:
  void init_unit(Engine& e, int unit, const nn::Tensor& full);  // the model's initial weights into a state tensor
  void describe_placement();
  // The model reads bytes (text or jsonl without a tokenizer), not a tokenizer's or token
  // files' ids: the words of the baseline and sample lines.
  bool byte_level() const;
  void describe_memory();
  nlohmann::json step_record(const StepStats& s) const;  // the metrics file's line for a step
  std::string traffic(const StepStats& s) const;         // the step line's bytes per parameter
  nlohmann::json model_shape() const;
  double optimizer_step(int64_t step, double* grad_norm_out);
  void gradients_ready(int unit);           // ShardedUnits' callback: the unit's gradient is final
  void submit_update(int unit, double clip);

  Config cfg_;
  comm::Communicator& comm_;
  std::ostream& out_;
  std::unique_ptr<HfWeights> hf_;  // model.init_from: the folder the weights are read from
  std::unique_ptr<PeftWeights> peft_;  // model.adapter_from: the adapter's folder
  std::vector<std::vector<DecayRange>> decay_;  // per unit, within its owned range
  // Built after the data (the data's errors come first) but declared before every member
  // that lives on its devices or units (norms_, traced_): they go before it. ~Trainer ends
  // its update worker first, while what the queued updates use still exists.
  std::unique_ptr<Engine> engine_;
  TokenData data_;
  BatchSampler sampler_;
  MetricsWriter metrics_;
  ScalarMonitors monitors_;  // TensorBoard and CSV (log.tensorboard, log.csv), rank 0
  std::unique_ptr<Tracer> tracer_;
  std::vector<double> sumsq_;  // per unit: this rank's squared gradient norm, this step
  nn::Tensor norms_;           // the same, f64 [units] on the gradients' device, until read
  int64_t cur_step_ = 0;       // 0-based optimizer step in progress (fp16: skipped steps not counted)
  std::unique_ptr<LossScaler> scaler_;  // fp16 only
  double cur_lr_ = 0;
  std::unique_ptr<TracedUnits> traced_;  // the engine's units with the model's compute spans traced
};

}  // namespace ferry::runtime
