#!/usr/bin/env python3
"""Generate the bitsandbytes NF4 fixtures under tests/data/nf4/.

  nf4.safetensors: three float32 tensors ([60, 88]: 5280 values = 82.5 blocks of 64;
      [7, 13]: 91 values, odd; [130, 140]: 285 blocks, two nested blocks) quantized on the CPU by bitsandbytes' own
      `quantize_4bit(t, blocksize=64, quant_type="nf4", compress_statistics=True)` and
      dequantized by its `dequantize_4bit`, with every part of the quantization state; and the
      same without double quantization (compress_statistics=False).
  llama3-nf4/: tests/data/hf/llama3 loaded with transformers'
      BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
      bnb_4bit_use_double_quant=True) on the CPU and written with save_pretrained, plus
      expected.safetensors (logits of that model and of the float32 model holding the
      dequantized weights).

Every bitsandbytes result is also recomputed by an independent numpy transcription of
bitsandbytes' algorithm (functions `np_*` below, citing the source they follow); the script
fails if any byte or float differs. See scripts/peft_fixtures/README.md to re-run it.

Deterministic: fixed seeds, single thread, no timestamps.
"""

import os

# bitsandbytes' pure-torch fallbacks (used e.g. to dequantize a tensor whose last dimension
# is odd) are wrapped in torch.compile, which would build C++ kernels with a compiler on first
# use. Run them eagerly: same float32 operations, no compiler.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
from fractions import Fraction  # noqa: E402
from pathlib import Path  # noqa: E402

import bitsandbytes  # noqa: E402
import bitsandbytes.functional as bnbF  # noqa: E402
import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "data" / "nf4"
BASE = "tests/data/hf/llama3"
VOCAB = 300
BLOCK = 64          # 4-bit blocksize
NESTED_BLOCK = 256  # blocksize of the 8-bit quantization of the absmax (fixed in bitsandbytes)

CASES = [  # name, shape, seed; values normal(0, 0.1)
    ("w60x88", (60, 88), 3001),
    ("w7x13", (7, 13), 3002),
    ("w130x140", (130, 140), 3003),  # 18200 values: 285 blocks, so 2 nested blocks of 256
]

f32 = np.float32


# ------------------------------------------------------------------------------------------
# numpy transcription of bitsandbytes 0.50.x (CPU path). Source files are those of the
# bitsandbytes repository (bitsandbytes-foundation/bitsandbytes).

# bitsandbytes/functional.py, get_4bit_type("nf4"): the 16 NF4 values (also
# bitsandbytes/backends/utils.py _NF4_QUANT_TABLE and csrc/cpu_ops.cpp nf4_lut).
NF4 = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=f32)


def np_fma_f32(a, b, c):
    """a * b + c rounded once to float32 (a fused multiply-add), computed exactly."""
    return f32(float(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))))


def np_linspace_f32(start, end, steps):
    """torch.linspace(start, end, steps, dtype=float32) on the CPU (aten
    RangeFactoriesKernel.cpp): step = (end - start) / (steps - 1) in float32; element i is
    start + i*step for i < steps/2 and end - (steps - 1 - i)*step after, each evaluated as a
    fused multiply-add (one rounding), as torch's vectorized AVX2/AVX512 kernel does. (With
    two roundings, 64 of the 256 dynamic-code values come out 1 ulp away.)"""
    start, end = f32(start), f32(end)
    step = f32((end - start) / f32(steps - 1))
    half = steps // 2
    out = np.empty(steps, dtype=f32)
    for i in range(steps):
        out[i] = (np_fma_f32(step, i, start) if i < half
                  else np_fma_f32(-step, steps - 1 - i, end))
    return out


def np_create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    """bitsandbytes/functional.py create_dynamic_map(): the 256-value 8-bit 'dynamic' code
    used for the absmax in double quantization (its defaults: signed, 7 exponent bits)."""
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                             else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        b = np_linspace_f32(0.1, 1, fraction_items)
        means = (b[:-1] + b[1:]) / f32(2.0)                   # float32 tensor ops
        # A Python number times a float32 tensor: the number is cast to float32 first.
        scale = f32(10 ** (-(max_exponent_bits - 1) + i))
        data += (scale * means).astype(f32).tolist()
        if signed:
            data += ((-scale) * means).astype(f32).tolist()
    assert additional_items == 0  # (the default has none)
    data.append(0)
    data.append(1.0)
    assert len(data) == 2 ** total_bits
    data.sort()
    return np.array(data, dtype=np.float64).astype(f32)   # torch.tensor(list, float32)


def np_quantize_4bit(x, blocksize=BLOCK):
    """bitsandbytes/backends/default/ops.py, kernel "bitsandbytes::quantize_4bit" "default"
    (the CPU uses it: backends/cpu/ops.py registers no quantize_4bit). The tensor is
    flattened row-major and cut into blocks of `blocksize` (the last one shorter); absmax =
    max|x| per block; full blocks are scaled by x * (1/absmax) (a float32 reciprocal), the
    short tail block by x / absmax; clamped to [-1, 1]; each value takes the index of the
    nearest NF4 value via torch.bucketize on the float32 midpoints (a value exactly on a
    midpoint takes the lower index); an odd count is padded with a scaled 0 (index 7); two
    indices per byte, the first element in the HIGH nibble: (q[2i] << 4) | q[2i+1]."""
    a = np.asarray(x, dtype=f32).reshape(-1)
    n = a.size
    rem = n % blocksize
    full = n - rem
    blocks = a[:full].reshape(-1, blocksize)
    absmax = np.abs(blocks).max(axis=1).astype(f32)
    inv = (f32(1.0) / np.maximum(absmax, f32(1e-38))).astype(f32)
    scaled = np.clip(blocks * inv[:, None], f32(-1), f32(1)).reshape(-1)
    if rem:
        am = np.maximum(np.abs(a[full:]).max(), f32(1e-38)).astype(f32)
        absmax = np.concatenate([absmax, [am]]).astype(f32)
        scaled = np.concatenate([scaled, np.clip(a[full:] / am, f32(-1), f32(1))])
    if scaled.size % 2:
        scaled = np.concatenate([scaled, [f32(0)]])
    bounds = ((NF4[:-1] + NF4[1:]) / f32(2)).astype(f32)
    q = np.searchsorted(bounds, scaled.astype(f32), side="left").astype(np.uint8)
    packed = ((q[0::2] << 4) | q[1::2]).astype(np.uint8)
    return packed.reshape(-1, 1), absmax


def np_quantize_8bit_cpu(x, code, blocksize=NESTED_BLOCK):
    """csrc/cpu_ops.cpp quantize_cpu_impl<float> (the CPU kernel bitsandbytes'
    quantize_blockwise calls for float32; backends/cpu/ops.py): per block absmax = max|x|
    (0 -> all codes 0); each value v -> clamp(v * (1.0f/absmax), -1, 1) -> LUT index
    (uint16)((v + 1) * 0.5 * 65535 + 0.5) into a 65536-entry table whose entry i holds the
    number of code midpoints 0.5*(code[j]+code[j+1]) below -1 + 2i/65535 (build_quantize_lut).
    This is the nearest code except within ~1.5e-5 of a midpoint."""
    a = np.asarray(x, dtype=f32).reshape(-1)
    mid = (f32(0.5) * (code[:-1] + code[1:])).astype(f32)
    lut_val = (f32(-1.0) + (f32(2.0) * np.arange(65536, dtype=f32)) / f32(65535)).astype(f32)
    lut = np.searchsorted(mid, lut_val, side="left").astype(np.uint8)
    out = np.zeros(a.size, dtype=np.uint8)
    absmax = []
    for s in range(0, a.size, blocksize):
        blk = a[s:s + blocksize]
        am = f32(np.abs(blk).max())
        absmax.append(am)
        if am == 0:
            continue
        inv = f32(f32(1.0) / am)
        v = np.clip((blk * inv).astype(f32), f32(-1), f32(1))
        idx = ((v + f32(1)) * f32(0.5) * f32(65535) + f32(0.5)).astype(f32).astype(np.uint16)
        out[s:s + blocksize] = lut[idx]
    return out, np.array(absmax, dtype=f32)


def np_quantize_8bit_nearest(x, code, blocksize=NESTED_BLOCK):
    """bitsandbytes/backends/default/ops.py "bitsandbytes::quantize_blockwise" "default":
    the exact nearest code (bucketize on midpoints), as the CUDA kernel's binary search."""
    a = np.asarray(x, dtype=f32).reshape(-1)
    out = np.zeros(a.size, dtype=np.uint8)
    bounds = ((code[:-1] + code[1:]) / f32(2)).astype(f32)
    for s in range(0, a.size, blocksize):
        blk = a[s:s + blocksize]
        am = f32(max(np.abs(blk).max(), f32(1e-38)))
        v = np.clip((blk * f32(f32(1.0) / am)).astype(f32), f32(-1), f32(1))
        out[s:s + blocksize] = np.searchsorted(bounds, v, side="left")
    return out


def _np_multi_row_sum(rows):
    """aten/src/ATen/native/cpu/SumKernel.cpp multi_row_sum (4 levels): rows [size, ...]."""
    size = rows.shape[0]
    num_levels = 4
    ceil_log2 = 1 if size <= 2 else int(size - 1).bit_length()
    level_power = max(4, ceil_log2 // num_levels)
    level_step = 1 << level_power
    level_mask = level_step - 1
    acc = np.zeros((num_levels,) + rows.shape[1:], dtype=f32)
    i = 0
    while i + level_step <= size:
        for _ in range(level_step):
            acc[0] = (acc[0] + rows[i]).astype(f32)
            i += 1
        for j in range(1, num_levels):
            acc[j] = (acc[j] + acc[j - 1]).astype(f32)
            acc[j - 1] = 0
            if (i & (level_mask << (j * level_power))) != 0:
                break
    while i < size:
        acc[0] = (acc[0] + rows[i]).astype(f32)
        i += 1
    for j in range(1, num_levels):
        acc[0] = (acc[0] + acc[j]).astype(f32)
    return acc[0]


def _np_row_sum(items):
    """SumKernel.cpp row_sum: ilp_factor 4 interleaved partial sums, then the tail."""
    size = items.shape[0]
    size_ilp = size // 4
    if size_ilp:
        partial = _np_multi_row_sum(items[:size_ilp * 4].reshape(size_ilp, 4, *items.shape[1:]))
    else:
        partial = np.zeros((4,) + items.shape[1:], dtype=f32)
    for i in range(size_ilp * 4, size):
        partial[0] = (partial[0] + items[i]).astype(f32)
    for k in range(1, 4):
        partial[0] = (partial[0] + partial[k]).astype(f32)
    return partial[0]


def np_torch_mean_f32(a, lanes=8):
    """torch.mean of a contiguous 1-D float32 CPU tensor, single thread: the float32 sum of
    SumKernel.cpp cascade_sum (vectorized_inner_sum when n >= lanes: row_sum over vectors of
    `lanes` floats, then a scalar sum of the tail, then the vector's lanes added in order;
    scalar row_sum when n < lanes), divided by n in float32. `lanes` is the width of
    at::Vectorized<float> the kernel ran with: 8 on this AVX512 machine (the AVX2 kernel;
    16 does not reproduce torch's sums). Another CPU kernel, or CUDA, may round differently."""
    a = np.asarray(a, dtype=f32).reshape(-1)
    n = a.size
    if n >= lanes:
        nv = n // lanes
        vec = _np_row_sum(a[:nv * lanes].reshape(nv, lanes))
        s = f32(0)
        for v in a[nv * lanes:]:
            s = f32(s + v)
        for v in vec:
            s = f32(s + v)
    else:
        s = f32(_np_row_sum(a.reshape(n, 1))[0]) if n else f32(0)
    return f32(s / f32(n))


def np_double_quantize(absmax, code):
    """bitsandbytes/functional.py quantize_4bit(compress_statistics=True):
    offset = absmax.mean() (float32); quantize_blockwise(absmax - offset, blocksize=256)
    with the dynamic code -> (8-bit codes, one float32 absmax per 256 blocks)."""
    offset = np_torch_mean_f32(absmax)
    q, nested_absmax = np_quantize_8bit_cpu((absmax - offset).astype(f32), code)
    return q, nested_absmax, offset


def np_dequantize_absmax(q, nested_absmax, code, offset):
    """bitsandbytes/functional.py dequantize_4bit -> dequantize_blockwise (csrc/cpu_ops.cpp
    dequantizeBlockwise8bitCpu: code[q] * absmax2[i // 256]) then `absmax += offset`."""
    scale = nested_absmax[np.arange(q.size) // NESTED_BLOCK]
    return ((code[q] * scale).astype(f32) + offset).astype(f32)


def np_dequantize_4bit(packed, absmax, shape, blocksize=BLOCK):
    """csrc/cpu_ops.cpp dequantizeBlockwise4bitCpu (scalar branch) and
    backends/default/ops.py _dequantize_4bit_compute: element i (row-major) is
    NF4[nibble_i] * absmax[i // blocksize] in float32; nibble 2k is byte k >> 4, nibble
    2k+1 is byte k & 15."""
    p = np.asarray(packed, dtype=np.uint8).reshape(-1)
    n = int(np.prod(shape))
    idx = np.empty(p.size * 2, dtype=np.uint8)
    idx[0::2] = p >> 4
    idx[1::2] = p & 15
    idx = idx[:n]
    return (NF4[idx] * absmax[np.arange(n) // blocksize]).astype(f32).reshape(shape)


# ------------------------------------------------------------------------------------------


def bits_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def require(cond, what):
    if not cond:
        raise SystemExit(f"MISMATCH: {what}")
    print(f"  ok: {what}")


def make_tensor_fixtures(out):
    tensors = {}
    code = bnbF.create_dynamic_map().float()
    require(bits_equal(np_create_dynamic_map(), code.numpy()),
            "numpy create_dynamic_map == bitsandbytes create_dynamic_map (256 values)")
    require(bits_equal(NF4, bnbF.get_4bit_type("nf4", device="cpu").numpy()),
            "NF4 table == bitsandbytes get_4bit_type('nf4')")
    tensors["nf4_table"] = torch.from_numpy(NF4.copy())
    tensors["dynamic_code"] = code.clone()

    for name, shape, seed in CASES:
        print(f"[{name}] shape {list(shape)}")
        g = torch.Generator().manual_seed(seed)
        x = (0.1 * torch.randn(shape, generator=g, dtype=torch.float32)).contiguous()
        n = x.numel()
        packed, st = bnbF.quantize_4bit(x, blocksize=BLOCK, quant_type="nf4",
                                        compress_statistics=True)
        deq = bnbF.dequantize_4bit(packed, st)
        packed_p, st_p = bnbF.quantize_4bit(x, blocksize=BLOCK, quant_type="nf4",
                                            compress_statistics=False)
        deq_p = bnbF.dequantize_4bit(packed_p, st_p)
        absmax_dq = bnbF.dequantize_blockwise(st.absmax, st.state2) + st.offset

        nblocks = -(-n // BLOCK)
        print(f"  {n} values, {nblocks} blocks of {BLOCK} (last holds {n - (nblocks - 1) * BLOCK}),"
              f" packed {list(packed.shape)} {packed.dtype}, absmax codes {list(st.absmax.shape)}"
              f" {st.absmax.dtype}, nested_absmax {list(st.state2.absmax.shape)}, offset "
              f"{st.offset.item()!r}, nested blocksize {st.state2.blocksize}")
        require(bits_equal(packed.numpy(), packed_p.numpy()),
                "packed nibbles are the same with and without double quantization")

        # numpy transcription against bitsandbytes, bit for bit.
        np_packed, np_absmax = np_quantize_4bit(x.numpy())
        require(bits_equal(np_packed, packed.numpy()), "numpy packed bytes == bitsandbytes")
        require(bits_equal(np_absmax, st_p.absmax.numpy()), "numpy fp32 absmax == bitsandbytes")
        off_torch = f32(st_p.absmax.mean().item())
        off_f64 = f32(np_absmax.astype(np.float64).mean())
        off_np32 = np_absmax.mean(dtype=f32)
        print(f"  offset: bitsandbytes {st.offset.item()!r}; float64 mean rounded "
              f"{float(off_f64)!r}; numpy float32 mean {float(off_np32)!r}")
        require(off_torch == f32(st.offset.item()), "offset == torch float32 mean of absmax")
        require(np_torch_mean_f32(np_absmax) == f32(st.offset.item()),
                "offset == numpy transcription of torch's CPU float32 mean")
        q8, nabs, off = np_double_quantize(np_absmax, code.numpy())
        require(bits_equal(q8, st.absmax.numpy()), "numpy 8-bit absmax codes (CPU LUT) == bitsandbytes")
        require(bits_equal(nabs, st.state2.absmax.numpy()), "numpy nested_absmax == bitsandbytes")
        q8_exact = np_quantize_8bit_nearest((np_absmax - off).astype(f32), code.numpy())
        print(f"  8-bit codes differing between the CPU LUT and the exact nearest code: "
              f"{int((q8_exact != q8).sum())} of {q8.size}")
        np_abs_dq = np_dequantize_absmax(q8, nabs, code.numpy(), off)
        require(bits_equal(np_abs_dq, absmax_dq.numpy()),
                "numpy code[q]*nested_absmax + offset == bitsandbytes dequantize_blockwise + offset")
        require(bits_equal(np_dequantize_4bit(np_packed, np_abs_dq, shape), deq.numpy()),
                "numpy dequantized (double quant) == bitsandbytes dequantize_4bit")
        require(bits_equal(np_dequantize_4bit(np_packed, np_absmax, shape), deq_p.numpy()),
                "numpy dequantized (fp32 absmax) == bitsandbytes dequantize_4bit")
        if n % 2:
            print(f"  odd length: last byte 0x{int(packed.view(-1)[-1]):02x} (low nibble = "
                  f"{int(packed.view(-1)[-1]) & 15}, the padding's index)")
        err = (deq - x).abs().max().item()
        err_p = (deq_p - x).abs().max().item()
        print(f"  max |dequantized - input|: {err:.4g} (double quant), {err_p:.4g} (fp32 absmax)")

        p = f"{name}."
        tensors[p + "input"] = x
        tensors[p + "packed"] = packed.contiguous()
        tensors[p + "absmax"] = st.absmax.contiguous()
        tensors[p + "nested_absmax"] = st.state2.absmax.contiguous()
        tensors[p + "nested_quant_map"] = st.state2.code.float().contiguous()
        tensors[p + "quant_map"] = st.code.float().contiguous()
        tensors[p + "offset"] = st.offset.reshape(1).float().contiguous()
        tensors[p + "absmax_dequantized"] = absmax_dq.float().contiguous()
        tensors[p + "dequantized"] = deq.contiguous()
        tensors[p + "plain.absmax"] = st_p.absmax.contiguous()
        tensors[p + "plain.dequantized"] = deq_p.contiguous()
        require(bits_equal(st.code.numpy(), NF4) and bits_equal(st.state2.code.numpy(), code.numpy()),
                "quant_map is the NF4 table, nested_quant_map the dynamic code")
    save_file(tensors, str(out / "nf4.safetensors"), metadata={"format": "pt"})


@torch.no_grad()
def logits_and_loss(model, ids, targets):
    logits = model(ids.long()).logits.float().contiguous()
    loss = F.cross_entropy(logits.double().reshape(-1, VOCAB), targets.long().reshape(-1))
    return logits, loss.float().reshape(1).contiguous()


def make_transformers_fixture(out):
    folder = out / "llama3-nf4"
    if folder.exists():
        shutil.rmtree(folder)
    ref = load_file(str(REPO / BASE / "expected.safetensors"))
    ids, targets = ref["input_ids"], ref["targets"]
    qcfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(
        BASE, dtype=torch.float32, attn_implementation="eager", quantization_config=qcfg,
        device_map="cpu").eval()
    model.save_pretrained(str(folder))
    # On a CPU with AVX512-BF16, Linear4bit.forward (eval, no grad) repacks the weight for a
    # bf16 CPU kernel (and needs out_features % 32 == 0). Turn that off: the forward then is
    # bitsandbytes' matmul_4bit = dequantize_4bit + a float32 matmul, on any CPU.
    for mod in model.modules():
        if isinstance(mod, bitsandbytes.nn.Linear4bit):
            mod.support_avx512bf16_for_cpu = False
    logits, loss = logits_and_loss(model, ids, targets)

    # The float32 model with every quantized weight replaced by its dequantized values.
    fp32 = AutoModelForCausalLM.from_pretrained(
        BASE, dtype=torch.float32, attn_implementation="eager").eval()
    quantized = []
    sd = load_file(str(folder / "model.safetensors"))
    for name, mod in model.named_modules():
        if isinstance(mod, bitsandbytes.nn.Linear4bit):
            quantized.append(name)
            w = bnbF.dequantize_4bit(mod.weight.data, mod.weight.quant_state)
            with torch.no_grad():
                fp32.get_submodule(name).weight.copy_(w.float())
            # transformers quantizes exactly as quantize_4bit(weight [out, in], 64, nf4, DQ):
            orig = load_fp32_weight(name)
            pk, st = bnbF.quantize_4bit(orig, blocksize=64, quant_type="nf4", compress_statistics=True)
            assert bits_equal(pk.numpy(), sd[name + ".weight"].numpy()), name
            assert bits_equal(st.absmax.numpy(), sd[name + ".weight.absmax"].numpy()), name
    logits_dq, loss_dq = logits_and_loss(fp32, ids, targets)
    diff = (logits - logits_dq).abs().max().item()
    print(f"[llama3-nf4] quantized modules ({len(quantized)}): {sorted(set(n.split('.')[-1] for n in quantized))};"
          f" loss {loss.item():.6f}; loss with dequantized fp32 weights {loss_dq.item():.6f}; "
          f"max |dlogits| = {diff:.3g}")
    print("  every Linear4bit's packed weight and absmax codes == quantize_4bit(original weight)")
    assert diff <= 1e-4, diff

    # Reload the saved folder: same logits.
    re = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                              attn_implementation="eager", device_map="cpu").eval()
    for mod in re.modules():
        if isinstance(mod, bitsandbytes.nn.Linear4bit):
            mod.support_avx512bf16_for_cpu = False
    rl, _ = logits_and_loss(re, ids, targets)
    rdiff = (rl - logits).abs().max().item()
    print(f"  reload of llama3-nf4: max |dlogits| = {rdiff:.3g}")
    assert rdiff == 0.0, rdiff
    save_file({"input_ids": ids, "targets": targets, "logits": logits, "loss": loss,
               "logits_dequantized_fp32": logits_dq, "loss_dequantized_fp32": loss_dq},
              str(folder / "expected.safetensors"), metadata={"format": "pt"})

    # What it wrote for one linear, and the quantization_config.
    with open(folder / "model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    print("  tensors written for model.layers.0.self_attn.q_proj (weight [60, 60]) and the head:")
    for k, v in header.items():
        if k.startswith("model.layers.0.self_attn.q_proj.") or k.startswith("lm_head"):
            print(f"    {k}  {v['dtype']} {v['shape']}")
    qs = bytes(sd["model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__nf4"].tolist())
    print(f"  quant_state.bitsandbytes__nf4 bytes (UTF-8 JSON): {qs.decode()}")
    cfg = json.loads((folder / "config.json").read_text())
    print("  config.json quantization_config: " + json.dumps(cfg["quantization_config"], sort_keys=True))


_FP32_SD = None


def load_fp32_weight(module_name):
    global _FP32_SD
    if _FP32_SD is None:
        m = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
        _FP32_SD = {k: v.detach().clone() for k, v in m.state_dict().items()}
    return _FP32_SD[module_name + ".weight"].contiguous()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(REPO)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    print(f"bitsandbytes {bitsandbytes.__version__}  transformers {transformers.__version__}  "
          f"torch {torch.__version__}  safetensors {safetensors.__version__}  numpy {np.__version__}")
    print(f"torch CPU capability: {torch.backends.cpu.get_cpu_capability()}")

    make_tensor_fixtures(out)
    make_transformers_fixture(out)

    print()
    total = 0
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name != "README.md":
            total += p.stat().st_size
            h = hashlib.sha256(p.read_bytes()).hexdigest()[:12]
            print(f"{p.stat().st_size:8d}  {h}  {p.relative_to(out)}")
    print(f"{total:8d}  total bytes")


if __name__ == "__main__":
    sys.exit(main())
