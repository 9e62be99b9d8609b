#!/usr/bin/env python3
"""Generate the PEFT LoRA adapter fixtures under tests/data/peft/.

Each case is a LoRA adapter on one of the tiny Hugging Face models of tests/data/hf/, saved
with PEFT's `save_pretrained` (adapter_config.json + adapter_model.safetensors, as PEFT
writes them), plus
  expected.safetensors: input_ids, targets (copied from the base's expected.safetensors),
      logits of the PEFT model, the float64 cross-entropy loss, the float32 losses before
      each of 5 AdamW steps, and the adapter tensors after those steps (`trained.<name>`);
  merged.safetensors: input_ids and the logits of `merge_and_unload()` of the saved
      (untrained) adapter.
The C++ tests read these files directly. See scripts/peft_fixtures/README.md to re-run.

Deterministic: fixed seeds, single thread, deterministic algorithms, no timestamps.
Re-running with the versions pinned in requirements.txt rewrites identical bytes.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

import peft
import safetensors
import torch
import torch.nn.functional as F
import transformers
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "data" / "peft"
VOCAB = 300

ALL_LLAMA = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# base: a folder of tests/data/hf, given relative to the repository root (the script runs
# from there), so that adapter_config.json's base_model_name_or_path is that relative path.
CASES = [
    dict(
        name="llama3-all",
        base="tests/data/hf/llama3",
        seed=2001,
        lora=dict(r=4, lora_alpha=8, target_modules=ALL_LLAMA),
    ),
    dict(
        name="qwen2-qv",
        base="tests/data/hf/qwen2",
        seed=2002,
        lora=dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], use_rslora=True),
    ),
    dict(
        name="gpt2-all",
        base="tests/data/hf/gpt2",
        seed=2003,
        lora=dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"],
                  fan_in_fan_out=True),
    ),
    dict(
        name="llama3-save-head",
        base="tests/data/hf/llama3",
        seed=2004,
        lora=dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                  modules_to_save=["lm_head"]),
    ),
]

B_STD = 0.05         # lora_B is overwritten with normal(0, B_STD) so the adapter matters
TRAIN_STEPS = 5
ADAMW = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
TOL = 1e-5           # reload / merge tolerance (max abs logit difference)


def load_base(folder):
    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()


def lora_config(case):
    kw = dict(lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    kw.update(case["lora"])
    return LoraConfig(**kw)


def loss64(logits, targets):
    return F.cross_entropy(logits.double().reshape(-1, VOCAB), targets.long().reshape(-1),
                           reduction="mean").float().reshape(1)


@torch.no_grad()
def forward_logits(model, input_ids):
    return model(input_ids.long()).logits.float().contiguous()


def make_peft_model(case):
    base = load_base(case["base"])
    torch.manual_seed(case["seed"])   # lora_A: PEFT's own init under this seed
    model = get_peft_model(base, lora_config(case))
    g = torch.Generator().manual_seed(case["seed"] + 100)
    with torch.no_grad():
        for name, p in model.named_parameters():   # fixed order: module registration order
            if ".lora_B." in name:
                p.copy_(B_STD * torch.randn(p.shape, generator=g, dtype=torch.float32))
    return model.eval()


def train(model, input_ids, targets):
    """5 AdamW steps on one batch. The model stays in eval mode: GPT-2's config has dropout
    0.1 (resid/embd/attn), which eval() turns off; lora_dropout is 0."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, **ADAMW)
    losses = []
    for _ in range(TRAIN_STEPS):
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids.long()).logits
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.long().reshape(-1))
        losses.append(loss.detach().clone())
        loss.backward()
        opt.step()
    return torch.stack(losses).float().contiguous()


def build(case, out):
    folder = out / case["name"]
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    ref = load_file(str(REPO / case["base"] / "expected.safetensors"))
    input_ids, targets = ref["input_ids"], ref["targets"]

    model = make_peft_model(case)
    logits = forward_logits(model, input_ids)
    loss = loss64(logits, targets)
    base_diff = (logits - ref["logits"]).abs().max().item()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.save_pretrained(str(folder))
    for w in caught:
        print(f"[{case['name']}] save_pretrained warning: {w.message}")
    # PEFT also writes a model-card README.md (a template); it is not part of the format.
    card = folder / "README.md"
    if card.exists():
        card.unlink()

    # Reload from disk: same logits.
    reloaded = PeftModel.from_pretrained(load_base(case["base"]), str(folder)).eval()
    reload_diff = (forward_logits(reloaded, input_ids) - logits).abs().max().item()
    assert reload_diff <= TOL, reload_diff
    # Merged (untrained adapter).
    merged = reloaded.merge_and_unload().eval()
    merged_logits = forward_logits(merged, input_ids)
    merge_diff = (merged_logits - logits).abs().max().item()
    assert merge_diff <= TOL, merge_diff

    saved_names = sorted(load_file(str(folder / "adapter_model.safetensors")).keys())
    losses = train(model, input_ids, targets)
    trained = {f"trained.{k}": v.detach().float().contiguous()
               for k, v in get_peft_model_state_dict(model).items()}
    assert sorted(k[len("trained."):] for k in trained) == saved_names

    tensors = {
        "input_ids": input_ids.contiguous(),
        "targets": targets.contiguous(),
        "logits": logits,
        "loss": loss.contiguous(),
        "train_losses": losses,
    }
    tensors.update(trained)
    save_file(tensors, str(folder / "expected.safetensors"), metadata={"format": "pt"})
    save_file({"input_ids": input_ids.contiguous(), "logits": merged_logits},
              str(folder / "merged.safetensors"), metadata={"format": "pt"})
    print(f"[{case['name']}] max|logits - base logits| = {base_diff:.4g}  loss = "
          f"{loss.item():.6f}  reload diff = {reload_diff:.3g}  merged diff = {merge_diff:.3g}")
    print(f"[{case['name']}] train_losses = {[round(x, 6) for x in losses.tolist()]}")
    return dict(names=saved_names, model=model)


def report_conventions(out, built):
    """Print the conventions the README quotes (key names, shapes, config, defaults)."""
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as M

    print("\n== adapter_model.safetensors names, shapes, dtypes (first layer, head) ==")
    for name in ("llama3-all", "gpt2-all", "llama3-save-head"):
        path = out / name / "adapter_model.safetensors"
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        print(f"-- {name}: {len(header) - 1} tensors, metadata {header.get('__metadata__')}")
        for k, v in header.items():
            if k != "__metadata__" and (".0." in k or "lm_head" in k):
                print(f"   {k}  {v['dtype']} {v['shape']}")
    print("\n== in-memory parameter names (adapter name present there) ==")
    m = built["llama3-save-head"]["model"]
    for k, p in m.named_parameters():
        if ("layers.0.self_attn.q_proj" in k or "lm_head" in k):
            print(f"   {k}  requires_grad={p.requires_grad} {list(p.shape)}")
    g = built["gpt2-all"]["model"]
    layer = g.base_model.model.transformer.h[0].attn.c_attn
    print(f"   gpt2 c_attn base weight (Conv1D) {list(layer.base_layer.weight.shape)}, "
          f"fan_in_fan_out={layer.fan_in_fan_out}, in_features={layer.in_features}, "
          f"out_features={layer.out_features}")
    print("\n== scaling ==")
    for name, b in built.items():
        mod = next(x for x in b["model"].modules() if isinstance(x, LoraLayer))
        print(f"   {name}: r {mod.r['default']} lora_alpha {mod.lora_alpha['default']} "
              f"use_rslora {mod.use_rslora['default']} -> scaling {mod.scaling['default']!r}")
    print("\n== adapter_config.json of llama3-all ==")
    print((out / "llama3-all" / "adapter_config.json").read_text())
    print("\n== TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING ==")
    for t in ("llama", "qwen2", "gpt2"):
        print(f"   {t!r}: {M.get(t)}")
    print("\n== target_modules=None resolves to (get_peft_model) ==")
    for case in CASES[:3]:
        torch.manual_seed(0)
        mm = get_peft_model(load_base(case["base"]), LoraConfig(r=2, task_type="CAUSAL_LM"))
        print(f"   {case['base']}: {sorted(mm.peft_config['default'].target_modules)}")
    print("\n== 'all-linear' resolves to ==")
    for case in (CASES[0], CASES[2]):
        base = load_base(case["base"])
        cfg = _maybe_include_all_linear_layers(
            LoraConfig(r=2, target_modules="all-linear", task_type="CAUSAL_LM"), base)
        names = sorted(cfg.target_modules)
        print(f"   {case['base']}: {names}  (lm_head included: "
              f"{any(n == 'lm_head' or n.endswith('.lm_head') for n in names)})")
        torch.manual_seed(0)
        mm = get_peft_model(base, LoraConfig(r=2, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
        adapted = sorted({k.split(".lora_A")[0].split(".")[-1]
                          for k, _ in mm.named_parameters() if ".lora_A." in k})
        print(f"     adapted module suffixes after get_peft_model: {adapted}; "
              f"stored target_modules {sorted(mm.peft_config['default'].target_modules)}")


def main():
    # PEFT keeps target_modules as a Python set and writes list(set) into adapter_config.json,
    # so the order of that list follows str hashing: fix the hash seed (re-exec once).
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--no-report", action="store_true", help="skip the conventions report")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(REPO)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    print(f"peft {peft.__version__}  transformers {transformers.__version__}  torch "
          f"{torch.__version__}  safetensors {safetensors.__version__}")

    built = {}
    for case in CASES:
        built[case["name"]] = build(case, out)
    if not args.no_report:
        report_conventions(out, built)

    print()
    total = 0
    for case in CASES:
        for p in sorted((out / case["name"]).rglob("*")):
            if p.is_file():
                total += p.stat().st_size
                h = hashlib.sha256(p.read_bytes()).hexdigest()[:12]
                print(f"{p.stat().st_size:8d}  {h}  {p.relative_to(out)}")
    print(f"{total:8d}  total bytes")


if __name__ == "__main__":
    sys.exit(main())
