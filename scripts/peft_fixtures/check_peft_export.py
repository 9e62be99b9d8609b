#!/usr/bin/env python3
"""Check a PEFT LoRA folder (or a merged Hugging Face folder) with PEFT and transformers.

Adapter mode:
    check_peft_export.py BASE_FOLDER ADAPTER_FOLDER [--expected expected.safetensors]
  Loads BASE_FOLDER with AutoModelForCausalLM (float32, eager attention), then
  PeftModel.from_pretrained(base, ADAPTER_FOLDER). Fails (exit 1, naming them) if the file
  holds a tensor the model has no place for (unexpected), lacks one of the model's adapter
  tensors (missing), has a tensor of the wrong shape, or PEFT warned about missing or
  unexpected adapter keys while loading. With --expected, compares the logits on the file's
  `input_ids` with its `logits` and fails above --tol (1e-4).

Merged mode:
    check_peft_export.py --merged HF_FOLDER --expected merged.safetensors
  Loads HF_FOLDER with AutoModelForCausalLM (float32, eager); fails if transformers reports
  missing, unexpected or mismatched weights, or if the logits differ from the file's
  `logits` (e.g. tests/data/peft/<case>/merged.safetensors) by more than --tol.

Self-test:
    check_peft_export.py --self-test [--fixtures tests/data/peft]
  Runs the checks above on every fixture (they must pass), on a merged folder written with
  PEFT's merge_and_unload (must pass), and on broken copies: one tensor deleted, one
  renamed, one scaled, an extra tensor (each must fail).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[2]


def load_base(folder, info=False):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=info)


@torch.no_grad()
def logits_of(model, input_ids):
    return model.eval()(input_ids.long()).logits.float()


def compare(logits, expected_path, tol, label):
    exp = load_file(str(expected_path))
    diff = (logits - exp["logits"]).abs().max().item()
    ok = diff <= tol
    print(f"{label}: max |logits - expected| = {diff:.3g} (tol {tol:g}) "
          f"{'ok' if ok else 'FAIL'}")
    return ok


def input_ids_of(expected_path):
    if expected_path is None:
        return None
    return load_file(str(expected_path))["input_ids"]


def check_adapter(base_folder, adapter_folder, expected, tol):
    from peft import PeftModel, get_peft_model_state_dict
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    errors = []
    base = load_base(base_folder)
    file_sd = load_peft_weights(str(adapter_folder), device="cpu")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = PeftModel.from_pretrained(base, str(adapter_folder))
        except Exception as e:  # noqa: BLE001 -- a size mismatch raises here
            print(f"FAIL: PeftModel.from_pretrained raised: {e}")
            return False
    for w in caught:
        msg = str(w.message)
        if "missing" in msg.lower() or "unexpected" in msg.lower():
            errors.append(f"PEFT warned while loading: {msg}")

    # The adapter tensors the model has, under the names PEFT saves them with.
    model_sd = get_peft_model_state_dict(model)
    missing = sorted(set(model_sd) - set(file_sd))
    unexpected = sorted(set(file_sd) - set(model_sd))
    mismatched = sorted(f"{k}: file {list(file_sd[k].shape)} model {list(model_sd[k].shape)}"
                        for k in set(file_sd) & set(model_sd)
                        if file_sd[k].shape != model_sd[k].shape)
    # And what PEFT's own loader reports for this state dict.
    try:
        result = set_peft_model_state_dict(model, file_sd)
        peft_unexpected = sorted(getattr(result, "unexpected_keys", []) or [])
    except Exception as e:  # noqa: BLE001
        peft_unexpected = []
        errors.append(f"set_peft_model_state_dict raised: {e}")
    if missing:
        errors.append(f"missing adapter tensors ({len(missing)}): {missing}")
    if unexpected:
        errors.append(f"unexpected tensors ({len(unexpected)}): {unexpected}")
    if mismatched:
        errors.append(f"shape mismatches: {mismatched}")
    if peft_unexpected:
        errors.append(f"set_peft_model_state_dict unexpected_keys: {peft_unexpected}")
    print(f"adapter {adapter_folder}: {len(file_sd)} tensors in the file, "
          f"{len(model_sd)} adapter tensors in the model")
    for e in errors:
        print(f"FAIL: {e}")
    ok = not errors
    if expected is not None:
        ok &= compare(logits_of(model, input_ids_of(expected)), expected, tol, "adapter logits")
    return ok


def check_merged(folder, expected, tol):
    model, info = load_base(folder, info=True)
    errors = [f"{k}: {v}" for k, v in info.items()
              if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v]
    for e in errors:
        print(f"FAIL: loading reported {e}")
    ok = not errors
    if expected is None:
        print("FAIL: --merged needs --expected (a merged.safetensors)")
        return False
    ok &= compare(logits_of(model, input_ids_of(expected)), expected, tol, "merged logits")
    return ok


# ------------------------------------------------------------------------------------------
# Self-test


def run_self(args):
    cmd = [sys.executable, str(Path(__file__).resolve())] + [str(a) for a in args]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    return p.returncode, p.stdout + p.stderr


def self_test(fixtures):
    from peft import PeftModel

    fixtures = fixtures.resolve()
    cases = sorted(p for p in fixtures.iterdir() if (p / "adapter_config.json").exists())
    failures = []

    def expect(rc_want, args, label, must_mention=None):
        rc, out = run_self(args)
        good = (rc == 0) == (rc_want == 0) and (must_mention is None or must_mention in out)
        last = [line for line in out.splitlines() if line.startswith(("FAIL", "adapter", "merged"))]
        print(f"  [{'ok' if good else 'WRONG'}] {label}: exit {rc}")
        for line in last[:4]:
            print(f"      {line[:300]}")
        if not good:
            failures.append(label)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for case in cases:
            cfg = json.loads((case / "adapter_config.json").read_text())
            base = REPO / cfg["base_model_name_or_path"]
            exp = case / "expected.safetensors"
            print(f"{case.name} (base {cfg['base_model_name_or_path']})")
            expect(0, [base, case, "--expected", exp], "fixture as committed")

            merged_dir = tmp / f"{case.name}-merged"
            m = PeftModel.from_pretrained(load_base(base), str(case)).merge_and_unload()
            m.save_pretrained(str(merged_dir))
            expect(0, ["--merged", merged_dir, "--expected", case / "merged.safetensors"],
                   "merge_and_unload folder")
            expect(1, ["--merged", base, "--expected", case / "merged.safetensors"],
                   "base folder as if merged (adapter missing)", "FAIL")

            sd = load_file(str(case / "adapter_model.safetensors"))
            names = sorted(sd)
            victim = next(n for n in names if ".lora_B." in n)

            def variant(tag, new_sd):
                d = tmp / f"{case.name}-{tag}"
                shutil.copytree(case, d)
                save_file(new_sd, str(d / "adapter_model.safetensors"), metadata={"format": "pt"})
                return d

            deleted = {k: v for k, v in sd.items() if k != victim}
            expect(1, [base, variant("deleted", deleted), "--expected", exp],
                   f"deleted {victim}", victim)
            renamed = {(k.replace(".lora_B.", ".lora_b.") if k == victim else k): v
                       for k, v in sd.items()}
            expect(1, [base, variant("renamed", renamed), "--expected", exp],
                   "renamed lora_B -> lora_b", victim)
            extra = dict(sd)
            extra["base_model.model.model.extra.lora_A.weight"] = torch.zeros(1, 1)
            expect(1, [base, variant("extra", extra), "--expected", exp],
                   "extra tensor", "extra")
            scaled = dict(sd)
            scaled[victim] = sd[victim] * 1.5
            expect(1, [base, variant("scaled", scaled), "--expected", exp],
                   f"{victim} scaled by 1.5 (names fine, logits not)", "FAIL")
    print("self-test:", "all as expected" if not failures else f"WRONG: {failures}")
    return not failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", nargs="?", type=Path, help="base Hugging Face folder")
    ap.add_argument("adapter", nargs="?", type=Path, help="PEFT adapter folder")
    ap.add_argument("--expected", type=Path, help="safetensors with input_ids and logits")
    ap.add_argument("--merged", type=Path, help="a merged Hugging Face folder to check")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--fixtures", type=Path, default=REPO / "tests" / "data" / "peft")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    if args.self_test:
        return 0 if self_test(args.fixtures) else 1
    if args.merged is not None:
        return 0 if check_merged(args.merged, args.expected, args.tol) else 1
    if args.base is None or args.adapter is None:
        ap.error("give BASE_FOLDER ADAPTER_FOLDER, or --merged FOLDER, or --self-test")
    return 0 if check_adapter(args.base, args.adapter, args.expected, args.tol) else 1


if __name__ == "__main__":
    sys.exit(main())
