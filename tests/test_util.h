// Helpers shared by the unit tests: random tensors and finite-difference gradients.
#pragma once

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "nn/device.h"
#include "nn/rng.h"
#include "nn/tensor.h"
#include "testing/fake_communicator.h"

namespace ferry::test {

// A fresh folder under the system's temp dir, removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag)
      : path(std::filesystem::temp_directory_path() / ("ferry_" + tag + "_" + std::to_string(getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// Runs fn(rank, comm) on `world` threads, one fake rank each; rethrows the failures,
// naming their ranks. A rank that throws aborts the group, and one that returns leaves
// it: the others' collectives then fail naming it, as mpiexec ends a job, instead of
// waiting for ever.
inline void run_ranks(int world, const std::function<void(int, comm::Communicator&)>& fn) {
  testing::FakeGroup group(world);
  std::vector<std::thread> threads;
  std::mutex mu;
  std::string failure;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto c = group.communicator(r);
      try {
        fn(r, *c);
        group.leave(r);
      } catch (const std::exception& e) {
        group.abort("rank " + std::to_string(r) + ": " + e.what());
        std::lock_guard<std::mutex> lock(mu);
        failure += "rank " + std::to_string(r) + ": " + e.what() + "\n";
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!failure.empty()) throw std::runtime_error(failure);
}

inline nn::Tensor random_tensor(nn::Device& dev, nn::DType dtype, nn::Shape shape, uint64_t seed,
                                double scale = 1.0) {
  nn::Tensor t = nn::Tensor::empty(dev, nn::DType::f64, shape);
  nn::Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<double>()[i] = scale * rng.normal();
  if (dtype == nn::DType::f64) return t;
  nn::Tensor out = nn::Tensor::empty(dev, dtype, shape);
  dev.cast(out, t);
  return out;
}

inline nn::Tensor zeros(nn::Device& dev, nn::DType dtype, nn::Shape shape) {
  nn::Tensor t = nn::Tensor::empty(dev, dtype, std::move(shape));
  dev.fill(t, 0.0);
  return t;
}

// sum_i a[i] * b[i] over f64 tensors.
inline double dot(const nn::Tensor& a, const nn::Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data_as<double>()[i] * b.data_as<double>()[i];
  return s;
}

// Largest error of `analytic` (f64) against central differences of `loss` with respect to
// every element of `x` (f64), relative to max(1, |grad|).
// Why this tolerance holds in double: with h = 1e-5 the truncation error is O(h^2 f''') ~ 1e-10
// and the rounding error O(eps_machine |f| / h) ~ 1e-11 for the O(1) losses used here; the
// tests accept 1e-6, far above both and far below any real mistake (which is O(1)).
inline double max_grad_error(const std::function<double()>& loss, const nn::Tensor& x,
                             const nn::Tensor& analytic, int64_t max_checks = 400) {
  const double h = 1e-5;
  double worst = 0;
  const int64_t n = x.numel();
  const int64_t stride = std::max<int64_t>(1, n / max_checks);
  for (int64_t i = 0; i < n; i += stride) {
    double* p = x.data_as<double>() + i;
    const double saved = *p;
    *p = saved + h;
    const double up = loss();
    *p = saved - h;
    const double down = loss();
    *p = saved;
    const double numeric = (up - down) / (2 * h);
    const double a = analytic.data_as<double>()[i];
    worst = std::max(worst, std::abs(numeric - a) / std::max(1.0, std::abs(a)));
  }
  return worst;
}

}  // namespace ferry::test
