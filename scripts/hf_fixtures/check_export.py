#!/usr/bin/env python3
"""Loads a folder `ferry export --hf` wrote with transformers and compares its logits on the
fixture's fixed input with the fixture's expected logits (the folder exported from an
import without training must give the same model).

  /work/venv-hf/bin/python scripts/hf_fixtures/check_export.py OUT tests/data/hf/NAME/expected.safetensors
"""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

out, expected = sys.argv[1], sys.argv[2]
e = load_file(expected)
m = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
with torch.no_grad():
    logits = m(e["input_ids"].long()).logits
diff = (logits - e["logits"]).abs().max().item()
print(f"{out}: {type(m).__name__}, max |logit - expected| {diff:.3g}")
sys.exit(0 if diff <= 1e-4 * e["logits"].abs().max().item() else 1)
