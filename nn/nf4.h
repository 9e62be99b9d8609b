// NF4: bitsandbytes' 4-bit NormalFloat quantization with optional double quantization, the
// storage of a QLoRA base weight (issue 40). The format and every rounding are those of
// bitsandbytes 0.50.2 on the CPU, as tests/data/peft/README.md section (h) states them and
// scripts/peft_fixtures/make_nf4_fixtures.py transcribes them (tests/data/nf4/ holds the
// fixtures; tests/test_nf4.cpp checks them bit for bit).
//
// Layout. The tensor is flattened row-major (an nn.Linear weight [out, in] as stored) and cut
// into blocks of 64 that run across rows; the last block may be shorter. Each element is the
// 4-bit index of an entry of kNf4Table, two per byte, element 2k in the HIGH nibble of byte k
// and 2k+1 in the low one; an odd count pads the last low nibble with 7 (the index of 0.0).
// Each block has a scale, its absmax (max |x| over its own elements), kept either
//  - as float32 (no double quantization), or
//  - double quantized: offset = the float32 mean of all absmaxes (one per tensor), and
//    absmax - offset quantized to 8 bits with bitsandbytes' "dynamic" code (256 float32
//    values, nf4_dynamic_code()) in nested blocks of 256 absmaxes, each with a float32
//    scale (nested_absmax).
// Dequantization, float32 with separate roundings (a multiply, then an add; never fused):
//     scale[b] = code[absmax_code[b]] * nested_absmax[b / 256] + offset   (or absmax[b])
//     w[i]     = kNf4Table[nibble(i)] * scale[i / 64]
//
// What is bit-exact with bitsandbytes 0.50.2 (CPU):
//  - the packed bytes and the float32 absmax: always (they depend on x alone);
//  - the 8-bit absmax codes and nested_absmax: given bitsandbytes' offset and code. The
//    offset is torch's float32 mean, whose rounding depends on torch's CPU kernel (it is not
//    the correctly rounded mean: fixture w60x88's is 1 ulp below). nf4_torch_mean()
//    transcribes aten's cascade sum for 8-float vectors (what the fixtures' AVX512 machine
//    ran); it reproduced every fixture offset, but another torch build, CPU or CUDA may
//    round differently, so code that must match a bitsandbytes state takes its stored offset
//    (quant_state "nested_offset", a float32 written as a round-tripping double) through
//    `offset_override`. nf4_dynamic_code() transcribes create_dynamic_map() including
//    torch.linspace's rounding and equals bitsandbytes' stored table bit for bit; pass the
//    stored `nested_quant_map` through `code_override` to be independent of that;
//  - the 8-bit code index is bitsandbytes' CPU rule (a 65536-entry lookup table), which is
//    the nearest code except within about 1.5e-5 of a midpoint: 2 of the 1161 absmax codes
//    of tests/data/nf4/llama3-nf4 are such, and bitsandbytes stored the lookup's code for
//    both. Its CUDA kernel and pure-torch path take the exact nearest code, so a state made
//    there may differ in such a code (dequantization of any given state is the same);
//  - dequantization of any state: always.
// Not covered by bitsandbytes' fixtures and decided here: an all-zero block has absmax 0 and
// dequantizes to zeros (scaling uses max(absmax, 1e-38), as bitsandbytes does; a short last
// block stores that clamped value, as bitsandbytes' transcription does); absmaxes all equal
// to the offset (one block) give nested_absmax 0 and codes 0, so the scale is the offset;
// an empty tensor has no blocks and offset 0.
//
// Errors: std::invalid_argument for arguments that make no sense (negative counts, null
// pointers with a nonzero count, NaN or infinite inputs, a non-finite offset, an unsorted
// or non-finite code, a range outside the tensor, a state whose sizes disagree).
// Threads: pure functions of their arguments; concurrent calls on one const Nf4Tensor are
// safe. No device: callers copy the state where they need it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry::nn {

inline constexpr int64_t kNf4BlockSize = 64;         // elements per absmax
inline constexpr int64_t kNf4NestedBlockSize = 256;  // absmaxes per nested_absmax

// bitsandbytes' get_4bit_type("nf4"), index order (float32).
// clang-format off
inline constexpr std::array<float, 16> kNf4Table = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};
// clang-format on

// One quantized tensor. Plain data: fields are public so that a loader can fill them from a
// file (transformers' `weight`, `.absmax`, `.nested_absmax`, `.nested_quant_map` and the
// quant_state's "nested_offset"); nf4_check() says whether they agree.
struct Nf4Tensor {
  int64_t numel = 0;
  std::vector<uint8_t> packed;  // (numel + 1) / 2 bytes
  bool double_quant = false;
  // Without double quantization: the float32 absmax, one per block. Empty otherwise.
  std::vector<float> absmax;
  // With double quantization (all empty, offset 0, otherwise):
  std::vector<uint8_t> absmax_code;  // one per block, an index into `code`
  std::vector<float> nested_absmax;  // one per 256 blocks
  float offset = 0.0f;
  std::vector<float> code;  // 256 values, ascending (bitsandbytes' nested_quant_map)

  int64_t blocks() const { return (numel + kNf4BlockSize - 1) / kNf4BlockSize; }
};

// Quantizes x[0, n). `double_quant` false: plain float32 absmax; the two overrides must
// then be null. `offset_override` (nullable): the offset to centre the absmaxes on instead
// of nf4_torch_mean() of them. `code_override` (nullable, 256 ascending finite floats): the
// 8-bit code instead of nf4_dynamic_code(). n == 0 gives an empty tensor.
Nf4Tensor nf4_quantize(const float* x, int64_t n, bool double_quant, const float* offset_override,
                       const float* code_override);

// Throws std::invalid_argument unless q's sizes agree with q.numel and its floats (absmax,
// nested_absmax, code, offset) are finite. nf4_dequantize calls it; nf4_block_scale and
// nf4_dequantize_range check the sizes only (O(1), for calls per tile): call nf4_check once
// on a state filled from a file. (Dequantization needs no ascending code; quantization does.)
void nf4_check(const Nf4Tensor& q);

// The scale of block b (0 <= b < q.blocks()): absmax[b], or its double-quantized value
// (bitsandbytes' dequantize_blockwise(absmax, state2) + offset).
float nf4_block_scale(const Nf4Tensor& q, int64_t b);

// A double-quantized block's scale from its 8-bit code's value, its nested absmax and the
// tensor's offset: code * nested + offset with bitsandbytes' two float32 roundings (never
// an FMA). nf4_block_scale and nn/nf4_blob.h's rectangles both use it.
float nf4_double_quant_scale(float code, float nested_absmax, float offset);

// out[0, q.numel) = the dequantized tensor.
void nf4_dequantize(const Nf4Tensor& q, float* out);
// out[0, n) = elements [begin, begin + n) of the dequantized tensor, bit for bit what
// nf4_dequantize gives there; any range inside [0, numel) (a GEMM tile's rows, a shard).
void nf4_dequantize_range(const Nf4Tensor& q, int64_t begin, int64_t n, float* out);

// bitsandbytes' create_dynamic_map() (signed, 7 exponent bits, 8 bits): the default code
// of the double quantization, transcribed with torch.linspace's float32 rounding.
const std::array<float, 256>& nf4_dynamic_code();

// torch.mean of a contiguous 1-D float32 CPU tensor as torch's single-threaded cascade sum
// over vectors of 8 floats computes it (see the contract above on when it matches). n > 0.
float nf4_torch_mean(const float* x, int64_t n);

// Storage per parameter, asymptotically: 4 bits plus the block scales (0.5625 bytes plain,
// 0.515869140625 double quantized: 4 + 8/64 + 32/(64*256) bits).
double nf4_bytes_per_parameter(bool double_quant);
// The bytes a tensor of n values holds: packed + per-block scales + nested scales + the
// offset (4); not the 256-entry code (1 KiB, the same for every tensor).
int64_t nf4_storage_bytes(int64_t n, bool double_quant);

}  // namespace ferry::nn
