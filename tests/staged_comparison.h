// What the StagedUnits tests compare: a GPT computing on CPU-resident units directly, and
// the same GPT computing on `compute` through StagedUnits from a second copy of those
// units, over `micro_batches` forward/backward passes whose gradients accumulate.
#pragma once

#include <vector>

#include "nn/cpu_device.h"
#include "nn/gpt.h"
#include "nn/rng.h"
#include "testing/staged_units.h"

namespace ferry::test {

struct StagedComparison {
  std::vector<double> direct_losses, staged_losses;            // per micro-batch
  std::vector<std::vector<float>> direct_grads, staged_grads;  // per unit, after the last
  size_t compute_in_use_after = 0;  // compute's bytes in use once the activations are freed
};

inline StagedComparison compare_staged(nn::Device& compute, int micro_batches, int64_t B, int64_t T,
                                       uint64_t init_seed, uint64_t data_seed) {
  using nn::DType;
  using nn::Tensor;
  nn::CpuDevice home(size_t{256} << 20, 1);
  const nn::GPTConfig cfg{2, 2, 32, 64, 16};
  nn::GPT direct(cfg, home, DType::f32), staged_model(cfg, compute, DType::f32);
  nn::ResidentUnits a(home, DType::f32, direct.units()), b(home, DType::f32, direct.units());
  for (int u = 0; u < direct.num_units(); ++u) {
    direct.init_unit(u, a.weights[static_cast<size_t>(u)], init_seed);
    direct.init_unit(u, b.weights[static_cast<size_t>(u)], init_seed);
  }
  a.zero_grads();
  b.zero_grads();
  testing::StagedUnits staged(b, compute);
  nn::Rng rng(data_seed);
  StagedComparison r;
  for (int micro = 0; micro < micro_batches; ++micro) {
    std::vector<int32_t> ids(static_cast<size_t>(2 * B * T));
    for (auto& x : ids) x = static_cast<int32_t>(rng.below(64));
    const Tensor tok_a = Tensor::empty(home, DType::i32, {B * T}),
                 tgt_a = Tensor::empty(home, DType::i32, {B * T});
    const Tensor tok_b = Tensor::empty(compute, DType::i32, {B * T}),
                 tgt_b = Tensor::empty(compute, DType::i32, {B * T});
    for (const Tensor* t : {&tok_a, &tok_b}) t->device().copy_from_host(*t, ids.data());
    for (const Tensor* t : {&tgt_a, &tgt_b}) t->device().copy_from_host(*t, ids.data() + B * T);
    r.direct_losses.push_back(direct.forward(a, tok_a, tgt_a, B, T));
    r.staged_losses.push_back(staged_model.forward(staged, tok_b, tgt_b, B, T));
    direct.backward(a);
    staged_model.backward(staged);
  }
  for (int u = 0; u < direct.num_units(); ++u) {
    for (auto [units, out] : {std::pair{&a, &r.direct_grads}, std::pair{&b, &r.staged_grads}}) {
      const Tensor& g = units->grads[static_cast<size_t>(u)];
      out->emplace_back(static_cast<size_t>(g.numel()));
      home.copy_to_host(out->back().data(), g);
    }
  }
  direct.free_activations();
  staged_model.free_activations();
  r.compute_in_use_after = compute.memory().in_use;
  return r;
}

}  // namespace ferry::test
