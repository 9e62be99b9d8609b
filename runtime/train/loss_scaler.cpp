#include "runtime/train/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace ferry::runtime {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

LossScaler::LossScaler(const LossScaling& cfg)
    : cfg_(cfg),
      scale_(cfg.static_scale > 0 ? cfg.static_scale : std::ldexp(1.0, cfg.initial_scale_power)),
      hysteresis_left_(cfg.hysteresis) {}

std::string LossScaler::update(bool overflow) {
  std::string what;
  if (overflow) {
    ++skipped_;
    if (!dynamic()) {
      what = "static loss scale " + num(scale_) + " kept";
    } else if (cfg_.hysteresis <= 1 || hysteresis_left_ <= 1) {
      if (scale_ <= cfg_.min_scale) {
        throw std::runtime_error("fp16: the gradients overflow with the loss scale already at fp16.min_loss_scale (" +
                                 num(cfg_.min_scale) + "); lower optimizer.params.lr, or train in bf16");
      }
      const double next = std::max(scale_ / 2, cfg_.min_scale);
      what = "loss scale " + num(scale_) + " -> " + num(next);
      scale_ = next;
    } else {
      --hysteresis_left_;
      what = "loss scale " + num(scale_) + " kept (hysteresis: " + std::to_string(hysteresis_left_) + " left)";
    }
    last_overflow_ = iter_;
  } else if (dynamic()) {
    if (cfg_.consecutive_hysteresis) hysteresis_left_ = cfg_.hysteresis;
    if ((iter_ - last_overflow_) % cfg_.window == 0) {
      if (!cfg_.consecutive_hysteresis) hysteresis_left_ = cfg_.hysteresis;
      what = "loss scale " + num(scale_) + " -> " + num(scale_ * 2) + " after " + std::to_string(cfg_.window) +
             " steps without overflow";
      scale_ *= 2;
    }
  }
  ++iter_;
  return what;
}

nlohmann::json LossScaler::state() const {
  return {{"scale", scale_},
          {"iter", iter_},
          {"last_overflow", last_overflow_},
          {"skipped", skipped_},
          {"hysteresis_left", hysteresis_left_}};
}

void LossScaler::restore(const nlohmann::json& s) {
  try {
    scale_ = s.at("scale").get<double>();
    iter_ = s.at("iter").get<int64_t>();
    last_overflow_ = s.at("last_overflow").get<int64_t>();
    skipped_ = s.at("skipped").get<int64_t>();
    hysteresis_left_ = s.at("hysteresis_left").get<int>();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("loss scaler state: ") + e.what());
  }
  if (!(scale_ > 0) || !std::isfinite(scale_)) throw std::runtime_error("loss scaler state: scale " + num(scale_));
}

}  // namespace ferry::runtime
