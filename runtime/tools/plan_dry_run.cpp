// plan_memory: the engine's construction (runtime/train/engine.h, kind count) and two
// training steps on its counting devices (nn/counting_device.h), counting communicator
// (comm/counting_communicator.h), counting pinned pool and nvme storage (offload/), as
// rank 0 of `ranks`.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "nn/counting_device.h"
#include "runtime/tools/plan.h"
#include "runtime/train/engine.h"

namespace ferry::runtime {

namespace {

using nn::DType;
using nn::Tensor;

// One micro-batch as Trainer::train_step runs it: new token and target tensors, forward
// (its loss added to `loss_acc` on the device when given), backward.
void micro_batch(const Config& c, nn::Device& dev, nn::Model& model, nn::UnitAccess& units,
                 const Tensor& loss_acc = Tensor{}) {
  const int64_t B = c.micro_batch, T = c.model.block_size;
  const Tensor tokens = Tensor::empty(dev, DType::i32, {B * T});
  const Tensor targets = Tensor::empty(dev, DType::i32, {B * T});
  model.defer_loss(loss_acc, B * T);
  if (c.lora.dropout > 0) model.set_lora_dropout(c.lora.dropout, 0, 0);  // its masked inputs are buffers too
  model.forward(units, tokens, targets, B, T);
  model.backward(units);
  model.defer_loss(Tensor{}, 0);
}

// The activations alone: the model over resident weights kept on another device.
size_t activation_peak(const Config& c) {
  nn::CountingDevice acts("activations", SIZE_MAX, true), weights("weights", SIZE_MAX, true);
  std::unique_ptr<nn::Model> model = make_model(c, acts);
  nn::ResidentUnits units(weights, c.zero.compute, model->units());
  micro_batch(c, acts, *model, units);
  return acts.memory().peak;
}

}  // namespace

// The trainer's own engine (runtime/train/engine.h), counting, for device.type cpu and for
// cuda without offload (the states on the GPU: the same allocations on another arena).
// With offload on a GPU the trainer's state arena is host memory and the GPU holds the
// staged copies; the figures here are then those of a cpu run of the same configuration.
MemoryPlan plan_memory(const Config& config, int ranks) {
  Engine e(config, ranks);
  const Config& c = e.config();
  nn::Device& dev = e.compute();
  ShardedUnits& units = e.units();

  MemoryPlan m;
  m.device_construction_peak = dev.memory().peak;
  m.device_states = dev.memory().in_use;
  m.host_states = e.host().memory().in_use;
  const TierMemory tiers = e.memory_by_tier();
  m.host_pinned = tiers.host_pinned;
  m.nvme_params = units.state_bytes().weights_nvme;
  m.nvme = tiers.nvme;

  // Two steps: the first records the unit order, the second prefetches by it (the steady
  // state). The optimizer's arithmetic is not run: it allocates nothing (states are
  // updated in place, nvme tiles pass through the pool), but its effect on the schedule
  // is: updated units are gathered again (stages 1-2) before their next use.
  const bool update_at_once = c.grad_clip <= 0 && !c.fp16;
  if (update_at_once) units.on_gradients_ready([&](int u) { units.mark_updating(u); });
  // The trainer's per-unit gradient norms, on the gradients' device for the whole run.
  const Tensor norms = Tensor::empty(units.grad_device(), DType::f64, {units.num_units()});
  for (int64_t step = 0; step < 2; ++step) {
    units.begin_step(step + 1);
    dev.reset_peak();
    const Tensor loss_acc = Tensor::empty(dev, DType::f64, {1});  // the step's summed losses
    for (int64_t micro = 0; micro < c.grad_accum; ++micro) {
      units.set_micro_batch(micro == c.grad_accum - 1);
      micro_batch(c, dev, e.model(), units, loss_acc);
    }
    units.finish_gradients();
    units.end_step();
    if (!update_at_once) {
      for (int u = 0; u < units.num_units(); ++u) units.mark_updating(u);
    }
    m.device_peak = std::max(m.device_peak, dev.memory().peak);
  }
  m.device_activations = activation_peak(c);
  const size_t beyond_states = m.device_peak - m.device_states;
  m.device_transient = beyond_states > m.device_activations ? beyond_states - m.device_activations : 0;
  return m;
}

}  // namespace ferry::runtime
