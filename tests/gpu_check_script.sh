#!/usr/bin/env bash
# The parts of benchmarks/gpu_check.sh that run without a GPU: the per-kernel table it makes
# of an ncu profile (a fixture with four launches, three kernels, three time units, a
# thousands separator and an anonymous namespace), and its refusal on a machine with no GPU.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
script=$root/benchmarks/gpu_check.sh
fail() { echo "FAIL: $*"; exit 1; }

table=$(bash "$script" kernels "$root/tests/data/gpu_check/ncu_sample.csv") || fail "kernels exited $?: $table"
echo "$table"
# Sorted by total time, the largest first; each kernel's launches, total and mean.
first=$(echo "$table" | sed -n 2p)
[[ $first == flash_attention_forward* ]] || fail "the largest kernel is not first: $first"
echo "$table" | grep -Eq '^layernorm_forward +2 +20\.0 +10\.00 +6\.7%$' || fail "layernorm_forward: 2 launches, 20 us"
echo "$table" | grep -Eq '^flash_attention_forward +1 +249\.5 ' || fail "milliseconds read as microseconds x 1000"
echo "$table" | grep -Eq '^all kernels +300\.0$' || fail "the total is not 300.0 us"
empty=$(mktemp)
echo '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"' >"$empty"
if bash "$script" kernels "$empty" >/dev/null; then rm -f "$empty"; fail "a profile with no durations passed"; fi
rm -f "$empty"

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  out=$(mktemp -d)
  bash "$script" run "$out" >/dev/null 2>&1
  rc=$?
  [ "$rc" -eq 3 ] || fail "run without a GPU exited $rc, not 3"
  grep -q 'no GPU' "$out/summary.txt" || fail "no 'no GPU' line in summary.txt"
  rm -rf "$out"
fi
bash "$script" nonsense >/dev/null 2>&1 && fail "an unknown verb passed"
echo "gpu_check.sh: the kernel table and the no-GPU refusal as expected"
