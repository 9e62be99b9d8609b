#include "nn/model.h"

#include <algorithm>
#include <cstring>

#include <stdexcept>

#include "nn/rng.h"

namespace ferry::nn {

int64_t Model::num_parameters() const {
  int64_t n = 0;
  for (const UnitSpec& u : units())
    for (const TensorSpec& t : u.tensors) n += t.numel();
  return n;
}

void Model::check_batch(const char* model, int64_t block_size, const Tensor& tokens, const Tensor& targets,
                        int64_t B, int64_t T) {
  if (T < 1 || T > block_size || B < 1) {
    throw std::invalid_argument(std::string(model) + "::forward: T=" + std::to_string(T) + " must be in [1, block_size=" +
                                std::to_string(block_size) + "], B=" + std::to_string(B));
  }
  if (tokens.numel() != B * T || (targets.defined() && targets.numel() != B * T)) {
    throw std::invalid_argument(std::string(model) + "::forward: tokens/targets must hold B*T ids");
  }
}

void Model::check_dtype(const char* model, DType dtype) {
  if (dtype == DType::i32) {
    throw std::invalid_argument(std::string(model) + ": compute dtype must be f32, f64, bf16 or f16");
  }
}

double Model::mean_loss(Device& dev, const Tensor& losses, const Tensor& targets) {
  const int64_t N = losses.numel();
  if (loss_acc_.defined()) {
    loss_tokens_ = std::max<int64_t>(1, deferred_tokens_);
    const Tensor losses64 = Tensor::empty(dev, DType::f64, {N}), sum = Tensor::empty(dev, DType::f64, {1});
    dev.cast(losses64, losses);
    dev.fill(sum, 0.0);
    dev.bias_backward(sum, losses64.view(0, {N, 1}));  // the rows' sum, in a fixed order
    dev.scale(sum, 1.0 / static_cast<double>(loss_tokens_));
    dev.accumulate(loss_acc_, sum);
    return 0.0;
  }
  std::vector<double> host(static_cast<size_t>(N));
  const Tensor losses64 = Tensor::empty(dev, DType::f64, {N});
  dev.cast(losses64, losses);
  dev.copy_to_host(host.data(), losses64);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  dev.copy_to_host(ids.data(), targets);
  double sum = 0;
  int64_t counted = 0;
  for (int64_t i = 0; i < N; ++i) {
    sum += host[static_cast<size_t>(i)];  // ignored rows hold 0
    counted += ids[static_cast<size_t>(i)] != kIgnoreTarget;
  }
  loss_tokens_ = std::max<int64_t>(1, counted);
  return sum / static_cast<double>(loss_tokens_);
}

void Model::quantized_bytes(int unit, size_t i, uint64_t seed, const RowsFn& rows, const StateFn& state,
                            DType values, int64_t begin, int64_t n, uint8_t* dst) const {
  const TensorSpec& t = units().at(static_cast<size_t>(unit)).tensors.at(i);
  if (!t.quantized()) throw std::invalid_argument("Model::quantized_bytes: " + t.name + " is not quantized");
  std::vector<double> init;
  std::vector<uint8_t> blob;
  for (const Nf4Piece& p : t.nf4) {
    const int64_t lo = std::max(begin, p.at), hi = std::min(begin + n, p.at + p.layout.bytes);
    if (lo >= hi) continue;
    const int64_t cols = p.layout.cols, count = p.layout.numel();
    blob.assign(static_cast<size_t>(p.layout.bytes), 0);
    if (Nf4Tensor given; state && state(p.row0, &given)) {
      if (given.numel != count || given.double_quant != p.layout.double_quant) {
        throw std::invalid_argument("Model::quantized_bytes: the NF4 state given for rows " + std::to_string(p.row0) +
                                    "+ of " + t.name + " has " + std::to_string(given.numel) + " values" +
                                    (given.double_quant ? ", double quantized" : ", plain") + "; the layout's piece " +
                                    std::to_string(count) + (p.layout.double_quant ? ", double quantized" : ", plain"));
      }
      nf4_write_blob(given, p.layout, blob.data());
      std::memcpy(dst + (lo - begin), blob.data() + (lo - p.at), static_cast<size_t>(hi - lo));
      continue;
    }
    std::vector<float> v(static_cast<size_t>(count));
    if (rows) {
      rows(p.row0, p.layout.rows, v.data());
    } else {
      if (init.empty()) init = initial_values(unit, i, seed);
      for (int64_t k = 0; k < count; ++k) v[static_cast<size_t>(k)] = static_cast<float>(init[static_cast<size_t>(p.row0 * cols + k)]);
    }
    for (float& x : v) {
      if (values == DType::bf16) x = bf16_to_f32(f32_to_bf16(x));
      if (values == DType::f16) x = f16_to_f32(f32_to_f16(x));
    }
    const Nf4Tensor q = nf4_quantize(v.data(), count, p.layout.double_quant, nullptr, nullptr);
    nf4_write_blob(q, p.layout, blob.data());
    std::memcpy(dst + (lo - begin), blob.data() + (lo - p.at), static_cast<size_t>(hi - lo));
  }
}

void Model::write_values(Device& dev, const Tensor& view, const std::vector<double>& host) {
  const Tensor staged = Tensor::empty(dev, DType::f64, view.shape());
  dev.copy_into_new(staged, host.data());
  dev.cast(view, staged);
}

void Model::freeze(const std::vector<std::string>& tensor_names) {
  std::vector<UnitSpec>& units = mutable_units();
  for (const std::string& name : tensor_names) {
    bool found = false;
    for (UnitSpec& u : units) {
      for (size_t i = 0; i < u.tensors.size() && !found; ++i) {
        if (u.tensors[i].name != name) continue;
        u.set_trainable(i, false);
        found = true;
      }
    }
    if (!found) throw std::invalid_argument("freeze: the model has no tensor named '" + name + "'");
  }
}

void Model::add_lora(const Arch& arch, const LlamaConfig& llama, const LoraOptions& options) {
  if (!lora_.empty()) throw std::logic_error("add_lora: the model has adapters already");
  lora_ = apply_lora(mutable_units(), arch, llama, options);
  lora_scale_ = options.scale();
}

void Model::set_lora_dropout(double p, uint64_t key, int64_t row0) {
  if (!(p >= 0.0 && p < 1.0) || row0 < 0) {
    throw std::invalid_argument("set_lora_dropout: p must be in [0, 1) and row0 >= 0, got p " + std::to_string(p) +
                                ", row0 " + std::to_string(row0));
  }
  lora_dropout_ = p;
  lora_dropout_key_ = key;
  lora_dropout_row0_ = row0;
}

uint64_t Model::lora_dropout_key(uint64_t key, size_t adapter) {
  return Rng::derive({key, static_cast<uint64_t>(adapter)}).next_u64();
}

Linear Model::linear(int unit, const Tensor& weights, const Tensor& grads, size_t w_index, size_t b_index) const {
  const UnitSpec& u = units().at(static_cast<size_t>(unit));
  Linear l = unit_linear(u, weights, grads, w_index, b_index);
  for (size_t i = 0; i < lora_.size(); ++i) {
    const LoraAdapter& a = lora_[i];
    if (a.unit != unit || a.base != w_index) continue;
    LoraPair p;
    p.a = u.view(weights, a.a);
    p.b = u.view(weights, a.b);
    p.da = u.grad_view(grads, a.a);
    p.db = u.grad_view(grads, a.b);
    p.row0 = a.row0;
    p.rows = a.rows;
    p.scale = lora_scale_;
    if (lora_dropout_ > 0.0) {
      p.dropout = lora_dropout_;
      p.dropout_key = lora_dropout_key(lora_dropout_key_, i);
      p.dropout_row0 = lora_dropout_row0_;
    }
    l.lora.push_back(p);
  }
  return l;
}

void Model::init_adapters(Device& dev, int unit, const Tensor& flat, uint64_t seed) const {
  const UnitSpec& u = units().at(static_cast<size_t>(unit));
  for (const LoraAdapter& a : lora_) {
    if (a.unit != unit) continue;
    write_values(dev, u.view(flat, a.a), lora_init(a, false, seed));
    write_values(dev, u.view(flat, a.b), lora_init(a, true, seed));
  }
}

Tensor Model::grad_or_scratch(Device& dev, const UnitSpec& u, const Tensor& grads, size_t index, DType dtype) {
  Tensor g = u.grad_view(grads, index);
  if (g.defined()) return g;
  g = Tensor::empty(dev, grads.defined() ? grads.dtype() : dtype, u.tensors.at(index).shape);
  dev.fill(g, 0.0);
  return g;
}

}  // namespace ferry::nn
