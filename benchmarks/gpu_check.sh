#!/usr/bin/env bash
# The check for a lent GPU machine: at most 8 minutes on a bare H100/H200 from binaries
# built on the development machine (scripts/gpu_carry.sh carries them with the libraries
# the GPU machine lacks: MPICH, Boost, liburing...). Timings first, then the CUDA tests;
# every step under `timeout`, so a hang costs its step's limit and no more.
#
#   here:  bash benchmarks/gpu_check.sh pack [BUILD]   BUILD (default build, FERRY_CUDA on)
#          -> .gpu/gpu.tar.xz, which the device call carries (under 64 MiB)
#   there: bash benchmarks/gpu_check.sh run [OUT]      OUT default gpu-check; writes
#          summary.txt, gpu_check.json, kernels.txt and logs.tar.gz there
#   here:  bash benchmarks/gpu_check.sh kernels CSV    the per-kernel table of an ncu CSV
#          (what `run` does with its profile; CI runs it on a fixture)
#
# The steps, in order, with their limits (seconds): machine 20; attention (the kernels alone
# against PyTorch's SDPA where python3 has torch) 100; model (`ferry bench model --device
# cuda --bf16 --predict`: GPT-2 124M/350M with the real vocabulary, Llama 1B, each with the
# roofline ledger's prediction beside it) 150; kernels (ncu's duration of every kernel of
# one GPT-2 124M forward+backward, set against the ledger: the calibration) 90, then the
# longest of them once more with ncu's sections (why it takes its time) 40; offload
# (`ferry bench step --device cuda --bf16`) 60; qlora (a Llama 8 x 2048: LoRA, QLoRA with
# device.nf4_gemm panel and fused, QLoRA offloaded at stage 3) 90; the CUDA tests 150. Exit status: 0 every
# step passed; 1 a step failed (summary.txt names it); 3 no GPU here.
set -u
cd "$(dirname "$0")/.." || exit 1
verb=${1:-}

# kernels CSV: ncu's `--csv --metrics gpu__time_duration.sum` output -> one line per kernel
# name (demangled, template arguments dropped): launches, total and mean microseconds, share.
kernel_table() {
  awk -F'","' '
    NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); col[$i] = i }; next }
    col["Metric Name"] && $col["Metric Name"] == "gpu__time_duration.sum" {
      name = $col["Kernel Name"]; gsub(/"/, "", name); gsub(/\(anonymous namespace\)::/, "", name)
      sub(/[<(].*/, "", name); sub(/^.* /, "", name); sub(/^.*::/, "", name)
      v = $col["Metric Value"]; gsub(/[",]/, "", v)
      unit = $col["Metric Unit"]; gsub(/"/, "", unit)
      us = unit == "nsecond" || unit == "ns" ? v / 1000 : unit == "msecond" || unit == "ms" ? v * 1000 : unit == "second" ? v * 1e6 : v
      t[name] += us; n[name]++; total += us
    }
    END {
      if (total == 0) { print "no kernel durations in the profile"; exit 1 }
      printf "%-40s %8s %12s %10s %6s\n", "kernel", "launches", "total us", "mean us", "share"
      for (k in t) printf "%-40s %8d %12.1f %10.2f %5.1f%%\n", k, n[k], t[k], t[k] / n[k], 100 * t[k] / total | "sort -k3 -n -r"
      close("sort -k3 -n -r")
      printf "%-40s %8s %12.1f\n", "all kernels", "", total
    }' "$1"
}

case "$verb" in
  pack)
    build=${2:-build}
    [ -x "$build/examples/ferry" ] || { echo "gpu_check: no $build/examples/ferry: build it first" >&2; exit 2; }
    grep -q '^FERRY_CUDA_ENABLED:INTERNAL=ON\|ferry_cuda_kernels' "$build/CMakeCache.txt" "$build/build.ninja" "$build/Makefile" 2>/dev/null ||
      find "$build/nn" -name '*.cu.o' | grep -q . || { echo "gpu_check: $build has no CUDA objects (configure with -DFERRY_CUDA=ON)" >&2; exit 2; }
    bash scripts/gpu_carry.sh pack "$build" .gpu/gpu.tar.xz || exit 1
    size=$(stat -c %s .gpu/gpu.tar.xz)
    [ "$size" -lt $((60 << 20)) ] || { echo "gpu_check: .gpu/gpu.tar.xz is $size bytes, over the device call's 64 MiB" >&2; exit 1; }
    exit 0
    ;;
  kernels)
    kernel_table "${2:?usage: gpu_check.sh kernels CSV}"
    exit $?
    ;;
  run) ;;
  *)
    echo "usage: bash benchmarks/gpu_check.sh pack [BUILD] | run [OUT] | kernels CSV" >&2
    exit 2
    ;;
esac

out=${2:-gpu-check}
mkdir -p "$out/logs"
summary=$out/summary.txt
json=$out/gpu_check.json
failed=0
: >"$json.steps"
# The whole check ends by GPU_CHECK_SECONDS (default 480: the 8 minutes a lent machine's
# call is sized for): each step's limit is cut to what is left, and a step with under 10 s
# left is skipped, so the summary is always written.
deadline=${GPU_CHECK_SECONDS:-480}

# step NAME LIMIT COMMAND...: COMMAND under `timeout LIMIT`, its output in logs/NAME.log;
# one summary line and one JSON object per step.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((deadline - SECONDS - 5))
  if [ "$left" -lt 10 ]; then
    printf '%-12s skipped: the check reached GPU_CHECK_SECONDS=%s\n' "$name" "$deadline" >>"$summary"
    printf '{"step": "%s", "skipped": true}\n' "$name" >>"$json.steps"
    failed=1
    return 1
  fi
  [ "$limit" -le "$left" ] || limit=$left
  local start=$SECONDS
  timeout --kill-after=5 "$limit" "$@" >"$out/logs/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - start))
  local note=""
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && note="timed out at ${limit}s"
  printf '%-12s exit %-3s %4ss  %s\n' "$name" "$rc" "$took" "$note" >>"$summary"
  printf '{"step": "%s", "exit": %d, "seconds": %d, "limit": %d}\n' "$name" "$rc" "$took" "$limit" >>"$json.steps"
  [ "$rc" -eq 0 ] || failed=1
  return "$rc"
}

echo "ferry GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" >"$summary"
if ! nvidia-smi -L >"$out/logs/gpus.log" 2>&1; then
  echo "no GPU: nvidia-smi -L failed (logs/gpus.log); this is for a machine with a GPU" | tee -a "$summary"
  exit 3
fi
cat "$out/logs/gpus.log" >>"$summary"
if [ -f .gpu/gpu.tar.xz ]; then
  # shellcheck disable=SC1091
  source scripts/gpu_carry.sh unpack .gpu/gpu.tar.xz >"$out/logs/unpack.log" 2>&1 || { cat "$out/logs/unpack.log"; exit 1; }
  ferry=/tmp/ferry-carry/bin/ferry
  tests=/tmp/ferry-carry/bin
else
  ferry=${FERRY_BIN:-build/examples/ferry}
  tests=$(dirname "$ferry")/../tests
fi
[ -x "$ferry" ] || { echo "no ferry binary ($ferry): pack one here first" | tee -a "$summary"; exit 1; }
echo "--- steps (exit, seconds)" >>"$summary"

step machine 20 bash -c 'nvidia-smi; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv; nvcc --version'
# --predict where this build has the roofline ledger (the prediction beside each measurement).
predict=$("$ferry" bench model --help 2>&1 | grep -q -- --predict && echo --predict)
step model 150 "$ferry" bench model --device cuda --bf16 $predict --json "$out/model.json"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
# GPU_CHECK_NO_NCU=1 leaves the profile out (a short lease that has one already).
if [ -n "$ncu" ] && [ -z "${GPU_CHECK_NO_NCU:-}" ]; then
  # One forward+backward of GPT-2 124M (the warm-up step's kernels; the caches are left warm
  # between kernels, as in a step) and of Llama 1B, each kernel's duration once.
  step kernels 90 bash -c "'$ncu' --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-kernel-base function \
    --launch-count 700 '$ferry' bench model --device cuda --bf16 --quick --only gpt2-124m >'$out/logs/ncu_gpt2.csv' &&
    '$ncu' --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-kernel-base function \
    --launch-count 800 '$ferry' bench model --device cuda --bf16 --quick --only llama-1b >'$out/logs/ncu_llama.csv'"
  { echo "== GPT-2 124M (B 8, T 1024), one forward+backward"; kernel_table <(grep '^"' "$out/logs/ncu_gpt2.csv")
    echo "== Llama 1B (B 4, T 2048), one forward+backward"; kernel_table <(grep '^"' "$out/logs/ncu_llama.csv"); } \
    >"$out/kernels.txt" 2>&1
  # The GPT-2 step's longest kernel, one launch, with the sections that say why it takes its
  # time (throughput against the ceilings, occupancy and its limiter, warp stall reasons):
  # what the next session works on, read without spending device time on it.
  top=$(awk 'f && NF { print $1; exit } /^kernel /{ f = 1 }' "$out/kernels.txt")
  if [ -n "$top" ]; then
    step top_kernel 40 "$ncu" --clock-control none -k "regex:$top" --launch-count 1 --section SpeedOfLight \
      --section Occupancy --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
      "$ferry" bench model --device cuda --bf16 --quick --only gpt2-124m
    cp "$out/logs/top_kernel.log" "$out/top_kernel.txt" 2>/dev/null
  fi
else
  why="no ncu on this machine"
  [ -n "${GPU_CHECK_NO_NCU:-}" ] && why="GPU_CHECK_NO_NCU is set"
  echo "kernels      skipped: $why" >>"$summary"
fi
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  step attention 80 "$ferry" bench attention --device cuda --bf16 --python python3 --json "$out/attention.json"
else
  step attention 80 "$ferry" bench attention --device cuda --bf16 --json "$out/attention.json"
fi
mkdir -p /tmp/ferry-gpu-check-nvme
step offload 60 "$ferry" bench step --device cuda --bf16 --nvme-path /tmp/ferry-gpu-check-nvme --json "$out/offload.json"
# Adapters on a Llama 8 x 2048, 12 steps each (the step lines carry tokens/s and PCIe bytes
# a parameter): LoRA on the bf16 base; QLoRA with the base multiplied from panels (cuBLAS)
# and fused (nn/cuda/nf4_gemm.cu); QLoRA at stage 3 with the base and optimizer in host memory.
step qlora 90 bash -c "for s in 'lora.base_dtype=compute' 'device.nf4_gemm=panel' 'device.nf4_gemm=fused' \
  'zero_optimization.stage=3 --set zero_optimization.offload_param.device=cpu --set zero_optimization.offload_optimizer.device=cpu'; do
  echo \"--set \$s\"; '$ferry' train --config benchmarks/gpu_qlora.json --set \$s | grep -E '^step (8|12)/'; done"
for t in test_device test_backend_ops test_fused_ops test_cuda_training; do
  [ -x "$tests/$t" ] && step "$t" 150 "$tests/$t" --log_level=message
done

{
  echo "--- bench model (tokens/s, MFU against 989 TFLOP/s; the ledger's prediction beside)"
  grep -E 'FLOPs per token|^ *(config|tiny|gpt2|llama)|predict' "$out/logs/model.log"
  echo "--- attention alone"
  tail -12 "$out/logs/attention.log"
  echo "--- kernels (kernels.txt: first rows)"
  [ -f "$out/kernels.txt" ] && grep -A12 '^==' "$out/kernels.txt"
  [ -f "$out/top_kernel.txt" ] && { echo "--- the longest kernel (top_kernel.txt)"
    grep -E '^  [a-z_]+.*\(|Duration|Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Stall|Warp Cycles Per Issued' "$out/top_kernel.txt" | head -30; }
  echo "--- offload"
  grep -E 'overlapped|sequential|alone|bytes/param' "$out/logs/offload.log"
  echo "--- adapters: LoRA, QLoRA from panels and fused, QLoRA offloaded (tokens/s, PCIe B/param)"
  cat "$out/logs/qlora.log"
  echo "--- CUDA tests"
  grep -hE 'No errors detected|failure|error:' "$out"/logs/test_*.log | head -20
  echo "--- result: $([ "$failed" -eq 0 ] && echo 'every step passed' || echo 'a step failed (exit column above)')"
} >>"$summary" 2>/dev/null
{
  printf '{"commit": "%s", "gpu": "%s", "failed": %s, "steps": [' "$(git rev-parse --short HEAD 2>/dev/null)" \
    "$(head -1 "$out/logs/gpus.log")" "$failed"
  paste -sd, "$json.steps"
  printf '], "model": %s, "attention": %s, "offload": %s}\n' "$(cat "$out/model.json" 2>/dev/null || echo null)" \
    "$(cat "$out/attention.json" 2>/dev/null || echo null)" "$(cat "$out/offload.json" 2>/dev/null || echo null)"
} >"$json"
rm -f "$json.steps" "$out/model.json" "$out/attention.json" "$out/offload.json"
tar czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$out/logs"
cat "$summary"
exit "$failed"
