// Attention v2 (the mma.sync kernels, device.attention_kernel mma; nn/cuda/attention_mma.cuh)
// on the CPU emulation of the cuda device, whose mma, ldmatrix and cp.async follow the PTX
// ISA's per-lane layouts (testing/emu_mma.h): forward and backward against the f64
// reference (testing/reference_attention.h) at the tolerances the wmma kernels are held to
// (tests/test_backend_ops.cpp), and the choice auto makes. Emulated build only.
#define BOOST_TEST_MODULE attention_mma
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "nn/cuda_device.h"
#include "nn/cuda_kernels.h"
#include "nn/dtype.h"
#include "nn/rng.h"
#include "nn/tensor.h"
#include "testing/emu_cuda_api.h"  // ferry_emu::compute_major, shared_optin
#include "testing/reference_attention.h"

using namespace ferry;
using nn::DType;
using nn::Tensor;

namespace {

// Restores the emulated GPU (block sizes, opt-in shared memory, compute capability).
struct RestoreEmulatedGpu {
  ~RestoreEmulatedGpu() {
    nn::cuda::set_emulated_block_threads(64, 64);
    ferry_emu::shared_optin = ferry_emu::Emulator::kSharedOptin;
    ferry_emu::compute_major = 9;
  }
};

float round_bf16(double v) {
  return nn::bf16_to_f32(nn::f32_to_bf16(static_cast<float>(v)));
}
float round_f16(double v) {
  return nn::f16_to_f32(nn::f32_to_f16(static_cast<float>(v)));
}

struct Shape {
  int64_t B, T, NH, KVH, hs;
  bool docs;
  int64_t W() const { return (NH + 2 * KVH) * hs; }
  int64_t C() const { return NH * hs; }
};

std::string describe(const Shape& sh) {
  return "B=" + std::to_string(sh.B) + " T=" + std::to_string(sh.T) + " NH=" + std::to_string(sh.NH) +
         " KVH=" + std::to_string(sh.KVH) + " hs=" + std::to_string(sh.hs) + (sh.docs ? " documents" : "");
}

// Random inputs rounded to the dtype under test and the f64 reference (the quadratic
// kernels, testing/reference_attention.h). Documents start at random positions (about one
// in 19) and at 64 and 65 (a boundary at a forward tile's edge and one past it).
struct Case {
  Shape sh;
  std::vector<double> qkv, dout, dq0, want_out, want_lse, want_dq;
  std::vector<int32_t> starts;
  const int32_t* docs() const { return sh.docs ? starts.data() : nullptr; }
};

Case make_case(const Shape& sh, uint64_t seed, float (*round)(double)) {
  const int64_t B = sh.B, T = sh.T, NH = sh.NH, KVH = sh.KVH, hs = sh.hs, W = sh.W();
  Case c{sh, {}, {}, {}, {}, {}, {}, std::vector<int32_t>(static_cast<size_t>(B * T), 0)};
  nn::Rng rng(seed);
  c.qkv.resize(static_cast<size_t>(B * T * W));
  c.dout.resize(static_cast<size_t>(B * T * sh.C()));
  c.dq0.resize(c.qkv.size());
  for (double& v : c.qkv) v = round(2 * rng.normal());
  for (double& v : c.dout) v = round(rng.normal());
  for (double& v : c.dq0) v = round(rng.normal());
  for (int64_t b = 0; sh.docs && b < B; ++b) {
    int32_t cur = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (t > 0 && (rng.below(19) == 0 || t == 64 || t == 65)) cur = static_cast<int32_t>(t);
      c.starts[static_cast<size_t>(b * T + t)] = cur;
    }
  }
  std::vector<double> att(static_cast<size_t>(B * NH * T * T));
  c.want_out.resize(c.dout.size());
  c.want_dq = c.dq0;
  testing::reference::attention_forward<double>(c.want_out.data(), att.data(), c.qkv.data(), B, T, sh.C(), NH, KVH,
                                                c.docs());
  testing::reference::attention_backward<double>(c.want_dq.data(), c.dout.data(), c.qkv.data(), att.data(), B, T,
                                                 sh.C(), NH, KVH);
  // lse: log-sum-exp of each row's visible scaled scores.
  c.want_lse.assign(static_cast<size_t>(B * NH * T), 0.0);
  const int64_t group = NH / KVH;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t kv = h / group, j0 = c.docs() ? c.starts[static_cast<size_t>(b * T + i)] : 0;
        std::vector<double> sc;
        double mx = -INFINITY;
        for (int64_t j = j0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hs; ++d)
            dot += c.qkv[static_cast<size_t>((b * T + i) * W + h * hs + d)] *
                   c.qkv[static_cast<size_t>((b * T + j) * W + (NH + kv) * hs + d)];
          sc.push_back(dot / std::sqrt(static_cast<double>(hs)));
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (double x : sc) sum += std::exp(x - mx);
        c.want_lse[static_cast<size_t>((b * NH + h) * T + i)] = mx + std::log(sum);
      }
  return c;
}

Tensor upload(nn::Device& d, DType t, const std::vector<double>& v, nn::Shape shape) {
  const Tensor x = Tensor::empty(d, t, shape);
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    bits[i] = t == DType::bf16 ? nn::f32_to_bf16(static_cast<float>(v[i])) : nn::f32_to_f16(static_cast<float>(v[i]));
  d.copy_from_host(x, bits.data());
  return x;
}

std::vector<float> download(nn::Device& d, const Tensor& t) {
  std::vector<float> got(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::f32) {
    d.copy_to_host(got.data(), t);
    return got;
  }
  std::vector<uint16_t> bits(got.size());
  d.copy_to_host(bits.data(), t);
  for (size_t i = 0; i < got.size(); ++i)
    got[i] = t.dtype() == DType::bf16 ? nn::bf16_to_f32(bits[i]) : nn::f16_to_f32(bits[i]);
  return got;
}

// test_backend_ops.cpp's tolerances for the 16-bit kernels: beyond the rounding of what is
// stored (`stored` of the value), outputs within `out` of the largest output, gradients
// (added into random dqkv) within `grad` of the largest gradient, lse within `lse` absolute.
struct Tolerance {
  double stored, out, grad, lse;
};
const Tolerance kBf16{std::ldexp(1.0, -8), 4e-3, 2e-2, 1e-4};
const Tolerance kF16{std::ldexp(1.0, -11), 1e-3, 5e-3, 1e-4};

void check(nn::Device& d, DType act, const Case& c, const Tolerance& tol) {
  const Shape& sh = c.sh;
  const Tensor q = upload(d, act, c.qkv, {sh.B, sh.T, sh.W()}), g = upload(d, act, c.dout, {sh.B, sh.T, sh.C()});
  const Tensor dq = upload(d, act, c.dq0, {sh.B, sh.T, sh.W()});
  const Tensor o = Tensor::empty(d, act, {sh.B, sh.T, sh.C()}), lse = Tensor::empty(d, DType::f32, {sh.B, sh.NH, sh.T});
  Tensor docs;
  if (sh.docs) {
    docs = Tensor::empty(d, DType::i32, {sh.B * sh.T});
    d.copy_from_host(docs, c.starts.data());
  }
  d.attention_forward(o, lse, q, sh.NH, sh.KVH, docs);
  d.attention_backward(dq, g, q, o, lse, sh.NH, sh.KVH, docs);
  auto worst = [&](const char* what, const std::vector<float>& got, const std::vector<double>& want, double stored,
                   double scale) {
    double w = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      BOOST_TEST_REQUIRE(std::isfinite(got[i]), what << "[" << i << "] is " << got[i]);
      const double excess = std::max(0.0, std::abs(got[i] - want[i]) - stored * std::abs(want[i]));
      w = std::max(w, scale > 0 ? excess / scale : excess);
    }
    BOOST_TEST_MESSAGE(nn::dtype_name(act) << " " << describe(sh) << " " << what << ": worst error " << w);
    return w;
  };
  double out_scale = 0, grad_scale = 0;
  for (double v : c.want_out) out_scale = std::max(out_scale, std::abs(v));
  for (size_t i = 0; i < c.want_dq.size(); ++i) grad_scale = std::max(grad_scale, std::abs(c.want_dq[i] - c.dq0[i]));
  BOOST_TEST(worst("out", download(d, o), c.want_out, tol.stored, out_scale) < tol.out);
  BOOST_TEST(worst("lse", download(d, lse), c.want_lse, 0, 0) < tol.lse);
  BOOST_TEST(worst("dqkv", download(d, dq), c.want_dq, tol.stored, grad_scale) < tol.grad);
}

}  // namespace

// The mma kernels in bf16 and f16 at head sizes 64 and 128: T of one position, T below a
// tile, T not a multiple of any tile and over several tiles, grouped-query heads (3 query
// heads on one key/value head), documents with boundaries inside and at a tile's edge; at
// the emulation's 2 warps per block and the GPU's 4.
BOOST_AUTO_TEST_CASE(mma_attention_matches_the_reference_in_16_bits) {
  RestoreEmulatedGpu restore;
  const Shape shapes[] = {{1, 1, 1, 1, 64, false},  {2, 37, 3, 1, 64, false}, {1, 150, 4, 2, 64, true},
                          {1, 100, 2, 2, 128, true}, {1, 33, 3, 1, 128, false}};
  auto d = nn::make_cuda_device(size_t{1} << 28, 0, nn::AttentionKernel::mma);
  for (const DType act : {DType::bf16, DType::f16}) {
    for (const Shape& sh : shapes) {
      const Case c = make_case(sh, static_cast<uint64_t>(sh.T * 7 + sh.hs), act == DType::bf16 ? round_bf16 : round_f16);
      for (const int threads : {64, 128}) {
        nn::cuda::set_emulated_block_threads(64, threads);
        BOOST_TEST_CONTEXT(nn::dtype_name(act) << " " << threads << " threads " << describe(sh)) {
          check(*d, act, c, act == DType::bf16 ? kBf16 : kF16);
        }
      }
    }
  }
}

// A pass whose shared memory does not fit at 4 warps runs with fewer: at a 48 KiB opt-in
// limit the dK/dV pass at head size 64 takes 2 warps, and the results stay right; at head
// size 128 not even one warp of the forward fits, and auto steps aside to the wmma kernels
// (which refuse too: 48 KiB is below their dK/dV pass's need) and then to SIMT.
BOOST_AUTO_TEST_CASE(mma_passes_shrink_their_blocks_to_the_gpus_shared_memory) {
  RestoreEmulatedGpu restore;
  nn::cuda::set_emulated_block_threads(64, 128);
  ferry_emu::shared_optin = 48 * 1024;
  auto d = nn::make_cuda_device(size_t{1} << 28, 0, nn::AttentionKernel::mma);
  const Case c = make_case({1, 90, 2, 1, 64, false}, 11, round_bf16);
  check(*d, DType::bf16, c, kBf16);
  std::string why;
  BOOST_TEST(nn::cuda_attention_kernel(*d, DType::bf16, 128, &why) == "simt");
  BOOST_TEST(why == "mma needs more shared memory per block than this GPU has");
}

// auto: mma where it can run, else the wmma kernels, else SIMT, and *why says what the
// faster kernels need; mma asked where it cannot run is refused before anything runs,
// naming the op and what is missing.
BOOST_AUTO_TEST_CASE(auto_picks_mma_where_it_can_run_and_mma_is_refused_elsewhere) {
  RestoreEmulatedGpu restore;
  auto automatic = nn::make_cuda_device(size_t{1} << 26, 0, nn::AttentionKernel::automatic);
  auto mma = nn::make_cuda_device(size_t{1} << 26, 0, nn::AttentionKernel::mma);
  std::string why;
  BOOST_TEST(nn::cuda_attention_kernel(*automatic, DType::bf16, 64, &why) == "mma");
  BOOST_TEST(why.empty());
  BOOST_TEST(nn::cuda_attention_kernel(*automatic, DType::f16, 128, &why) == "mma");
  BOOST_TEST(nn::cuda_attention_kernel(*automatic, DType::bf16, 72, &why) == "tensor_cores");
  BOOST_TEST(why == "mma needs a head size of 64 or 128");
  BOOST_TEST(nn::cuda_attention_kernel(*automatic, DType::f32, 64, &why) == "simt");
  BOOST_TEST(why == "tensor cores need bf16 or f16 activations");
  BOOST_TEST(nn::cuda_attention_kernel(*mma, DType::bf16, 96, &why) == "tensor_cores");
  BOOST_TEST(why == "mma needs a head size of 64 or 128");
  // The refusal, before anything is launched: out and lse keep what they held.
  constexpr int64_t B = 1, T = 5, NH = 2, KVH = 1, hs = 32, W = (NH + 2 * KVH) * hs, C = NH * hs;
  const Tensor q = Tensor::empty(*mma, DType::bf16, {B, T, W}), o = Tensor::empty(*mma, DType::bf16, {B, T, C});
  const Tensor lse = Tensor::empty(*mma, DType::f32, {B, NH, T});
  mma->fill(q, 0.5);
  mma->fill(o, 2.0);
  BOOST_CHECK_EXCEPTION(mma->attention_forward(o, lse, q, NH, KVH), std::invalid_argument, [](const auto& e) {
    const std::string m = e.what();
    BOOST_TEST_MESSAGE(m);
    return m.find("attention_forward: device.attention_kernel is mma, which needs a head size of 64 or 128") !=
           std::string::npos;
  });
  for (float v : download(*mma, o)) BOOST_TEST(v == 2.0f);
  ferry_emu::compute_major = 7;  // a V100: no bf16 mma
  auto old_gpu = nn::make_cuda_device(size_t{1} << 26, 0, nn::AttentionKernel::automatic);
  BOOST_TEST(nn::cuda_attention_kernel(*old_gpu, DType::bf16, 64, &why) == "simt");
  BOOST_TEST(why == "tensor cores need a GPU of compute capability 8.0 or above");
}
