// The tensor type, the CPU device's memory budget, copies and casts, and GEMM against a
// naive triple loop.
#define BOOST_TEST_MODULE device
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>

#include "nn/cpu_device.h"
#include "test_util.h"

using namespace ferry;
using nn::DType;
using nn::Tensor;

BOOST_AUTO_TEST_CASE(views_share_storage_and_check_bounds) {
  nn::CpuDevice dev(1 << 20);
  Tensor t = Tensor::empty(dev, DType::f32, {4, 8});
  BOOST_TEST(t.numel() == 32);
  BOOST_TEST(t.nbytes() == 128u);
  BOOST_TEST(reinterpret_cast<uintptr_t>(t.data()) % 64 == 0u);
  Tensor v = t.view(8, {2, 4});
  v.data_as<float>()[0] = 42.0f;
  BOOST_TEST(t.data_as<float>()[8] == 42.0f);
  BOOST_TEST(v.dim(-1) == 4);
  BOOST_CHECK_THROW(t.view(30, {4}), std::out_of_range);
  BOOST_CHECK_THROW(t.reshape({5, 7}), std::invalid_argument);
  BOOST_TEST(t.reshape({32}).describe() == "f32[32]");
}

BOOST_AUTO_TEST_CASE(memory_is_returned_when_the_last_handle_goes) {
  nn::CpuDevice dev(1 << 20);
  {
    Tensor a = Tensor::empty(dev, DType::f32, {1000});
    Tensor view = a.view(10, {10});
    a = Tensor{};
    BOOST_TEST(dev.memory().in_use == 4000u);  // the view keeps the storage alive
  }
  BOOST_TEST(dev.memory().in_use == 0u);
  BOOST_TEST(dev.memory().peak == 4000u);
  dev.reset_peak();
  BOOST_TEST(dev.memory().peak == 0u);
}

// A GPU run's host states are page-locked through hooks (the cuda device's
// cudaHostRegister): every allocation, however small (a download into pageable memory
// blocks the host), each in whole pages of its own so that no two registrations share a
// page; unpinned before it is freed; a refused pin leaves usable memory and its reason.
BOOST_AUTO_TEST_CASE(pinned_allocations_own_whole_pages) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  nn::CpuDevice dev(64 << 20, 1);
  std::map<uintptr_t, size_t> registered;
  int unpinned = 0;
  bool refuse = false;
  nn::CpuDevice::Pinning pin;
  pin.pin = [&](void* p, size_t n) -> std::string {
    if (refuse) return "refused for the test";
    const auto a = reinterpret_cast<uintptr_t>(p);
    for (const auto& [b, m] : registered)
      if (a / page <= (b + m - 1) / page && b / page <= (a + n - 1) / page) return "shares a page";
    registered[a] = n;
    return "";
  };
  pin.unpin = [&](void* p) {
    BOOST_TEST(registered.erase(reinterpret_cast<uintptr_t>(p)) == 1u);
    ++unpinned;
  };
  dev.set_pinning(pin);
  {
    std::vector<Tensor> small;
    for (int i = 0; i < 8; ++i) small.push_back(Tensor::empty(dev, DType::f32, {3 + i}));  // 12-40 bytes each
    const Tensor big = Tensor::empty(dev, DType::f32, {100'000});
    BOOST_TEST(registered.size() == 9u);
    for (const auto& [a, n] : registered) {
      BOOST_TEST(a % page == 0u);
      BOOST_TEST(n % page == 0u);
    }
    BOOST_TEST(dev.pinned_bytes() == 8 * page + (400'000 + page - 1) / page * page);
    BOOST_TEST(dev.memory().in_use == 400'000u + 4 * (3 + 4 + 5 + 6 + 7 + 8 + 9 + 10));  // the budget counts what was asked
    BOOST_TEST(dev.pinning_problem().empty());
    refuse = true;
    const Tensor pageable = Tensor::empty(dev, DType::f32, {10});
    dev.fill(pageable, 2.0);  // still usable memory
    BOOST_TEST(dev.pinning_problem() == "refused for the test");
  }
  BOOST_TEST(unpinned == 9);
  BOOST_TEST(registered.empty());
  BOOST_TEST(dev.pinned_bytes() == 0u);
}

BOOST_AUTO_TEST_CASE(the_cap_is_enforced_with_a_message_naming_the_bytes) {
  nn::CpuDevice dev(10000);
  Tensor a = Tensor::empty(dev, DType::f32, {2000});  // 8000 bytes
  try {
    Tensor b = Tensor::empty(dev, DType::f32, {1000});  // 4000 more: over the cap
    BOOST_FAIL("allocation past the cap succeeded");
  } catch (const nn::OutOfDeviceMemory& e) {
    const std::string msg = e.what();
    BOOST_TEST(e.requested == 4000u);
    BOOST_TEST(e.in_use == 8000u);
    BOOST_TEST(e.capacity == 10000u);
    BOOST_TEST(msg.find("4000 bytes") != std::string::npos, msg);
    BOOST_TEST(msg.find("8000 bytes") != std::string::npos, msg);
    BOOST_TEST(msg.find("10000 bytes") != std::string::npos, msg);
    BOOST_TEST(msg.find("device.memory") != std::string::npos, msg);
  }
  BOOST_TEST(dev.memory().in_use == 8000u);  // the failed request left nothing behind
  Tensor c = Tensor::empty(dev, DType::f32, {500});  // exactly fills the cap
  BOOST_TEST(dev.memory().in_use == 10000u);
}

BOOST_AUTO_TEST_CASE(bf16_rounds_to_nearest_even_and_keeps_specials) {
  BOOST_TEST(nn::bf16_to_f32(nn::f32_to_bf16(1.0f)) == 1.0f);
  BOOST_TEST(nn::bf16_to_f32(nn::f32_to_bf16(-2.5f)) == -2.5f);
  // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one, 1.
  BOOST_TEST(nn::bf16_to_f32(nn::f32_to_bf16(1.0f + 0x1.0p-8f)) == 1.0f);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: ties go to 1 + 2^-6 (even).
  BOOST_TEST(nn::bf16_to_f32(nn::f32_to_bf16(1.0f + 3 * 0x1.0p-8f)) == 1.0f + 0x1.0p-6f);
  BOOST_TEST(std::isinf(nn::bf16_to_f32(nn::f32_to_bf16(std::numeric_limits<float>::infinity()))));
  BOOST_TEST(std::isnan(nn::bf16_to_f32(nn::f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload is only in the low 16 bits stays a NaN.
  uint32_t bits = 0x7f800001u;
  float low_nan;
  std::memcpy(&low_nan, &bits, 4);
  BOOST_TEST(std::isnan(nn::bf16_to_f32(nn::f32_to_bf16(low_nan))));
}

BOOST_AUTO_TEST_CASE(casts_and_copies_round_trip) {
  nn::CpuDevice dev(1 << 20);
  Tensor a = test::random_tensor(dev, DType::f32, {37}, 1);
  Tensor b = Tensor::empty(dev, DType::bf16, {37});
  Tensor c = Tensor::empty(dev, DType::f32, {37});
  dev.cast(b, a);
  dev.cast(c, b);
  for (int i = 0; i < 37; ++i) {
    const float x = a.data_as<float>()[i], y = c.data_as<float>()[i];
    BOOST_TEST(std::abs(x - y) <= std::abs(x) * 0x1.0p-8f);  // bf16 keeps 8 significant bits
    BOOST_TEST(y == nn::bf16_to_f32(nn::f32_to_bf16(x)));
  }
  std::vector<float> host(37);
  dev.copy_to_host(host.data(), a);
  Tensor d = Tensor::empty(dev, DType::f32, {37});
  dev.copy_from_host(d, host.data());
  BOOST_TEST(std::memcmp(d.data(), a.data(), a.nbytes()) == 0);
  BOOST_CHECK_THROW(dev.copy(Tensor::empty(dev, DType::f32, {36}), a), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(gemm_matches_a_naive_loop_for_every_transpose) {
  nn::CpuDevice dev(1 << 24);
  const int64_t M = 13, N = 7, K = 19;
  for (DType dt : {DType::f32, DType::f64}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Tensor a = test::random_tensor(dev, DType::f64, ta ? nn::Shape{K, M} : nn::Shape{M, K}, 2);
        Tensor b = test::random_tensor(dev, DType::f64, tb ? nn::Shape{N, K} : nn::Shape{K, N}, 3);
        Tensor c0 = test::random_tensor(dev, DType::f64, {M, N}, 4);
        Tensor ad = Tensor::empty(dev, dt, a.shape()), bd = Tensor::empty(dev, dt, b.shape());
        Tensor cd = Tensor::empty(dev, dt, c0.shape());
        dev.cast(ad, a);
        dev.cast(bd, b);
        dev.cast(cd, c0);
        dev.gemm(cd, ad, ta, bd, tb, 0.5, 2.0);
        Tensor got = Tensor::empty(dev, DType::f64, {M, N});
        dev.cast(got, cd);
        const double* A = a.data_as<double>();
        const double* B = b.data_as<double>();
        for (int64_t i = 0; i < M; ++i) {
          for (int64_t j = 0; j < N; ++j) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k) s += (ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
            const double want = 0.5 * s + 2.0 * c0.data_as<double>()[i * N + j];
            // f32: 19 products of O(1) terms, each rounding ~6e-8 relative: 1e-5 is ample.
            const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
            BOOST_TEST(std::abs(got.data_as<double>()[i * N + j] - want) <= tol * (1 + std::abs(want)));
          }
        }
      }
    }
  }
  Tensor bad = Tensor::empty(dev, DType::f32, {3, 3});
  BOOST_CHECK_THROW(dev.gemm(bad, Tensor::empty(dev, DType::f32, {3, 4}), false,
                             Tensor::empty(dev, DType::f32, {3, 3}), false, 1, 0),
                    std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(sum_squares_is_exact_enough_and_thread_independent) {
  nn::CpuDevice dev(1 << 24);
  Tensor x = test::random_tensor(dev, DType::f32, {100003}, 5);
  double want = 0;
  for (int64_t i = 0; i < x.numel(); ++i) want += static_cast<double>(x.data_as<float>()[i]) * x.data_as<float>()[i];
  const double got = dev.sum_squares(x);
  BOOST_TEST(std::abs(got - want) <= 1e-9 * want);
  nn::CpuDevice one(1 << 24, 1);
  BOOST_TEST(one.sum_squares(x) == got);  // bit-identical with one thread
  nn::CpuDevice restore(1 << 20);        // back to all threads for later tests
}
