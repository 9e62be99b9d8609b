#!/usr/bin/env bash
# Makes the virtual environment that `ferry bench ... --peers PYTHON` measures ferry
# against: PyTorch, DeepSpeed, and transformers with PEFT and bitsandbytes (bench lora) from
# PyPI, outside the repository.
#
#   bash scripts/make_peers_env.sh [DIR]      # DIR: default $FERRY_PEERS_DIR or $HOME/.ferry-peers
#
# Installs libaio-dev from Debian's packages if missing (DeepSpeed's aio op links it), then
# torch, deepspeed, tokenizers and ninja into DIR with pip, builds DeepSpeed's CPU Adam once (it is
# compiled at first use, with ninja and the system's g++) and prints the Python to pass as
# `--peers` (or to export as FERRY_PEERS_PYTHON). Run again: it keeps what is installed.
# PyPI's torch wheel for Linux x86-64 pulls the CUDA libraries (about 5-6 GB installed);
# PyPI serves no CPU-only build, and CPU use is all the benchmarks need.
# CI does not need this: every benchmark runs without peers (their columns are then absent).
set -euo pipefail

dir="${1:-${FERRY_PEERS_DIR:-$HOME/.ferry-peers}}"
python="${PYTHON:-python3}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "$(realpath -m "$dir")/" in
  "$repo"/*) echo "[peers] $dir is inside the repository; choose a folder outside it" >&2; exit 1 ;;
esac

# Debian packages: libaio-dev (DeepSpeed's aio), g++ (its JIT-built ops), python3-venv;
# installed by setup.sh's rules (skips what is present, root or sudo).
bash "$repo/scripts/setup.sh" libaio-dev g++ python3-venv

if [ ! -x "$dir/bin/python" ]; then
  echo "[peers] creating a virtual environment in $dir with $($python --version 2>&1)"
  "$python" -m venv "$dir"
fi
py="$dir/bin/python"
"$py" -m pip install -q --upgrade pip setuptools wheel
# torch first: DeepSpeed's setup imports it when it is present.
echo "[peers] pip install torch ninja (large: the CUDA libraries come with torch)"
"$py" -m pip install -q torch ninja
echo "[peers] pip install deepspeed tokenizers transformers peft bitsandbytes"
"$py" -m pip install -q deepspeed tokenizers  # tokenizers: ferry bench tokenize --python
"$py" -m pip install -q transformers peft bitsandbytes  # ferry bench lora --peers

# Build DeepSpeed's CPU Adam now (JIT, cached under ~/.cache/torch_extensions), so that the
# first benchmark does not time a compile, and check that it runs.
echo "[peers] building and checking DeepSpeed's CPU Adam"
PATH="$dir/bin:$PATH" DS_ACCELERATOR=cpu "$py" - <<'EOF'
import torch, deepspeed
from deepspeed.ops.adam import DeepSpeedCPUAdam
p = torch.nn.Parameter(torch.ones(1024))
p.grad = torch.full_like(p, 0.5)
opt = DeepSpeedCPUAdam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, adamw_mode=True)
opt.step()
assert abs(p[0].item() - (1 - 1e-3 - 1e-3 * 0.01)) < 1e-5, p[0].item()
print(f"[peers] torch {torch.__version__}, deepspeed {deepspeed.__version__}: DeepSpeedCPUAdam works")
EOF
echo "[peers] size: $(du -sh "$dir" | cut -f1)"
echo "[peers] pass this as --peers (or export FERRY_PEERS_PYTHON):"
echo "$py"
