#include "runtime/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "base/log.h"
#include "base/stop_signal.h"
#include "base/version.h"
#include "nn/cpu_device.h"
#include "nn/rng.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/hf/peft.h"
#include "runtime/train/lr_schedule.h"
#include "runtime/train/progress.h"
#include "runtime/zero/partition.h"
#include "runtime/zero/stage_policy.h"

namespace ferry::runtime {

using nn::DType;
using nn::Tensor;

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

std::string compare_to_baseline(double loss, double baseline) {
  if (!(baseline > 0)) return loss == baseline ? "equal to it" : fmt("%.4f nats above", loss - baseline);
  const double below = 100.0 * (baseline - loss) / baseline;
  if (fmt("%.1f", std::abs(below)) == "0.0") return "equal to it";
  return below > 0 ? fmt("%.1f%% below", below) : fmt("%.1f%% above", -below);
}

bool Trainer::byte_level() const {
  return !data_.has_tokenizer() && (cfg_.data.format == "text" || cfg_.data.format == "jsonl");
}

std::string describe_breakdown(const StepBreakdown& b) {
  std::string line = fmt("%.3f s:", b.wall_s);
  bool first = true;
  for (size_t a = 0; a < kActivities; ++a) {
    if (b.busy_s[a] < 5e-4) continue;
    line += std::string(first ? " " : ", ") + activity_key(static_cast<Activity>(a)) + fmt(" %.3f", b.busy_s[a]);
    first = false;
  }
  return line + fmt(" (overlap %.2f)", b.overlap());
}

Trainer::Trainer(const Config& config, comm::Communicator& comm, std::ostream& out)
    : cfg_(config),
      comm_(comm),
      out_(out),
      data_(TokenData::load(data_options(config))),
      sampler_(data_, config.data.seed, config.micro_batch, config.model.block_size, config.data.packing == "packed") {
  if (cfg_.fp16) scaler_ = std::make_unique<LossScaler>(cfg_.loss_scaling);
  // Where DeepSpeed's scheduler warns as it is built, so does this one (once).
  if (const std::string w = schedule_warning(cfg_.scheduler); !w.empty() && comm_.rank() == 0) {
    log::warn(log::Subsys::optim, w);
  }
  EngineHooks hooks;
  hooks.model_ready = [this](Engine& e) {
    if (!cfg_.init_from.empty()) hf_ = std::make_unique<HfWeights>(cfg_.init_from, cfg_.resolved.at("model"), e.model().units());
    if (!cfg_.adapter_from.empty()) {
      peft_ = std::make_unique<PeftWeights>(cfg_.adapter_from, cfg_.resolved.at("model"), e.model().units(), e.model().lora());
    }
  };
  hooks.init_unit = [this](Engine& e, int u, const Tensor& full) { init_unit(e, u, full); };
  // NF4 blobs: quantized from model.init_from's folder, or from the model's own initial values.
  hooks.init_quantized = [this](Engine& e, int u, size_t t, int64_t begin, int64_t n, uint8_t* dst) {
    nn::Model::RowsFn rows;
    nn::Model::StateFn state;
    if (hf_) {
      rows = [this, u, t](int64_t row0, int64_t count, float* out) { hf_->read_rows(u, t, row0, count, out); };
      state = [this, u, t](int64_t row0, nn::Nf4Tensor* q) { return hf_->read_nf4(u, t, row0, q); };
    }
    e.model().quantized_bytes(u, t, cfg_.model_seed, rows, state, cfg_.zero.compute, begin, n, dst);
  };
  engine_ = std::make_unique<Engine>(cfg_, comm_, hooks);
  const std::vector<nn::UnitSpec> layout = model().units();
  for (int u = 0; u < model().num_units(); ++u) {
    const ShardedUnits::Owned o = units().owned(u);
    std::vector<DecayRange> ranges;
    for (const nn::TensorSpec& t : layout[static_cast<size_t>(u)].tensors) {
      if (!t.trainable) continue;  // outside the owned span (its padding may reach a frozen tensor)
      const int64_t lo = std::max(t.offset, o.begin), hi = std::min(t.offset + t.numel(), o.begin + o.length);
      if (lo < hi) ranges.push_back({lo - o.begin, hi - o.begin, t.decay ? cfg_.optimizer.weight_decay : 0.0});
    }
    decay_.push_back(std::move(ranges));
  }
  if (!cfg_.log.metrics.empty() && comm_.rank() == 0) {
    metrics_ = MetricsWriter(cfg_.log.metrics, /*append=*/cfg_.checkpoint.resume != "none");
  }
  if ((!cfg_.log.tensorboard.empty() || !cfg_.log.csv.empty()) && comm_.rank() == 0) {
    monitors_ = ScalarMonitors(cfg_.log.tensorboard, cfg_.log.csv);
  }
  tracer_ = std::make_unique<Tracer>(comm_.rank());
  if (!cfg_.log.trace.empty()) tracer_->open_file(trace_path_for_rank(cfg_.log.trace, comm_.rank()));
  std::vector<std::string> unit_names;
  for (const nn::UnitSpec& spec : layout) unit_names.push_back(spec.name);
  traced_ = std::make_unique<TracedUnits>(units(), *tracer_, std::move(unit_names), device());  // the compute track
  units().set_tracer(tracer_.get());
  units().on_gradients_ready([this](int u) { gradients_ready(u); });
  optimizer().set_tracer(tracer_.get());
}

Trainer::~Trainer() {
  if (engine_) engine_->finish_updates();  // queued updates use tracer_, norms_ and decay_
}

void Trainer::init_unit(Engine& e, int unit, const Tensor& full) {
  if (hf_) {
    // Only the ranges this rank keeps are read: its shards of the trainable and frozen
    // spans at stage 3, else the whole unit (stages 0-2 keep full weights on every rank).
    auto fill = [&](int64_t begin, int64_t n) {
      if (n <= 0) return;
      std::vector<float> host(full.device().host_accessible() ? 0 : static_cast<size_t>(n));
      float* dst = host.empty() ? full.data_as<float>() + begin : host.data();
      hf_->fill(unit, begin, n, dst);
      // LoRA adapters are not in the folder: their initial values (nn/lora.h), as the
      // model's own init_unit draws them, where they fall in the range.
      const nn::UnitSpec& spec = e.model().units().at(static_cast<size_t>(unit));
      for (const nn::LoraAdapter& a : e.model().lora()) {
        if (a.unit != unit) continue;
        const nn::TensorSpec& t = spec.tensors.at(a.a);
        const int64_t lo = std::max(begin, t.offset), hi = std::min(begin + n, t.offset + t.numel());
        if (lo >= hi) continue;
        const std::vector<double> v = nn::lora_init(a, /*b=*/false, cfg_.model_seed);
        for (int64_t k = lo; k < hi; ++k) dst[k - begin] = static_cast<float>(v[static_cast<size_t>(k - t.offset)]);
      }
      if (peft_) peft_->fill(unit, begin, n, dst);  // model.adapter_from: the adapter's values instead
      if (!host.empty()) full.device().copy_from_host(full.view(begin, {n}), host.data());
    };
    if (!StagePolicy::of(cfg_.zero.stage, cfg_.zero.compute).sharded_weights) return fill(0, full.numel());
    const UnitPartition p = unit_partition(e.model().units().at(static_cast<size_t>(unit)), e.group().size(),
                                           e.group().rank());
    fill(std::min(p.trained.begin(), p.trained.numel), p.trained.owned_real());
    if (p.has_frozen()) fill(p.frozen_at + std::min(p.frozen.begin(), p.frozen.numel), p.frozen.owned_real());
    return;
  }
  nn::Device* gpu = e.gpu();
  if (!gpu || &full.device() == gpu) return e.model().init_unit(unit, full, cfg_.model_seed);
  // The model writes through its own device: initialise on the GPU, then bring the values
  // to the state tensor (the same values: init draws them on the host in f64).
  const Tensor here = Tensor::empty(*gpu, full.dtype(), full.shape());
  e.model().init_unit(unit, here, cfg_.model_seed);
  gpu->copy_to_host(full.data(), here);
}

// The process's peak resident memory against what the configuration bounds: the device
// arena's cap (its measured peak beside it), the pinned pool, gradient shards kept in host
// memory, optimizer state or parameters in host memory; the rest is the program itself,
// the corpus, allocator slack and the I/O threads' stacks.
void Trainer::describe_memory() {
  const size_t rss = peak_resident_bytes();
  const TierMemory m = memory_by_tier();
  const size_t bounded = m.device_cap + m.host_pinned + m.host_states;
  out_ << "memory: peak resident " << nn::format_bytes(rss) << " against " << nn::format_bytes(bounded)
       << " configured (device arena cap " << nn::format_bytes(m.device_cap) << ", peak used "
       << nn::format_bytes(m.device_peak) << "; pinned pool " << nn::format_bytes(m.host_pinned)
       << "; host gradient shards, optimizer state and parameters " << nn::format_bytes(m.host_states)
       << "); on nvme " << nn::format_bytes(m.nvme) << "\n";
  out_.flush();
}

namespace {

// The learning rate over the run, in DeepSpeed's terms (runtime/train/lr_schedule.h).
std::string describe_schedule(const SchedulerConfig& s, double lr) {
  const std::string warmup = fmt(" over %.0f steps", static_cast<double>(std::max<int64_t>(2, s.warmup_num_steps))) +
                             " (" + s.warmup_type + ")";
  if (s.type.empty()) return fmt("lr %g, constant", lr);
  if (s.type == "WarmupLR") return fmt("WarmupLR: lr %g", s.warmup_min_lr) + fmt(" -> %g", s.warmup_max_lr) + warmup + ", then constant";
  if (s.type == "WarmupDecayLR") {
    return fmt("WarmupDecayLR: lr %g", s.warmup_min_lr) + fmt(" -> %g", s.warmup_max_lr) + warmup +
           fmt(", then linear to %g", s.warmup_min_lr) + fmt(" at step %.0f", static_cast<double>(s.total_num_steps));
  }
  if (s.type == "WarmupCosineLR") {
    return fmt("WarmupCosineLR: lr %g", lr) + fmt(" x %g", s.warmup_min_ratio) + " -> 1" + warmup +
           fmt(", then cosine to x %g", s.cos_min_ratio) + fmt(" at step %.0f", static_cast<double>(s.total_num_steps));
  }
  return s.type;
}

// The header's line on what the run does: steps, optimizer, learning rate, clipping, validation.
std::string describe_training(const Config& c) {
  const offload::AdamWParams& o = c.optimizer;
  std::string line = "training: " + std::to_string(c.train.steps) + " steps; " + c.optimizer_type +
                     fmt(" (betas %g", o.beta1) + fmt(", %g", o.beta2) + fmt(", eps %g", o.eps) +
                     fmt(", weight decay %g); ", o.weight_decay) + describe_schedule(c.scheduler, o.lr) +
                     (c.grad_clip > 0 ? fmt("; gradient clipping at norm %g", c.grad_clip) : "; no gradient clipping") +
                     "; ";
  if (c.data.val_fraction == 0 && c.data.val_path.empty()) return line + "no validation (data.val_fraction 0)";
  line += "validation on " + std::to_string(c.train.eval_batches) + " micro-batch(es) ";
  line += c.train.eval_every > 0 && c.train.eval_every < c.train.steps
              ? "every " + std::to_string(c.train.eval_every) + " steps and at the end"
              : std::string("at the end");
  return line;
}

}  // namespace

void Trainer::describe_placement() {
  Engine& e = *engine_;
  out_ << "model: " << e.model().describe() << ": " << e.model().num_parameters() << " parameters in "
       << e.model().num_units() << " units" << (cfg_.activation_checkpointing ? ", activation checkpointing" : "") << "\n";
  if (cfg_.lora.enabled()) {
    int64_t trained = 0;
    for (const nn::UnitSpec& u : e.model().units())
      for (const nn::TensorSpec& t : u.tensors) trained += t.trainable ? t.numel() : 0;
    std::set<std::string> leaves;
    for (const nn::LoraAdapter& a : e.model().lora()) leaves.insert(a.module.substr(a.module.rfind('.') + 1));
    std::string names;
    for (const std::string& l : leaves) names += (names.empty() ? "" : ", ") + l;
    out_ << "adapters: LoRA r " << cfg_.lora.r << ", alpha " << fmt("%g", cfg_.lora.alpha) << " (scale "
         << fmt("%g", cfg_.lora.scale()) << (cfg_.lora.rslora ? ", rsLoRA" : "") << ") on " << e.model().lora().size()
         << " modules (" << names << ")"
         << (cfg_.lora.modules_to_save.empty() ? std::string() : ", trained in full: " + [&] {
               std::string m;
               for (const std::string& x : cfg_.lora.modules_to_save) m += (m.empty() ? "" : ", ") + x;
               return m;
             }())
         << (cfg_.adapter_from.empty() ? std::string() : ", starting from " + cfg_.adapter_from) << "; " << trained
         << " trained parameters (" << fmt("%.2f", 100.0 * static_cast<double>(trained) / static_cast<double>(e.model().num_parameters()))
         << "%), the rest frozen: no gradient, reduction or optimizer state for it\n";
    if (cfg_.lora.nf4) {
      int64_t values = 0, bytes = 0, pieces = 0;
      for (const nn::UnitSpec& u : e.model().units()) {
        for (const nn::TensorSpec& t : u.tensors) {
          if (!t.quantized()) continue;
          values += t.numel();
          bytes += t.stored_numel() * nn::kNf4ElementBytes;
          pieces += static_cast<int64_t>(t.nf4.size());
        }
      }
      out_ << "base: " << values << " parameters of " << pieces << " projections in NF4"
           << (cfg_.lora.double_quant ? " (double quantized)" : "") << ", " << nn::format_bytes(static_cast<size_t>(bytes))
           << " (" << fmt("%.3f", static_cast<double>(bytes) / static_cast<double>(std::max<int64_t>(values, 1)))
           << " bytes a parameter, " << nn::dtype_name(cfg_.zero.compute) << " would be 2), "
           << (hf_ && hf_->nf4_states() > 0
                   ? "read as bitsandbytes saved " + std::to_string(hf_->nf4_states()) + " of them in " + cfg_.init_from +
                         (hf_->nf4_states() < pieces ? " (the rest quantized at start)" : "")
                   : "quantized at start from " + (cfg_.init_from.empty() ? std::string("the initial weights") : cfg_.init_from))
           << (e.compute().kind() == nn::DeviceKind::cpu && nn::CpuDevice::nf4_gemm_direct(cfg_.zero.compute, cfg_.zero.compute)
                   ? ", dequantized row by row as the GEMMs pack their operand\n"
               : e.compute().kind() == nn::DeviceKind::cuda && cfg_.device.nf4_gemm == "fused"
                   ? ", dequantized tile by tile in the GEMMs' shared memory (device.nf4_gemm fused)\n"
                   : ", dequantized panel by panel in the GEMMs\n");
    }
  }
  if (hf_) {
    out_ << "weights: from " << hf_->describe() << ", converted to fp32; this rank read "
         << nn::format_bytes(hf_->bytes_read()) << " of them; peak resident once loaded "
         << nn::format_bytes(e.loaded_rss()) << "\n";
  }
  e.describe_states(out_);
  out_ << "  activations                  allocated per micro-batch in the device arena (see device peak)\n"
       << "data: " << data_.describe()
       << (sampler_.truncated_records() > 0
               ? "; " + std::to_string(sampler_.truncated_records()) + " records longer than block_size + 1 are cut"
               : std::string())
       << (cfg_.data.packing == "packed" ? fmt("; packed, %.2f records per row", sampler_.records_per_row()) : "")
       << "; global batch " << cfg_.global_batch() << " x " << cfg_.model.block_size
       << " tokens (" << cfg_.micro_batch << " per micro-batch x " << cfg_.grad_accum << " accumulation steps x "
       << comm_.size() << " ranks)\n"
       << describe_training(cfg_) << "\n";
}

void Trainer::gradients_ready(int unit) {
  if (!units().trains(unit)) return;  // frozen: no gradient, nothing to update
  const Tensor g = units().grad_shard(unit);
  engine_->worker().submit(unit, [this, unit, g] {
    Tracer::Span span(tracer_.get(), Activity::adam, "grad norm " + units().order().unit_name(unit));
    // Into the step's norms on the gradients' device, read once in optimizer_step: no host
    // synchronisation per unit on a GPU (review F7).
    g.device().sum_squares_to(g, norms_.view(unit, {1}));
  });
  // Nothing to wait for: update now. Clipping needs the global norm first, and fp16 needs
  // to know that no rank's gradients overflowed.
  if (cfg_.grad_clip <= 0 && !scaler_) submit_update(unit, 1.0);
}

void Trainer::submit_update(int unit, double clip) {
  if (!units().trains(unit)) return;
  // Gradients hold the sum over ranks and micro-batches of each micro-batch's mean-loss
  // gradient; averaging and clipping fold into Adam's read of them.
  const double scale = clip / static_cast<double>(cfg_.grad_accum * comm_.size());
  const Tensor g = units().owned(unit).grads;
  const int64_t t = cur_step_ + 1;
  const double lr = cur_lr_;
  units().mark_updating(unit);
  engine_->worker().submit(unit, [this, unit, g, t, lr, scale] { optimizer().step(unit, g, decay_[static_cast<size_t>(unit)], t, lr, scale); });
}

double Trainer::optimizer_step(int64_t step, double* grad_norm_out) {
  // Each rank's shard slices of the gradients partition the whole: their squared norms,
  // summed in unit order (the same sum whatever the schedule), then over ranks.
  sync_updates();  // the norms (and without clipping, the updates themselves)
  norms_.device().copy_to_host(sumsq_.data(), norms_);
  std::vector<double> sumsq{0.0};
  for (double s : sumsq_) sumsq[0] += s;
  engine_->group().all_reduce_sum(sumsq);  // the group's shards partition the whole; replicas hold copies
  const double accum = static_cast<double>(cfg_.grad_accum * comm_.size());
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  const double grad_norm = std::sqrt(sumsq[0]) / accum / loss_scale;
  *grad_norm_out = grad_norm;
  if (scaler_) {
    const bool overflow = !std::isfinite(grad_norm);
    const std::string change = scaler_->update(overflow);
    if (overflow) {
      // Nothing was updated (updates wait for this decision): the step is dropped whole,
      // and Adam's step count and the schedule stay where they were.
      if (comm_.rank() == 0) {
        log::warn(log::Subsys::optim, "step " + std::to_string(step + 1) + ": fp16 gradients overflowed at loss scale " +
                                          fmt("%g", loss_scale) + ": step skipped; " + change);
      }
      return cur_lr_;
    }
    if (!change.empty() && comm_.rank() == 0) log::info(log::Subsys::optim, "step " + std::to_string(step + 1) + ": " + change);
  }
  if (!std::isfinite(grad_norm)) {
    throw std::runtime_error("step " + std::to_string(step + 1) + ": the gradient norm is not finite (" +
                             std::to_string(grad_norm) + "); lower optimizer.params.lr or check the data");
  }
  if (cfg_.grad_clip > 0 || scaler_) {
    // torch.nn.utils.clip_grad_norm_'s rule. In forward order: the next step's first unit first.
    const double clip = cfg_.grad_clip > 0 && grad_norm > cfg_.grad_clip ? cfg_.grad_clip / (grad_norm + 1e-6) : 1.0;
    for (int u = 0; u < model().num_units(); ++u) submit_update(u, clip / loss_scale);
  }
  engine_->worker().submit(-1, [this] { optimizer().commit(); });  // after every unit's update: the new state is current
  return cur_lr_;
}

StepStats Trainer::train_step(int64_t step) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const int64_t B = cfg_.micro_batch, T = cfg_.model.block_size;
  tracer_->begin_step(step + 1);
  cur_step_ = step - (scaler_ ? scaler_->skipped() : 0);
  cur_lr_ = learning_rate(cfg_.scheduler, cfg_.optimizer.lr, cur_step_);
  if (scaler_) model().set_loss_scale(scaler_->scale());
  sumsq_.assign(static_cast<size_t>(model().num_units()), 0.0);
  {
    nn::Device& grads = units().grad_device();
    if (!norms_.defined()) norms_ = Tensor::empty(grads, DType::f64, {model().num_units()});
    grads.fill(norms_, 0.0);
  }
  const nn::TransferBytes moved_before = device().transfer_bytes();
  units().begin_step(step + 1);
  device().reset_peak();
  // The micro-batches' mean losses add up on the compute device and are read once, at the
  // step's end (review F7: no host synchronisation per micro-batch).
  const Tensor loss_acc = Tensor::empty(device(), DType::f64, {1});
  device().fill(loss_acc, 0.0);
  for (int64_t micro = 0; micro < cfg_.grad_accum; ++micro) {
    const Batch batch = sampler_.train_batch(step, micro, comm_.rank(), comm_.size(), cfg_.grad_accum);
    // New tensors per micro-batch: the previous one's kernels may still read theirs.
    const Tensor tokens = Tensor::empty(device(), DType::i32, {B * T});
    const Tensor targets = Tensor::empty(device(), DType::i32, {B * T});
    device().copy_into_new(tokens, batch.inputs.data());
    device().copy_into_new(targets, batch.targets.data());
    Tensor doc_start;
    if (!batch.doc_start.empty()) {
      doc_start = Tensor::empty(device(), DType::i32, {B * T});
      device().copy_into_new(doc_start, batch.doc_start.data());
    }
    model().set_document_starts(doc_start);
    // LoRA dropout: masks keyed by (seed, step) over the step's global rows (this
    // micro-batch's first sequence is (micro x ranks + rank) x B, the sampler's), so every
    // world size and a resume draw the same ones; backward recomputes them.
    if (cfg_.lora.dropout > 0) {
      model().set_lora_dropout(cfg_.lora.dropout, nn::Rng::derive({cfg_.model_seed, static_cast<uint64_t>(step), 0x10aa}).next_u64(),
                               (micro * comm_.size() + comm_.rank()) * B * T);
    }
    units().set_micro_batch(micro == cfg_.grad_accum - 1);
    const int64_t counted = std::count_if(batch.targets.begin(), batch.targets.end(),
                                          [](int32_t t) { return t != nn::kIgnoreTarget; });
    model().defer_loss(loss_acc, counted);
    model().forward(*traced_, tokens, targets, B, T);
    model().backward(*traced_);
  }
  model().defer_loss(Tensor{}, 0);
  units().finish_gradients();
  units().end_step();
  double loss_sum = 0;
  device().copy_to_host(&loss_sum, loss_acc);
  // The compute queue is empty now: a mark passed at a known host time places this step's
  // device spans on the host timeline (review F6).
  if (DeviceClock* clock = device().clock()) tracer_->set_anchor(clock, clock->passed_mark(), std::chrono::steady_clock::now());
  // The stop flag rides on the loss's reduction: every rank learns of a signal any rank got.
  std::vector<double> reduce{loss_sum, stop_signal() != 0 ? 1.0 : 0.0};
  comm_.all_reduce_sum(reduce);
  StepStats s;
  s.step = step + 1;
  s.stop = reduce[1] > 0;
  s.loss = reduce[0] / static_cast<double>(cfg_.grad_accum * comm_.size());
  s.loss_scale = model().loss_scale();
  if (!std::isfinite(s.loss) && !scaler_) {  // fp16: an overflow, which optimizer_step skips
    throw std::runtime_error("step " + std::to_string(s.step) + ": the loss is not finite; lower optimizer.params.lr");
  }
  const int64_t skipped_before = scaler_ ? scaler_->skipped() : 0;
  s.lr = optimizer_step(step, &s.grad_norm);
  s.skipped = scaler_ && scaler_->skipped() > skipped_before;
  const nn::TransferBytes moved = device().transfer_bytes();
  s.to_device_bytes = moved.to_device - moved_before.to_device;
  s.to_host_bytes = moved.to_host - moved_before.to_host;
  const double seconds = std::chrono::duration<double>(clock::now() - t0).count();
  s.tokens_per_s = static_cast<double>(B * T * cfg_.grad_accum * comm_.size()) / seconds;  // global
  s.tflops = run_flops_per_token(cfg_, model().units(), T) * s.tokens_per_s / 1e12;  // adapters: no frozen dW
  s.device_peak_bytes = device().memory().peak;
  s.time = tracer_->end_step();
  if (log::enabled(log::Level::debug, log::Subsys::train)) {
    log::debug(log::Subsys::train, "step " + std::to_string(s.step) + ": " + describe_breakdown(s.time) +
                                       ", device peak " + nn::format_bytes(s.device_peak_bytes));
  }
  return s;
}

double Trainer::evaluate() {
  sync_updates();
  model().set_lora_dropout(0.0, 0, 0);  // evaluation and sampling see the adapters whole
  const int64_t B = cfg_.micro_batch, T = cfg_.model.block_size;
  model().set_document_starts(Tensor{});  // validation rows hold one record each
  double sum = 0;
  for (int64_t i = 0; i < cfg_.train.eval_batches; ++i) {
    const Batch batch = sampler_.val_batch(i);
    const Tensor tokens = Tensor::empty(device(), DType::i32, {B * T});
    const Tensor targets = Tensor::empty(device(), DType::i32, {B * T});
    device().copy_into_new(tokens, batch.inputs.data());
    device().copy_into_new(targets, batch.targets.data());
    sum += model().forward(*traced_, tokens, targets, B, T);
  }
  model().free_activations();
  return sum / static_cast<double>(cfg_.train.eval_batches);
}

std::string Trainer::sample(int64_t n_tokens, double temperature, uint64_t seed) {
  sync_updates();
  model().set_lora_dropout(0.0, 0, 0);
  model().set_document_starts(Tensor{});
  // Prompt: the first line's worth of the validation split (up to 32 tokens); the training
  // split's where there is no validation (data.val_fraction 0).
  const TokenView val = data_.wants_validation() ? data_.val() : data_.train();
  std::vector<uint32_t> seq(std::min<size_t>(32, val.size()));
  val.copy(0, seq.size(), seq.data());
  nn::Rng rng(seed);
  const int64_t V = cfg_.model.vocab_size;
  std::vector<float> logits(static_cast<size_t>(V));
  for (int64_t i = 0; i < n_tokens; ++i) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(seq.size()), cfg_.model.block_size);
    std::vector<int32_t> ctx(seq.end() - T, seq.end());
    const Tensor tokens = Tensor::empty(device(), DType::i32, {T});
    device().copy_into_new(tokens, ctx.data());
    model().forward(*traced_, tokens, Tensor{}, 1, T);
    const Tensor last = model().logits().view((T - 1) * V, {V});
    const Tensor wide = Tensor::empty(device(), DType::f32, {V});  // bf16/f16 logits under mixed precision
    device().cast(wide, last);
    device().copy_to_host(logits.data(), wide);
    double mx = logits[0];
    for (float l : logits) mx = std::max<double>(mx, l);
    std::vector<double> p(static_cast<size_t>(V));
    double z = 0;
    for (size_t v = 0; v < p.size(); ++v) z += p[v] = std::exp((logits[v] - mx) / temperature);
    double r = rng.uniform() * z;
    size_t pick = 0;
    while (pick + 1 < p.size() && r >= p[pick]) r -= p[pick++];
    seq.push_back(static_cast<uint32_t>(pick));
  }
  model().free_activations();
  return data_.decode(seq);
}

// Bytes per model parameter this step, over all ranks (each rank moves its shards' share):
// NVMe reads + writes, and on a GPU host -> device and device -> host. "" when none moved.
std::string Trainer::traffic(const StepStats& s) const {
  const double per_param = static_cast<double>(comm_.size()) / static_cast<double>(model().num_parameters());
  uint64_t nvme = 0;
  for (Activity a : {Activity::param_read, Activity::param_write, Activity::optim_read, Activity::optim_write})
    nvme += s.time.bytes[static_cast<size_t>(a)];
  std::string out;
  if (nvme > 0) out += fmt(" | nvme %.1f B/param", static_cast<double>(nvme) * per_param);
  if (engine_->gpu()) {
    out += fmt(" | pcie up %.2f", static_cast<double>(s.to_device_bytes) * per_param) +
           fmt(" down %.2f B/param", static_cast<double>(s.to_host_bytes) * per_param);
  }
  return out;
}

nlohmann::json Trainer::step_record(const StepStats& s) const {
  nlohmann::json busy = nlohmann::json::object(), moved = nlohmann::json::object();
  for (size_t a = 0; a < kActivities; ++a) {
    const char* key = activity_key(static_cast<Activity>(a));
    busy[key] = s.time.busy_s[a];
    if (a != static_cast<size_t>(Activity::compute) && a != static_cast<size_t>(Activity::adam)) moved[key] = s.time.bytes[a];
  }
  nlohmann::json r = {{"step", s.step},
                      {"loss", s.loss},
                      {"lr", s.lr},
                      {"grad_norm", s.grad_norm},
                      {"tokens_per_s", s.tokens_per_s},
                      {"tflops", s.tflops},
                      {"device_peak_bytes", s.device_peak_bytes},
                      {"step_time_s", s.time.wall_s},
                      {"time_s", busy},
                      {"bytes", moved},
                      {"memory", memory_by_tier().to_json()},
                      {"overlap", s.time.overlap()}};
  if (cfg_.log.peak_tflops > 0) r["mfu"] = s.tflops / (cfg_.log.peak_tflops * comm_.size());
  if (engine_->gpu()) r["pcie_bytes"] = {{"to_device", s.to_device_bytes}, {"to_host", s.to_host_bytes}};
  if (scaler_) {
    r["loss_scale"] = s.loss_scale;
    r["skipped"] = s.skipped;
  }
  return r;
}

nlohmann::json Trainer::model_shape() const {
  nlohmann::json shape = {{"arch", cfg_.model_arch},
                          {"n_layer", cfg_.model.n_layer},
                          {"n_head", cfg_.model.n_head},
                          {"n_embd", cfg_.model.n_embd},
                          {"vocab_size", cfg_.model.vocab_size},
                          {"block_size", cfg_.model.block_size}};
  // Keys at their defaults stay out, so checkpoints of earlier versions still match.
  if (cfg_.llama_family()) {
    shape["n_kv_head"] = cfg_.llama.n_kv_head;
    shape["intermediate_size"] = cfg_.llama.intermediate;
    shape["rope_theta"] = cfg_.llama.rope_theta;
    shape["norm_eps"] = cfg_.llama.norm_eps;
    if (cfg_.llama.tie_embeddings) shape["tie_word_embeddings"] = true;
    if (cfg_.llama.rope_factor > 0) {
      shape["rope_scaling"] = {{"factor", cfg_.llama.rope_factor},
                               {"low_freq_factor", cfg_.llama.rope_low_freq_factor},
                               {"high_freq_factor", cfg_.llama.rope_high_freq_factor},
                               {"original_max_position_embeddings", cfg_.llama.rope_original_max_positions}};
    }
    if (cfg_.max_positions > 0) shape["max_position_embeddings"] = cfg_.max_positions;
  } else if (cfg_.model.n_positions > 0) {
    shape["n_positions"] = cfg_.model.n_positions;
  }
  // Adapters change what the checkpoint holds: a resume with other lora.* is refused by name.
  if (cfg_.lora.enabled()) {
    shape["lora"] = {{"r", cfg_.lora.r},
                     {"lora_alpha", cfg_.lora.alpha},
                     {"use_rslora", cfg_.lora.rslora},
                     {"target_modules", [&] {  // sorted: the same list in another order is the same run
                        std::vector<std::string> t = cfg_.lora.target_modules.empty() ? nn::lora_default_targets(cfg_.arch())
                                                                                       : cfg_.lora.target_modules;
                        std::sort(t.begin(), t.end());
                        return t;
                      }()},
                     {"modules_to_save", cfg_.lora.modules_to_save}};
  }
  return shape;
}

std::string Trainer::save_checkpoint(int64_t steps_done, double lr) {
  sync_updates();
  SaveRequest req;
  req.dir = cfg_.checkpoint.dir;
  req.step = steps_done;
  req.keep_last = cfg_.checkpoint.keep_last;
  req.stage = cfg_.zero.stage;
  req.model = model_shape();
  if (cfg_.lora.enabled()) {
    req.lora = {{"scale", cfg_.lora.scale()},
                {"adapters", adapters_json(model().lora(), model().units())},
                {"base", cfg_.init_from},
                {"base_files", hf_ ? hf_->file_fingerprints() : nlohmann::json::object()}};
    // QLoRA: the base the adapters were trained against is the folder's values rounded to
    // the compute dtype, quantized, dequantized (nn::Model::quantized_bytes): a merge redoes it.
    if (cfg_.lora.nf4) {
      req.lora["base_dtype"] = "nf4";
      req.lora["double_quant"] = cfg_.lora.double_quant;
      req.lora["quantized_from"] = cfg_.zero.compute == nn::DType::f16 ? "fp16" : "bf16";
    }
  }
  if (!cfg_.init_from.empty()) {
    req.carry_root = cfg_.init_from;
    for (const std::string& f : hf_side_files(cfg_.init_from)) req.carry_files.push_back((std::filesystem::path(cfg_.init_from) / f).string());
  }
  // Everything else the run's future depends on is a function of these: batches of
  // (data.seed, step, global sequence), the learning rate of (scheduler, step), Adam's
  // bias correction of the step; nothing else draws random numbers during training.
  req.meta = {{"data", {{"path", cfg_.data.path},
                        {"seed", cfg_.data.seed},
                        {"global_batch", cfg_.global_batch()},
                        {"sequences_consumed", steps_done * cfg_.global_batch()}}},
              {"scheduler", cfg_.resolved.value("scheduler", nlohmann::json::object())},
              {"optimizer", cfg_.resolved.value("optimizer", nlohmann::json::object())},
              {"lr", lr},
              {"model_seed", cfg_.model_seed}};
  if (scaler_) req.meta["loss_scaler"] = scaler_->state();
  req.shard_world = cfg_.zero.shard_group_size;
  return runtime::save_checkpoint(req, model().units(), units(), optimizer(), comm_);
}

int64_t Trainer::load_checkpoint(const std::string& step_dir) {
  sync_updates();
  const nlohmann::json manifest = runtime::load_checkpoint(step_dir, model_shape(), model().units(), units(), optimizer(), comm_);
  // Adapters are only meaningful on the base they were trained on: its weight files as the
  // checkpoint recorded them (every rank sees the same folder).
  if (manifest.contains("lora")) {
    const std::string base = manifest.at("lora").value("base", "");
    if (!hf_ && !base.empty()) {
      throw CheckpointError(step_dir + ": its adapters were trained on the base " + base +
                            "; set model.init_from to it");
    }
    if (hf_) check_adapter_base(manifest, *hf_, step_dir);
  }
  // Allowed to differ (a user may mean it), but the run then no longer continues the saved one.
  const nlohmann::json& t = manifest.at("trainer");
  auto warn = [&](const std::string& what) {
    if (comm_.rank() == 0) log::warn(log::Subsys::ckpt, "resuming " + step_dir + ": " + what);
  };
  if (t.at("data").at("seed") != cfg_.data.seed) warn("data.seed differs: other batches than the saved run's");
  if (t.at("data").at("global_batch") != cfg_.global_batch()) {
    warn("the global batch was " + t.at("data").at("global_batch").dump() + " sequences, now " +
         std::to_string(cfg_.global_batch()) + ": keep micro batch x accumulation x ranks to continue the same run");
  }
  if (t.at("scheduler") != cfg_.resolved.value("scheduler", nlohmann::json::object())) warn("the scheduler settings differ");
  if (scaler_) {
    if (t.contains("loss_scaler")) {
      scaler_->restore(t.at("loss_scaler"));
    } else {
      warn("saved without fp16: the loss scale starts again at 2^fp16.initial_scale_power");
    }
  }
  return manifest.at("step").get<int64_t>();
}

TrainReport Trainer::run(const std::function<void(int64_t)>& started) {
  TrainReport report;
  describe_placement();
  // auto: a bar only where rank 0 writes to a terminal (other ranks' stream discards).
  const bool bar = cfg_.log.progress == "bar" || (&out_ == &std::cout && progress_bar_wanted(cfg_.log.progress, 1));
  Progress progress(out_, cfg_.train.steps, bar);
  auto say = [&](const std::string& text) { progress.say(text); };
  const std::string unit = byte_level() ? "byte" : "token";  // what the model reads
  const bool validates = data_.wants_validation();
  if (validates) {
    report.unigram_baseline = unigram_baseline(data_, cfg_.model.vocab_size);
    out_ << "unigram baseline (validation " << unit << "s scored by training " << unit
         << " frequencies): " << fmt("%.4f", report.unigram_baseline) << " nats/token\n";
  } else {
    out_ << "no validation data (data.val_fraction 0, no data.val_path): all of the data trains, nothing is evaluated\n";
  }
  auto eval = [&](int64_t step) {
    if (!validates) return;
    const double v = evaluate();
    report.val_losses.emplace_back(step, v);
    say("eval  step " + std::to_string(step) + " | val loss " + fmt("%.4f", v) + "\n");
    const nlohmann::json record = {{"step", step}, {"val_loss", v}};
    metrics_.write(record);
    monitors_.write(record);
  };
  const std::string from = [&] {
    try {
      return resolve_resume(cfg_.checkpoint.resume, cfg_.checkpoint.dir);
    } catch (const CheckpointError& e) {
      throw CheckpointError(e.what(), comm_.rank() != 0);  // every rank sees it: rank 0 says it
    }
  }();
  if (!from.empty()) {
    report.resumed_from = load_checkpoint(from);
    out_ << "resumed from " << from << " after step " << report.resumed_from << "\n";
    monitors_.resumed_at(report.resumed_from + 1);
  } else if (cfg_.checkpoint.resume == "auto") {
    out_ << "no checkpoint in " << cfg_.checkpoint.dir << " yet: starting from step 0\n";
    // Opened for appending in case a checkpoint continued the run; none did, so a metrics
    // file left by an earlier run must not precede this one's steps.
    if (metrics_.enabled()) metrics_ = MetricsWriter(cfg_.log.metrics, /*append=*/false);
  }
  if (started) started(report.resumed_from);
  const auto& ck = cfg_.checkpoint;
  if (cfg_.train.steps == 0 && !ck.dir.empty() && report.resumed_from == 0) {
    // No training: the initial (or imported) weights as a checkpoint of step 0, e.g. to
    // export a Hugging Face folder from it or to start several runs from it.
    report.last_checkpoint = save_checkpoint(0, 0.0);
    say("checkpoint: step 0 saved to " + report.last_checkpoint + "\n");
  }
  for (int64_t step = report.resumed_from; step < cfg_.train.steps; ++step) {
    const StepStats s = train_step(step);
    report.steps.push_back(s);
    report.device_peak_bytes = std::max(report.device_peak_bytes, s.device_peak_bytes);
    const nlohmann::json record = step_record(s);
    metrics_.write(record);
    monitors_.write(record);
    progress.step(s.step, s.loss, s.tokens_per_s, s.time.wall_s);
    if (s.step % cfg_.log.every == 0 || s.step == 1 || s.step == cfg_.train.steps) {
      std::string perf = fmt("%.3f TFLOP/s", s.tflops);
      if (cfg_.log.peak_tflops > 0) perf += fmt(" (MFU %.1f%%)", 100.0 * s.tflops / (cfg_.log.peak_tflops * comm_.size()));
      const std::string scale = !scaler_ ? "" : fmt(" | loss scale %g", s.loss_scale) + (s.skipped ? " (overflow: skipped)" : "");
      say("step " + std::to_string(s.step) + "/" + std::to_string(cfg_.train.steps) + " | loss " + fmt("%.4f", s.loss) +
          " | lr " + fmt("%.3e", s.lr) + " | grad norm " + fmt("%.3f", s.grad_norm) + scale + " | " +
          fmt("%.0f", s.tokens_per_s) + " tok/s | " + perf + " | device peak " + nn::format_bytes(s.device_peak_bytes) +
          " | " + describe_breakdown(s.time) + traffic(s) + "\n");
    }
    const bool last = s.step == cfg_.train.steps;
    if (!ck.dir.empty() && (s.stop || last || (ck.every_steps > 0 && s.step % ck.every_steps == 0))) {
      report.last_checkpoint = save_checkpoint(s.step, s.lr);
      say("checkpoint: step " + std::to_string(s.step) + " saved to " + report.last_checkpoint + "\n");
    }
    if (s.stop) {
      report.stopped = true;
      progress.finish();
      out_ << "stopped after step " << s.step << " on a stop signal; "
           << (ck.dir.empty() ? "no checkpoint.dir, nothing saved"
                              : "continue with --resume auto (or --resume " + report.last_checkpoint + ")")
           << "\n";
      out_.flush();
      return report;
    }
    if (cfg_.train.eval_every > 0 && s.step % cfg_.train.eval_every == 0 && !last) eval(s.step);
  }
  eval(cfg_.train.steps);
  progress.finish();
  describe_memory();
  if (validates) {
    const double final_val = report.val_losses.back().second;
    out_ << "final validation loss " << fmt("%.4f", final_val) << " nats/token vs unigram baseline "
         << fmt("%.4f", report.unigram_baseline) << " (" << compare_to_baseline(final_val, report.unigram_baseline)
         << ")\n";
  } else if (!report.steps.empty()) {
    out_ << "final training loss " << fmt("%.4f", report.steps.back().loss) << " nats/token (step "
         << report.steps.back().step << "; no validation data)\n";
  }
  if (cfg_.train.sample_tokens > 0) {
    report.sample = sample(cfg_.train.sample_tokens, cfg_.train.sample_temperature, cfg_.data.seed);
    out_ << "sample (prompt: the first 32 " << (validates ? "validation " : "training ") << (byte_level() ? "bytes" : "tokens")
         << "; temperature "
         << cfg_.train.sample_temperature
         << "):\n---\n" << report.sample << "\n---\n";
  }
  return report;
}

}  // namespace ferry::runtime
