// QLoRA's NF4 base on the devices (nn/nf4_blob.h, DeviceOps::nf4_dequantize, nn/nf4_matmul.h,
// nn/linear.h with Linear::nf4):
// - a blob holds nf4_quantize's state exactly, and any rectangle dequantizes to the values
//   nf4_dequantize gives there;
// - every device's nf4_dequantize gives those values rounded once to the panel's dtype, bit
//   for bit (test_nf4_ops_emulated runs the cuda device's kernel on the CPU emulation);
// - the panel products equal a GEMM with the dequantized weight, across panel edges (on
//   the CPU in bf16, multiplied straight from the blobs, bit for bit; on the cuda device
//   fused too, dequantized in the GEMM's operand load, to the GEMM's rounding);
// - a linear layer on an NF4 base cut into pieces (Llama's wqkv: q, k, v each quantized on
//   its own), with bias, GELU and a LoRA adapter, equals the same layer on the dequantized
//   dense weight, forward and backward;
// - its input gradient passes central differences in f64.
#define BOOST_TEST_MODULE nf4_ops
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cuda_precondition.h"
#include "device_values.h"
#include "nn/cpu_device.h"
#include "nn/cuda_device.h"
#include "nn/linear.h"
#include "nn/nf4_blob.h"
#include "nn/nf4_matmul.h"
#include "nn/rng.h"

using namespace ferry;
using nn::DType;
using nn::Tensor;
using test::download;
using test::random_values;
using test::upload;
using test::worst;

namespace {

// A quantized [rows, cols] matrix: its blob bytes and its dequantized float32 values.
struct Quantized {
  nn::Nf4Layout layout;
  std::vector<uint8_t> blob;
  std::vector<float> dense;
};

Quantized quantize(int64_t rows, int64_t cols, bool double_quant, uint64_t seed) {
  const std::vector<float> w = random_values(rows * cols, seed, 0.05);
  const nn::Nf4Tensor q = nn::nf4_quantize(w.data(), rows * cols, double_quant, nullptr, nullptr);
  Quantized out;
  out.layout = nn::nf4_layout(rows, cols, double_quant);
  out.blob.assign(static_cast<size_t>(out.layout.bytes), 0xAB);
  nn::nf4_write_blob(q, out.layout, out.blob.data());
  out.dense.resize(static_cast<size_t>(rows * cols));
  nn::nf4_dequantize(q, out.dense.data());
  return out;
}

// The blob in device memory as raw bytes (a bf16 tensor of half as many elements, as a
// unit's frozen span holds it).
Tensor blob_on(nn::Device& dev, const Quantized& q) {
  const Tensor t = Tensor::empty(dev, DType::bf16, {q.layout.bytes / 2});
  dev.copy_from_host(t, q.blob.data());
  return t;
}

float round_to(DType t, float v) {
  switch (t) {
    case DType::bf16: return nn::bf16_to_f32(nn::f32_to_bf16(v));
    case DType::f16: return nn::f16_to_f32(nn::f32_to_f16(v));
    default: return v;
  }
}

// The CPU device, and where there is one the cuda device twice: with the panels for cuBLAS,
// then with the fused kernel (device.nf4_gemm "fused", nn/cuda/nf4_gemm.cu) where it can run.
std::vector<std::unique_ptr<nn::Device>> devices() {
  std::vector<std::unique_ptr<nn::Device>> d;
  d.push_back(std::make_unique<nn::CpuDevice>(size_t{1} << 30));
  if (nn::cuda_status().available()) {
    d.push_back(nn::make_cuda_device(size_t{1} << 30));
    auto fused = nn::make_cuda_device(size_t{1} << 30);
    const std::string why = nn::set_cuda_nf4_gemm(*fused, true);
    BOOST_TEST_MESSAGE("cuda device.nf4_gemm fused: " << (why.empty() ? "runs" : why));
    if (why.empty()) d.push_back(std::move(fused));
  }
  return d;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_blob_holds_the_state_and_any_rectangle_dequantizes_as_the_whole) {
  for (const bool dq : {true, false}) {
    for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{7, 13}, {60, 88}, {130, 140}, {6, 256}}) {
      const std::vector<float> w = random_values(rows * cols, 7 + rows, 0.1);
      const nn::Nf4Tensor q = nn::nf4_quantize(w.data(), rows * cols, dq, nullptr, nullptr);
      const nn::Nf4Layout l = nn::nf4_layout(rows, cols, dq);
      BOOST_TEST(l.bytes % 16 == 0);
      BOOST_TEST(l.bytes <= nn::nf4_storage_bytes(rows * cols, dq) + (dq ? 1024 + 64 : 32));
      std::vector<uint8_t> blob(static_cast<size_t>(l.bytes));
      nn::nf4_write_blob(q, l, blob.data());
      const nn::Nf4Tensor back = nn::nf4_read_blob(blob.data(), l);
      BOOST_TEST(back.packed == q.packed);
      BOOST_TEST(back.absmax == q.absmax);
      BOOST_TEST(back.absmax_code == q.absmax_code);
      BOOST_TEST(back.nested_absmax == q.nested_absmax);
      BOOST_TEST(back.code == q.code);
      BOOST_TEST(back.offset == q.offset);
      std::vector<float> whole(static_cast<size_t>(rows * cols));
      nn::nf4_dequantize(q, whole.data());
      // Rectangles that start and end inside blocks and on odd elements.
      for (const auto& [r0, R, c0, C] : std::vector<std::array<int64_t, 4>>{
               {0, rows, 0, cols}, {1, rows - 2, 3, cols - 5}, {rows - 1, 1, cols - 1, 1}, {2, 3, 0, cols}}) {
        std::vector<float> rect(static_cast<size_t>(R * C));
        nn::nf4_dequantize_rect(blob.data(), l, r0, R, c0, C, rect.data());
        bool same = true;
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t c = 0; c < C; ++c) {
            same = same && rect[static_cast<size_t>(r * C + c)] == whole[static_cast<size_t>((r0 + r) * cols + c0 + c)];
          }
        }
        BOOST_TEST(same, "rows " << r0 << "+" << R << " cols " << c0 << "+" << C << " dq " << dq);
        // The 16-bit path (whole aligned blocks vectorised): each value rounded once, into a
        // wider row stride whose extra columns stay untouched.
        for (const bool bf16 : {true, false}) {
          const int64_t ld = C + 3;
          std::vector<uint16_t> r16(static_cast<size_t>(R * ld), 0xabcd);
          nn::nf4_dequantize_rect_16(blob.data(), l, r0, R, c0, C, r16.data(), ld, bf16);
          bool same16 = true;
          for (int64_t r = 0; r < R; ++r) {
            for (int64_t c = 0; c < ld; ++c) {
              const float v = rect[static_cast<size_t>(r * C + std::min(c, C - 1))];
              const uint16_t want = c >= C ? 0xabcd : bf16 ? nn::f32_to_bf16(v) : nn::f32_to_f16(v);
              same16 = same16 && r16[static_cast<size_t>(r * ld + c)] == want;
            }
          }
          BOOST_TEST(same16, "16-bit rows " << r0 << "+" << R << " cols " << c0 << "+" << C << " bf16 " << bf16);
        }
      }
      BOOST_CHECK_THROW(nn::nf4_dequantize_rect(blob.data(), l, 0, rows + 1, 0, 1, whole.data()), std::invalid_argument);
      nn::Nf4Layout other = l;
      other.double_quant = !dq;
      BOOST_CHECK_THROW(nn::nf4_write_blob(q, other, blob.data()), std::invalid_argument);
    }
  }
}

BOOST_AUTO_TEST_CASE(every_device_dequantizes_bit_for_bit) {
  for (auto& dev : devices()) {
    for (const bool dq : {true, false}) {
      const Quantized q = quantize(130, 140, dq, 3);
      const Tensor blob = blob_on(*dev, q);
      for (const DType t : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
        const int64_t r0 = 5, c0 = 3, R = 101, C = 131;
        const Tensor panel = Tensor::empty(*dev, t, {R, C});
        dev->nf4_dequantize(panel, blob, q.layout, r0, c0);
        const Tensor wide = Tensor::empty(*dev, DType::f64, {R, C});
        dev->cast(wide, panel);
        std::vector<double> got(static_cast<size_t>(R * C));
        dev->copy_to_host(got.data(), wide);
        int64_t differ = 0;
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t c = 0; c < C; ++c) {
            const float want = round_to(t, q.dense[static_cast<size_t>((r0 + r) * 140 + c0 + c)]);
            differ += got[static_cast<size_t>(r * C + c)] != double{want};
          }
        }
        BOOST_TEST(differ == 0, dev->name() << " " << nn::dtype_name(t) << " dq " << dq);
      }
      // A rectangle past the matrix and a blob too short are refused, naming the op.
      const Tensor panel = Tensor::empty(*dev, DType::f32, {4, 4});
      BOOST_CHECK_THROW(dev->nf4_dequantize(panel, blob, q.layout, 127, 0), std::invalid_argument);
      BOOST_CHECK_THROW(dev->nf4_dequantize(panel, blob.view(0, {16}), q.layout, 0, 0), std::invalid_argument);
    }
  }
}

// A [70, 150] weight of three pieces (rows 30, 25, 15, each quantized on its own, as q, k, v
// of a packed projection), multiplied with panels that cross the pieces' edges.
BOOST_AUTO_TEST_CASE(panel_products_equal_a_gemm_with_the_dequantized_weight) {
  const int64_t N = 9, rows = 70, cols = 150;
  const std::vector<int64_t> piece_rows = {30, 25, 15};
  std::vector<Quantized> qs;
  std::vector<float> whole;
  for (size_t k = 0; k < piece_rows.size(); ++k) {
    qs.push_back(quantize(piece_rows[k], cols, true, 11 + k));
    whole.insert(whole.end(), qs.back().dense.begin(), qs.back().dense.end());
  }
  for (auto& dev : devices()) {
    for (const DType t : {DType::f32, DType::bf16}) {
      std::vector<nn::Nf4Weight> w;
      for (size_t k = 0, row = 0; k < qs.size(); row += static_cast<size_t>(piece_rows[k]), ++k) {
        w.push_back({blob_on(*dev, qs[k]), qs[k].layout, static_cast<int64_t>(row)});
      }
      std::vector<float> dense(whole.size());
      for (size_t i = 0; i < dense.size(); ++i) dense[i] = round_to(t, whole[i]);
      const Tensor W = upload(*dev, t, {rows, cols}, dense);
      // The CPU device multiplies bf16 straight from the blobs (DeviceOps::nf4_gemm) with
      // the same kernel and per-element arithmetic as the dense GEMM: the same bits.
      const bool direct = dev->kind() == nn::DeviceKind::cpu && nn::CpuDevice::nf4_gemm_direct(t, t);
      const double tol = direct ? 0.0 : t == DType::f32 ? 1e-6 : 1e-2;
      // Forward into columns [5, 75) of a wider y, with beta 0 and 1, panels of 7 rows (and
      // one of 1), and of the whole.
      for (const int64_t max_panel : {int64_t{7} * cols, int64_t{1}, int64_t{26} * cols, nn::kNf4PanelElements}) {
        const Tensor x = upload(*dev, t, {N, cols}, random_values(N * cols, 5, 1.0));
        const std::vector<float> y0 = random_values(N * 80, 6, 1.0);
        for (const double beta : {0.0, 1.0}) {
          const Tensor y = upload(*dev, t, {N, 80}, y0), want = upload(*dev, t, {N, 80}, y0);
          nn::nf4_matmul_nt(*dev, y, 5, x, w, beta, max_panel);
          dev->gemm_cols(want, 5, rows, x, 0, cols, false, W, true, 1.0, beta);
          BOOST_TEST(worst(download(*dev, y), download(*dev, want)) <= tol,
                     dev->name() << " nt " << nn::dtype_name(t) << " panel " << max_panel << " beta " << beta);
        }
        // Backward: dx [N, cols] from columns [2, 72) of a wider dy.
        const Tensor dy = upload(*dev, t, {N, 90}, random_values(N * 90, 8, 1.0));
        const std::vector<float> dx0 = random_values(N * cols, 9, 1.0);
        for (const double beta : {0.0, 1.0}) {
          const Tensor dx = upload(*dev, t, {N, cols}, dx0), want = upload(*dev, t, {N, cols}, dx0);
          nn::nf4_matmul_nn(*dev, dx, dy, 2, w, beta, max_panel);
          dev->gemm_cols(want, 0, cols, dy, 2, rows, false, W, false, 1.0, beta);
          BOOST_TEST(worst(download(*dev, dx), download(*dev, want)) <= tol,
                     dev->name() << " nn " << nn::dtype_name(t) << " panel " << max_panel << " beta " << beta);
        }
      }
      // Pieces that leave a gap, or disagree on the row length, are refused.
      std::vector<nn::Nf4Weight> gap = {w[0], w[2]};
      const Tensor y = Tensor::empty(*dev, t, {N, 80}), x = Tensor::empty(*dev, t, {N, cols});
      BOOST_CHECK_THROW(nn::nf4_matmul_nt(*dev, y, 0, x, gap, 0.0), std::invalid_argument);
      // Straight to the device: one that multiplies from the blobs refuses them itself (its
      // kernels find a row's piece by their order); one without that path answers false.
      bool took = false;
      try {
        took = dev->nf4_gemm(y, 0, x, 0, gap, true, 0.0);
      } catch (const std::invalid_argument& e) {
        BOOST_TEST(std::string(e.what()).find("in order") != std::string::npos, e.what());
      }
      BOOST_TEST(!took);
    }
  }
}

namespace {

// A Llama-style packed projection of three pieces (rows 24, 8, 8) over in = 96, each piece
// quantized on its own; a bias; a LoRA adapter (r 4) on the middle piece.
struct PackedLayer {
  static constexpr int64_t in = 96, out = 40, r = 4;
  std::vector<Quantized> pieces;
  std::vector<int64_t> row0 = {0, 24, 32};
  std::vector<float> dense, bias, a, b;
  PackedLayer() {
    const int64_t rows[] = {24, 8, 8};
    for (int k = 0; k < 3; ++k) {
      pieces.push_back(quantize(rows[k], in, true, 20 + static_cast<uint64_t>(k)));
      dense.insert(dense.end(), pieces.back().dense.begin(), pieces.back().dense.end());
    }
    bias = random_values(out, 30, 0.1);
    a = random_values(r * in, 31, 0.1);
    b = random_values(8 * r, 32, 0.1);
  }
  // The layer on `dev` in dtype t: NF4 pieces (quantized) or the dense dequantized weight.
  nn::Linear make(nn::Device& dev, DType t, bool quantized, std::vector<Tensor>& keep) const {
    nn::Linear l;
    if (quantized) {
      for (size_t k = 0; k < pieces.size(); ++k) {
        keep.push_back(blob_on(dev, pieces[k]));
        l.nf4.push_back({keep.back(), pieces[k].layout, row0[k]});
      }
    } else {
      std::vector<float> d(dense.size());
      for (size_t i = 0; i < d.size(); ++i) d[i] = round_to(t, dense[i]);
      l.w = upload(dev, t, {out, in}, d);
    }
    l.b = upload(dev, t, {out}, bias);
    l.db = upload(dev, t, {out}, std::vector<float>(out, 0.0f));
    nn::LoraPair p;
    p.a = upload(dev, t, {r, in}, a);
    p.b = upload(dev, t, {8, r}, b);
    p.da = upload(dev, t, {r, in}, std::vector<float>(r * in, 0.0f));
    p.db = upload(dev, t, {8, r}, std::vector<float>(8 * r, 0.0f));
    p.row0 = 24;
    p.rows = 8;
    p.scale = 2.0;
    l.lora.push_back(p);
    return l;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_linear_layer_on_nf4_pieces_equals_the_dequantized_dense_layer) {
  const PackedLayer layer;
  const int64_t N = 11;
  for (auto& dev : devices()) {
    for (const DType t : {DType::f32, DType::bf16}) {
      const double tol = t == DType::f32 ? 1e-5 : 2e-2;
      std::vector<std::vector<float>> results[2];
      for (const bool quantized : {true, false}) {
        std::vector<Tensor> keep;
        const nn::Linear l = layer.make(*dev, t, quantized, keep);
        const Tensor x = upload(*dev, t, {N, PackedLayer::in}, random_values(N * PackedLayer::in, 40, 1.0));
        const Tensor y = Tensor::empty(*dev, t, {N, PackedLayer::out});
        const Tensor pre = Tensor::empty(*dev, t, {N, PackedLayer::out});
        nn::linear_forward(*dev, l, y, x, pre);
        const Tensor dy = upload(*dev, t, {N, PackedLayer::out}, random_values(N * PackedLayer::out, 41, 1.0));
        const Tensor dx = Tensor::empty(*dev, t, {N, PackedLayer::in});
        nn::linear_backward(*dev, l, dx, dy, x);
        auto& r = results[quantized ? 0 : 1];
        for (const Tensor& v : {y, pre, dx, l.db, l.lora[0].da, l.lora[0].db}) r.push_back(download(*dev, v));
      }
      const char* names[] = {"y", "pre", "dx", "db", "lora da", "lora db"};
      for (size_t k = 0; k < results[0].size(); ++k) {
        BOOST_TEST(worst(results[0][k], results[1][k]) <= tol, dev->name() << " " << nn::dtype_name(t) << " " << names[k]);
      }
    }
  }
}

// dx of the NF4 layer (f64, the CPU device) against central differences of <y, g> in x.
BOOST_AUTO_TEST_CASE(the_input_gradient_passes_central_differences) {
  const PackedLayer layer;
  nn::CpuDevice dev(size_t{1} << 28);
  const int64_t N = 3, in = PackedLayer::in, out = PackedLayer::out;
  std::vector<Tensor> keep;
  const nn::Linear l = layer.make(dev, DType::f64, true, keep);
  const std::vector<float> xs = random_values(N * in, 50, 1.0), gs = random_values(N * out, 51, 1.0);
  auto loss = [&](const std::vector<float>& xv) {
    const Tensor x = upload(dev, DType::f64, {N, in}, xv);
    const Tensor y = Tensor::empty(dev, DType::f64, {N, out});
    nn::linear_forward(dev, l, y, x);
    const std::vector<float> yv = download(dev, y);
    double s = 0;
    for (size_t i = 0; i < yv.size(); ++i) s += double{yv[i]} * gs[i];
    return s;
  };
  const Tensor dx = Tensor::empty(dev, DType::f64, {N, in});
  nn::linear_backward(dev, l, dx, upload(dev, DType::f64, {N, out}, gs), upload(dev, DType::f64, {N, in}, xs));
  const std::vector<float> grad = download(dev, dx);
  double worst_err = 0;
  for (size_t i = 0; i < xs.size(); i += 7) {
    std::vector<float> plus = xs, minus = xs;
    const float h = 0.25f;  // a linear map: exact up to rounding at any step
    plus[i] += h;
    minus[i] -= h;
    const double fd = (loss(plus) - loss(minus)) / (2.0 * h);
    worst_err = std::max(worst_err, std::abs(fd - grad[i]) / std::max(1.0, std::abs(fd)));
  }
  BOOST_TEST(worst_err <= 1e-5);
}
