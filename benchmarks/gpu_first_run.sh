#!/usr/bin/env bash
# What to run on the first GPU: builds ferry with CUDA (Release), runs `ferry doctor --gpu`,
# the CUDA tests and the two tests whose tolerances a real GPU has never been measured
# against, a 2-rank NCCL run where there are two GPUs, and writes one summary file to hand
# back with its logs (docs/design/gpu-questions.md).
#
#   bash benchmarks/gpu_first_run.sh [OUT]   (OUT, under the repository root: gpu-first-run)
#
# Exit status: 0 every step passed; 1 a step failed (the summary names it); 3 no GPU here.
# Environment: FERRY_GPU_BUILD (build folder, default build-gpu), JOBS (default nproc).
set -u
cd "$(dirname "$0")/.." || exit 1
out=${1:-gpu-first-run}
build=${FERRY_GPU_BUILD:-build-gpu}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
summary=$out/summary.txt
failed=0

# step NAME COMMAND...: runs COMMAND with its output in OUT/NAME.log; one summary line.
step() {
  local name=$1
  shift
  local start=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  printf '%-16s exit %-3s %5ss  %s\n' "$name" "$rc" "$((SECONDS - start))" "$out/$name.log" >>"$summary"
  [ "$rc" -eq 0 ] || failed=1
  return "$rc"
}

{
  echo "ferry first GPU run, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "host $(hostname); CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}" \
       "NVIDIA_TF32_OVERRIDE=${NVIDIA_TF32_OVERRIDE-<unset>} MPIR_CVAR_ENABLE_GPU=${MPIR_CVAR_ENABLE_GPU-<unset>}"
} >"$summary"

if ! nvidia-smi -L >"$out/gpus.log" 2>&1; then
  echo "no GPU: nvidia-smi -L failed (see $out/gpus.log); this script is for a machine with a GPU" | tee -a "$summary"
  exit 3
fi
gpus=$(grep -c '^GPU ' "$out/gpus.log")
{ echo "GPUs: $gpus"; cat "$out/gpus.log"; } >>"$summary"
{ nvidia-smi; nvcc --version; mpichversion; mpiexec --version; } >"$out/machine.log" 2>&1
echo "--- steps" >>"$summary"

step configure cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFERRY_CUDA=ON || {
  cat "$summary"
  exit 1
}
step build cmake --build "$build" -j"$jobs" || {
  cat "$summary"
  exit 1
}
ferry=$build/examples/ferry

# Q1, Q5, F5, the memory and the versions: one line per check.
step doctor "$ferry" doctor --gpu
# The CUDA tests. cli_cuda_unavailable asserts that there is *no* GPU, so it is left out here.
step ctest_cuda ctest --test-dir "$build" -R cuda -E 'cli_cuda_unavailable|bench_step_cuda_unavailable' --output-on-failure
# Q2: the margins the tolerances leave on a real GPU (worst errors printed at message level).
step backend_ops "$build/tests/test_backend_ops" --log_level=message
step cuda_training "$build/tests/test_cuda_training" --log_level=message
# Q4, Q8: NCCL between two ranks (host-staged order checks in step 1, the watchdog at its
# default timeout), only where there are two GPUs.
if [ "$gpus" -ge 2 ]; then
  step nccl_2ranks mpiexec -n 2 "$ferry" train --config examples/configs/tiny.json \
    --set device.type=cuda --set train.steps=20
fi

# Issue 17: the bf16 model bench (MFU against cuBLAS's GEMM), then ZeRO-3 bf16 with the
# optimizer and parameters offloaded to cpu and to nvme: the step lines give TFLOP/s, the
# breakdown (upload/download/collectives/compute busy against the wall: the overlap) and
# the PCIe bytes per parameter, to set against docs/design/zero.md's formula (bf16: 2 x 2/N up,
# 4/N down per micro-batch, plus a third upload of the tied embedding).
step bench_model_bf16 "$ferry" bench model --device cuda --bf16
# Issue 25: the same with the SIMT attention kernels, against the tensor cores auto picks above.
step bench_model_bf16_simt "$ferry" bench model --device cuda --bf16 --attention-kernel simt
step bench_contexts_bf16 "$ferry" bench model --device cuda --bf16 --contexts 256,1024,4096,8192
# Issue 25: the attention kernels alone at contexts 256-8192, SIMT and tensor cores alternated,
# against PyTorch's SDPA where the machine's python3 has torch with CUDA (the ratio column).
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  step bench_attention "$ferry" bench attention --device cuda --bf16 --python python3
else
  step bench_attention "$ferry" bench attention --device cuda --bf16
fi
step bench_step_cuda "$ferry" bench step --device cuda --bf16 --nvme-path "${FERRY_NVME_PATH:-$out}" \
  --json "$out/bench_step_cuda.json"
gpt2=(--config examples/configs/tiny.json --set device.type=cuda --set bf16.enabled=true
      --set zero_optimization.stage=3 --set model.n_layer=12 --set model.n_head=12 --set model.n_embd=768
      --set model.block_size=1024 --set train_micro_batch_size_per_gpu=8 --set train.steps=30
      --set train.eval_every=0 --set log.every=5 --set device.memory=16GiB)
step zero3_offload_cpu "$ferry" train "${gpt2[@]}" --set zero_optimization.offload_optimizer.device=cpu \
  --set zero_optimization.offload_param.device=cpu --set log.trace="$out/zero3_cpu.trace.json"
nvme_dir=${FERRY_NVME_PATH:-$out/nvme}
mkdir -p "$nvme_dir"
step zero3_offload_nvme "$ferry" train "${gpt2[@]}" --set zero_optimization.offload_optimizer.device=nvme \
  --set zero_optimization.offload_optimizer.nvme_path="$nvme_dir" --set zero_optimization.offload_param.device=nvme \
  --set zero_optimization.offload_param.nvme_path="$nvme_dir" --set log.trace="$out/zero3_nvme.trace.json"

{
  echo "--- issue 17: bf16 model bench and ZeRO-3 offloaded runs (last step lines)"
  tail -3 "$out/bench_model_bf16.log"
  echo "--- issue 25: SIMT attention (bench model), contexts, attention alone (simt and tensor_cores rows)"
  tail -3 "$out/bench_model_bf16_simt.log"
  tail -6 "$out/bench_contexts_bf16.log"
  tail -11 "$out/bench_attention.log"
  grep -E 'overlapped|sequential|alone|bytes/param' "$out/bench_step_cuda.log"
  grep -h '^step ' "$out/zero3_offload_cpu.log" | tail -2
  grep -h '^step ' "$out/zero3_offload_nvme.log" | tail -2
  echo "--- ferry doctor --gpu"
  cat "$out/doctor.log"
  echo "--- CUDA tests"
  grep -E 'tests passed|tests failed|\*\*\*Failed|Not Run|Skipped' "$out/ctest_cuda.log"
  echo "--- margins (Q2)"
  grep -hE 'relative|worst window|validation' "$out/backend_ops.log" "$out/cuda_training.log" | sort | uniq | head -80
  [ -f "$out/nccl_2ranks.log" ] && { echo "--- 2-rank NCCL run (last lines)"; tail -5 "$out/nccl_2ranks.log"; }
  echo "--- result: $([ "$failed" -eq 0 ] && echo 'every step passed' || echo 'a step failed (exit column above)')"
} >>"$summary"
cat "$summary"
exit "$failed"
