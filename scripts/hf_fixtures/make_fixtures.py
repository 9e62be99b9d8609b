#!/usr/bin/env python3
"""Generate the tiny Hugging Face fixtures under tests/data/hf/.

Each sub-folder is a complete, loadable Hugging Face checkpoint (config.json, safetensors
weights, tokenizer files, generation_config.json) of a tiny randomly initialised causal LM,
plus expected.safetensors holding fixed input ids, targets, the float32 reference logits and
the mean cross-entropy loss. The C++ tests read these files directly; no Python is needed to
run them. See scripts/hf_fixtures/README.md for how to re-run this script.

Deterministic: fixed seeds, fixed training text, no timestamps. Re-running with the versions
pinned in requirements.txt rewrites identical bytes.
"""

import argparse
import hashlib
import json
import math
import shutil
import sys
from pathlib import Path

import safetensors
import tokenizers
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "data" / "hf"
CORPUS = REPO / "examples" / "data" / "kjv.txt"
CORPUS_BYTES = 20000

VOCAB = 300
MAX_POS = 64
BATCH, SEQ = 2, 16
# Special tokens: ids 0, 1, 2 (the trainer puts them first, in this order).
PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

TOL = 1e-5  # max abs logit difference accepted between the reference and a reload


# --------------------------------------------------------------------------------------------
# Inputs


def fixed_ids(a, b, c):
    ids = [[(bb * a + t * b + c) % VOCAB for t in range(SEQ)] for bb in range(BATCH)]
    return torch.tensor(ids, dtype=torch.int32)


INPUT_IDS = fixed_ids(131, 37, 11)
TARGETS = fixed_ids(71, 53, 5)


# --------------------------------------------------------------------------------------------
# Tokenizer


def train_tokenizer():
    text = CORPUS.read_bytes()[:CORPUS_BYTES].decode("utf-8", errors="ignore")
    lines = text.splitlines()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=2,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    assert [tok.token_to_id(t) for t in (PAD, BOS, EOS)] == [PAD_ID, BOS_ID, EOS_ID]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        model_max_length=MAX_POS,
        clean_up_tokenization_spaces=False,
    )


# --------------------------------------------------------------------------------------------
# Random weights


def is_norm(module):
    return isinstance(module, torch.nn.LayerNorm) or "RMSNorm" in type(module).__name__


@torch.no_grad()
def randomize(model, seed):
    """Overwrite every parameter with random, clearly nonzero values.

    Matrices use std 1/sqrt(fan_in) so that attention scores are O(1) (std 0.02 everywhere
    makes attention nearly uniform, hiding q/k or RoPE mistakes); embeddings std 0.2 keeps
    tied-head logits O(1); biases and norm biases std 0.1; norm gains 1 + N(0, 0.1).
    """
    g = torch.Generator().manual_seed(seed)
    kind = {}
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if is_norm(module):
                kind[id(p)] = "norm_weight" if pname == "weight" else "norm_bias"
            elif isinstance(module, torch.nn.Embedding):
                kind[id(p)] = "embedding"
            elif pname == "bias":
                kind[id(p)] = "bias"
            elif isinstance(module, torch.nn.Linear):
                kind[id(p)] = ("matrix", p.shape[1])  # [out, in]
            elif type(module).__name__ == "Conv1D":  # GPT-2: weight is [in, out]
                kind[id(p)] = ("matrix", p.shape[0])
            else:
                raise RuntimeError(f"unhandled parameter {mname}.{pname} in {type(module)}")
    for name, p in model.named_parameters():  # tied parameters are listed once
        k = kind[id(p)]
        r = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if k == "norm_weight":
            v = 1.0 + 0.1 * r
        elif k in ("norm_bias", "bias"):
            v = 0.1 * r
        elif k == "embedding":
            v = 0.2 * r
        else:
            v = r / math.sqrt(k[1])
        p.copy_(v)


# --------------------------------------------------------------------------------------------
# Model specs


def common(**kw):
    kw.setdefault("vocab_size", VOCAB)
    kw.setdefault("bos_token_id", BOS_ID)
    kw.setdefault("eos_token_id", EOS_ID)
    return kw


def llama_like(**kw):
    base = dict(
        hidden_size=60,
        intermediate_size=88,
        num_hidden_layers=3,
        num_attention_heads=5,
        num_key_value_heads=1,
        max_position_embeddings=MAX_POS,
        rms_norm_eps=1e-5,
    )
    base.update(kw)
    return common(**base)


LLAMA3_ROPE = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=16,
)

SPECS = [
    dict(
        name="gpt2",
        model_cls=GPT2LMHeadModel,
        config=lambda: GPT2Config(
            **common(
                n_layer=3,
                n_head=5,
                n_embd=60,
                n_positions=MAX_POS,
                layer_norm_epsilon=1e-5,
                activation_function="gelu_new",
            )
        ),
        save_dtype=torch.float32,
        shard=None,
        seed=1001,
    ),
    dict(
        name="llama3",
        model_cls=LlamaForCausalLM,
        config=lambda: LlamaConfig(
            **llama_like(
                tie_word_embeddings=False,
                rope_theta=500000.0,
                rope_scaling=dict(LLAMA3_ROPE),
            )
        ),
        save_dtype=torch.float32,
        shard="100KB",
        seed=1002,
    ),
    dict(
        name="llama-tied-bf16",
        model_cls=LlamaForCausalLM,
        config=lambda: LlamaConfig(
            **llama_like(num_key_value_heads=5, tie_word_embeddings=True, rope_theta=10000.0)
        ),
        save_dtype=torch.bfloat16,
        shard=None,
        seed=1003,
    ),
    dict(
        name="mistral",
        model_cls=MistralForCausalLM,
        config=lambda: MistralConfig(
            **llama_like(tie_word_embeddings=False, sliding_window=None, rope_theta=10000.0)
        ),
        save_dtype=torch.float32,
        shard=None,
        seed=1004,
    ),
    dict(
        name="qwen2",
        model_cls=Qwen2ForCausalLM,
        config=lambda: Qwen2Config(**llama_like(tie_word_embeddings=True, rope_theta=10000.0)),
        save_dtype=torch.float16,
        shard=None,
        seed=1005,
    ),
    dict(
        name="qwen2-untied",
        model_cls=Qwen2ForCausalLM,
        config=lambda: Qwen2Config(**llama_like(tie_word_embeddings=False, rope_theta=10000.0)),
        save_dtype=torch.float32,
        shard=None,
        seed=1006,
    ),
    # Qwen3: per-head RMSNorm of q and k before RoPE, no q/k/v biases, and a head size (16)
    # that is not hidden_size / num_attention_heads (12), as Qwen3-0.6B's 128 is not 1024/16.
    dict(
        name="qwen3",
        model_cls=Qwen3ForCausalLM,
        config=lambda: Qwen3Config(
            **llama_like(num_key_value_heads=1, head_dim=16, tie_word_embeddings=True, rope_theta=1000000.0)
        ),
        save_dtype=torch.float32,
        shard=None,
        seed=1007,
    ),
]

# The folder whose config.json is rewritten into the spelling the installed version does not
# write, so that both spellings are covered.
RESPELL_FOLDER = "llama3"


# --------------------------------------------------------------------------------------------
# Helpers


@torch.no_grad()
def reference(model):
    logits = model(INPUT_IDS.long()).logits.float().contiguous()
    loss = F.cross_entropy(
        logits.double().reshape(-1, VOCAB), TARGETS.long().reshape(-1), reduction="mean"
    )
    return logits, loss.float().reshape(1).contiguous()


def load_fp32(folder):
    kw = dict(attn_implementation="eager")
    try:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kw).eval()
    except TypeError:  # transformers < 4.56 only knows torch_dtype
        return AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, **kw).eval()


def config_spelling(cfg):
    new = "rope_parameters" in cfg or "dtype" in cfg
    old = "rope_theta" in cfg or "rope_scaling" in cfg or "torch_dtype" in cfg
    if new and not old:
        return "new"
    if old and not new:
        return "old"
    return "mixed"


def respell(cfg, to):
    """Rewrite a config dict into the 'new' (transformers 5: rope_parameters, dtype) or the
    'old' (transformers 4: rope_theta + rope_scaling, torch_dtype) spelling."""
    cfg = dict(cfg)
    if to == "old":
        if "rope_parameters" in cfg:
            rp = dict(cfg.pop("rope_parameters"))
            theta = rp.pop("rope_theta")
            cfg["rope_theta"] = theta
            cfg["rope_scaling"] = None if rp.get("rope_type", "default") == "default" else rp
        if "dtype" in cfg:
            cfg["torch_dtype"] = cfg.pop("dtype")
    else:
        if "rope_theta" in cfg or "rope_scaling" in cfg:
            rp = dict(cfg.pop("rope_scaling", None) or {"rope_type": "default"})
            if "type" in rp and "rope_type" not in rp:
                rp["rope_type"] = rp.pop("type")
            rp["rope_theta"] = cfg.pop("rope_theta", 10000.0)
            cfg["rope_parameters"] = rp
        if "torch_dtype" in cfg:
            cfg["dtype"] = cfg.pop("torch_dtype")
    return dict(sorted(cfg.items()))


def safetensors_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def weight_files(folder):
    return sorted(p for p in folder.glob("model*.safetensors"))


# --------------------------------------------------------------------------------------------
# Main


def build(spec, out, tokenizer, report):
    folder = out / spec["name"]
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)

    torch.manual_seed(spec["seed"])
    config = spec["config"]()
    config._attn_implementation = "eager"
    model = spec["model_cls"](config).eval()
    randomize(model, spec["seed"])
    dtype = spec["save_dtype"]
    if dtype != torch.float32:
        # Round to the storage dtype first so the in-memory fp32 model equals the file.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(dtype).float())
    ref_logits, ref_loss = reference(model)

    save_kw = dict(safe_serialization=True)
    if spec["shard"]:
        save_kw["max_shard_size"] = spec["shard"]
    model.to(dtype).save_pretrained(folder, **save_kw)
    tokenizer.save_pretrained(folder)
    wrote_stm = (folder / "special_tokens_map.json").exists()
    if not (folder / "generation_config.json").exists():
        model.generation_config.save_pretrained(folder)
    # transformers 5 no longer writes special_tokens_map.json; write the classic file so the
    # fixtures carry the full set of tokenizer files older checkpoints have.
    stm = folder / "special_tokens_map.json"
    if not stm.exists():
        stm.write_text(
            json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, indent=2) + "\n"
        )

    # The saved tokenizer must load back and encode like the trained one.
    sample = "And God said, Let there be light: and there was light."
    back = AutoTokenizer.from_pretrained(folder)
    assert back(sample)["input_ids"] == tokenizer(sample)["input_ids"]
    assert (back.bos_token_id, back.eos_token_id, back.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    if spec is SPECS[0]:
        print(f"tokenizer: save_pretrained wrote special_tokens_map.json: {wrote_stm}; "
              f"reloads as {type(back).__name__}")

    # Reload from disk in fp32 and check it reproduces the reference logits.
    reloaded = load_fp32(folder)
    logits, loss = reference(reloaded)
    diff = (logits - ref_logits).abs().max().item()
    print(f"[{spec['name']}] reload max|dlogits| = {diff:.3g}  loss = {loss.item():.6f}")
    assert diff <= TOL, diff
    # The C++ side computes from the stored weights upcast to fp32: the reloaded logits are it.
    save_file(
        {
            "input_ids": INPUT_IDS.contiguous(),
            "targets": TARGETS.contiguous(),
            "logits": logits.contiguous(),
            "loss": loss.contiguous(),
        },
        str(folder / "expected.safetensors"),
        metadata={"format": "pt"},
    )

    files = weight_files(folder)
    names = []
    for f in files:
        names += list(k for k in safetensors_header(f) if k != "__metadata__")
    cfg = json.loads((folder / "config.json").read_text())
    report[spec["name"]] = dict(
        spec=spec,
        config=cfg,
        n_weight_files=len(files),
        tensor_names=sorted(names),
        logits=logits,
        loss=loss.item(),
        reload_diff=diff,
    )
    return reloaded


def respell_and_verify(out, report):
    folder = out / RESPELL_FOLDER
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    native = config_spelling(cfg)
    target = "old" if native == "new" else "new"
    edited = respell(cfg, target)
    path.write_text(json.dumps(edited, indent=2, sort_keys=True) + "\n")
    try:
        model = load_fp32(folder)
        logits, _ = reference(model)
        diff = (logits - report[RESPELL_FOLDER]["logits"]).abs().max().item()
        ok = diff <= TOL
    except Exception as e:  # noqa: BLE001
        print(f"[{RESPELL_FOLDER}] loading the {target} spelling failed: {e!r}")
        ok, diff = False, float("nan")
    print(f"[{RESPELL_FOLDER}] respelled config.json {native} -> {target}: "
          f"max|dlogits| = {diff:.3g} ({'ok' if ok else 'FAILED, native spelling kept'})")
    if not ok:
        path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        target = native
    report[RESPELL_FOLDER]["config"] = json.loads(path.read_text())
    report["_respell"] = dict(native=native, target=target, ok=ok, diff=diff)


def sensitivity_checks(out, report):
    """Show that the fixtures detect typical loader mistakes (printed only)."""
    with torch.no_grad():
        # RoPE scaling ignored.
        m = load_fp32(out / "llama3")
        ref = report["llama3"]["logits"]
        c = m.config
        c2 = LlamaConfig(**{**c.to_dict(), "rope_scaling": None, "rope_parameters": None,
                            "rope_theta": 500000.0})
        m2 = LlamaForCausalLM(c2).eval()
        m2.load_state_dict(m.state_dict())
        d = (reference(m2)[0] - ref).abs().max().item()
        print(f"[check] llama3 without llama3 rope scaling: max|dlogits| = {d:.3g}")
        # q and k swapped (MHA model, same shapes).
        m = load_fp32(out / "llama-tied-bf16")
        ref = report["llama-tied-bf16"]["logits"]
        a = m.model.layers[0].self_attn
        q, k = a.q_proj.weight.clone(), a.k_proj.weight.clone()
        a.q_proj.weight.copy_(k)
        a.k_proj.weight.copy_(q)
        d = (reference(m)[0] - ref).abs().max().item()
        print(f"[check] llama-tied-bf16 with layer-0 q/k swapped: max|dlogits| = {d:.3g}")
        # GPT-2 gain and bias of ln_1 swapped.
        m = load_fp32(out / "gpt2")
        ref = report["gpt2"]["logits"]
        ln = m.transformer.h[0].ln_1
        w, b = ln.weight.clone(), ln.bias.clone()
        ln.weight.copy_(b)
        ln.bias.copy_(w)
        d = (reference(m)[0] - ref).abs().max().item()
        print(f"[check] gpt2 with h.0.ln_1 weight/bias swapped: max|dlogits| = {d:.3g}")


def dtype_name(d):
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[d]


def write_readme(out, report):
    v = f"transformers {transformers.__version__}, torch {torch.__version__.split('+')[0]}, " \
        f"safetensors {safetensors.__version__}, tokenizers {tokenizers.__version__}"
    rs = report["_respell"]
    spell_desc = {
        "new": "transformers-5 spelling (`rope_parameters` holding `rope_theta`/`rope_type`, "
               "and `dtype`)",
        "old": "transformers-4 spelling (top-level `rope_theta` and `rope_scaling`, and "
               "`torch_dtype`)",
    }
    spell_dtype = {
        "new": "transformers-5 spelling (`dtype`; no RoPE keys for GPT-2)",
        "old": "transformers-4 spelling (`torch_dtype`; no RoPE keys for GPT-2)",
    }
    lines = [
        "# Hugging Face test fixtures",
        "",
        "Tiny randomly initialised causal LMs saved with Hugging Face `save_pretrained`, read by",
        "the C++ tests without Python. Generated by `scripts/hf_fixtures/make_fixtures.py`",
        f"({v});",
        "see `scripts/hf_fixtures/README.md` to re-run it. Do not edit by hand.",
        "",
        "Every folder holds `config.json`, the weights (`model.safetensors`, or shards plus",
        "`model.safetensors.index.json`), `generation_config.json`, the tokenizer",
        "(`tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`) and",
        "`expected.safetensors`. transformers 5 no longer writes `special_tokens_map.json`, so",
        "the script writes it in the classic form; `tokenizer_config.json` is as transformers",
        "wrote it. The tokenizer is the same everywhere: a byte-level BPE with",
        f"vocab 300 (ids 0/1/2 = `{PAD}`/`{BOS}`/`{EOS}`, 256 byte tokens, 41 merges) trained",
        f"on the first {CORPUS_BYTES} bytes of `examples/data/kjv.txt`. All models: vocab 300,",
        "64 positions, 3 layers, 5 heads, hidden 60 (head_dim 12), eager attention.",
        "Every parameter is random and nonzero (matrices normal with std 1/sqrt(fan_in),",
        "embeddings std 0.2, biases and norm biases std 0.1, norm gains 1 + normal std 0.1), so",
        "a loader that mixes up tensors changes the logits.",
        "",
        "`expected.safetensors`: `input_ids` I32 [2,16] with ids[b][t] = (b*131 + t*37 + 11) %",
        "300; `targets` I32 [2,16] with (b*71 + t*53 + 5) % 300; `logits` F32 [2,16,300] =",
        "`model(input_ids).logits` with the stored weights upcast to float32 and computed in",
        "float32 (eager attention); `loss` F32 [1] = mean cross entropy of those logits against",
        "`targets` over all 32 positions, computed in float64.",
        "",
    ]
    for spec in SPECS:
        name = spec["name"]
        r = report[name]
        cfg = r["config"]
        sp = config_spelling(cfg)
        tied = cfg.get("tie_word_embeddings", True)
        has_head = "lm_head.weight" in r["tensor_names"]
        sharded = r["n_weight_files"] > 1
        arch = cfg["architectures"][0]
        if name == "gpt2":
            shape = (f"n_layer 3, n_head 5, n_embd 60, n_inner null in config (so 4*n_embd = "
                     f"240), n_positions 64, "
                     f"{cfg['activation_function']}, layer_norm_epsilon 1e-5, learned position "
                     f"embeddings, Conv1D weights stored [in, out]")
            rope = ""
        else:
            rp = cfg.get("rope_parameters") or {
                **(cfg.get("rope_scaling") or {"rope_type": "default"}),
                "rope_theta": cfg.get("rope_theta")}
            kv = cfg["num_key_value_heads"]
            shape = (f"3 layers, 5 heads, {kv} KV head{'s' if kv > 1 else ''} "
                     f"({'MHA' if kv == 5 else 'GQA'}), hidden 60, head_dim {cfg.get('head_dim') or 12}, intermediate 88, "
                     f"SiLU gated MLP, RMSNorm eps 1e-5")
            rtype = rp.get("rope_type", "default")
            rope = f"; RoPE theta {rp['rope_theta']:g}"
            if rtype != "default":
                rope += (f", {rtype} scaling (factor {rp['factor']:g}, low_freq_factor "
                         f"{rp['low_freq_factor']:g}, high_freq_factor {rp['high_freq_factor']:g},"
                         f" original_max_position_embeddings "
                         f"{rp['original_max_position_embeddings']})")
            rope += ("; config.json has `head_dim`" if "head_dim" in cfg else
                     "; config.json has no `head_dim` key (it is hidden_size / num_heads)")
            if arch.startswith("Qwen2"):
                rope += ("; q/k/v projections have biases (o_proj has none); `use_sliding_window`"
                         f" is {json.dumps(cfg.get('use_sliding_window'))}, `sliding_window` "
                         f"{json.dumps(cfg.get('sliding_window'))}, and `layer_types` lists "
                         f"{len(cfg.get('layer_types') or [])} \"full_attention\" layers")
            if arch.startswith("Qwen3"):
                rope += ("; q_norm and k_norm (RMSNorm over each head's 16 values) before RoPE, no"
                         f" q/k/v biases (`attention_bias` {json.dumps(cfg.get('attention_bias'))}),"
                         f" `use_sliding_window` {json.dumps(cfg.get('use_sliding_window'))}")
            if arch.startswith("Mistral"):
                rope += f"; `sliding_window` is {json.dumps(cfg.get('sliding_window'))}"
        dt = dtype_name(spec["save_dtype"])
        parts = [
            f"**`{name}/`** — `{arch}`: {shape}{rope}.",
            f"Weights stored in {dt}" + (
                " (the reference logits come from these weights upcast to float32)."
                if dt != "float32" else "."),
            ("Tied embeddings: `lm_head.weight` is "
             + ("absent from the file (the head reuses the token embedding)."
                if not has_head else "present in the file.")) if tied else
            "Untied: `lm_head.weight` is stored separately.",
            (f"Sharded into {r['n_weight_files']} files with `model.safetensors.index.json`."
             if sharded else "Single `model.safetensors`."),
            f"config.json uses the {spell_desc[sp] if rope else spell_dtype[sp]}"
            + (" — rewritten from the spelling this transformers version writes, and checked to"
               " load with identical logits." if name == RESPELL_FOLDER and rs["ok"] else ".")
            + f" Reference loss {r['loss']:.6f}.",
        ]
        lines += [" ".join(parts), ""]
    text = "\n".join(lines)
    (out / "README.md").write_text(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    print(f"transformers {transformers.__version__}  torch {torch.__version__}  "
          f"safetensors {safetensors.__version__}  tokenizers {tokenizers.__version__}")

    tokenizer = train_tokenizer()
    enc = tokenizer("In the beginning God created the heaven and the earth.")["input_ids"]
    print(f"tokenizer: vocab {len(tokenizer)}, sample encodes to {len(enc)} ids")

    report = {}
    for spec in SPECS:
        build(spec, out, tokenizer, report)
    respell_and_verify(out, report)
    sensitivity_checks(out, report)
    write_readme(out, report)

    print()
    for spec in SPECS:
        name = spec["name"]
        cfg = report[name]["config"]
        keys = [k for k in ("rope_parameters", "rope_theta", "rope_scaling", "dtype",
                            "torch_dtype", "head_dim", "sliding_window", "tie_word_embeddings")
                if k in cfg]
        print(f"{name:16s} spelling={config_spelling(cfg):4s} "
              f"files={report[name]['n_weight_files']} lm_head.weight={'lm_head.weight' in report[name]['tensor_names']} keys={keys}")
    total = 0
    print()
    for p in sorted(out.rglob("*")):
        if p.is_file():
            total += p.stat().st_size
            h = hashlib.sha256(p.read_bytes()).hexdigest()[:12]
            print(f"{p.stat().st_size:8d}  {h}  {p.relative_to(out)}")
    print(f"{total:8d}  total bytes")


if __name__ == "__main__":
    sys.exit(main())
