#!/usr/bin/env bash
# --fsdp reads users' files unchanged: a run from examples/fsdp/fsdp_config.json (the
# Hugging Face Trainer's fsdp_config), from examples/fsdp/accelerate_fsdp.yaml and from
# the Trainer's string form gives exactly the losses of the same run from ferry's own keys.
# Usage: fsdp_equivalence.sh FERRY SOURCE_DIR WORK_DIR
set -euo pipefail
ferry=$1 src=$2 work=$3
mkdir -p "$work" && cd "$work"
rm -f ./*.jsonl ./*.log
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1
short=(--config "$src/examples/configs/llama-tiny.json" --set train.steps=3 --set train.eval_every=0
       --set train.eval_batches=1 --set train.sample_tokens=0 --set log.every=1 --set model.block_size=32
       --set train_micro_batch_size_per_gpu=4)
source "$src/tests/losses.sh"
run() {  # run NAME ARGS...
  local name=$1
  shift
  timeout 120 "$ferry" train "${short[@]}" --set log.metrics="$work/$name.jsonl" "$@" > "$name.log" 2>&1 ||
    fail "$name: $(tail -5 "$name.log")"
  [ "$(losses "$name.jsonl" | wc -l)" -eq 3 ] || fail "$name: not 3 losses in $name.jsonl"
}
identical() {  # identical A B: the same loss lines, to the digit
  [ "$(losses "$1.jsonl")" = "$(losses "$2.jsonl")" ] ||
    fail "$1 and $2 differ:"$'\n'"$(paste <(losses "$1.jsonl") <(losses "$2.jsonl"))"
  echo "$1 = $2: $(losses "$1.jsonl" | tr '\n' ' ')"
}

# FULL_SHARD, BACKWARD_PRE, BFLOAT16 = stage 3, overlap_comm, bf16.
run trainer --fsdp "$src/examples/fsdp/fsdp_config.json"
run ferry --set zero_optimization.stage=3 --set zero_optimization.overlap_comm=true --set bf16.enabled=true
run accelerate --fsdp "$src/examples/fsdp/accelerate_fsdp.yaml"
identical trainer ferry
identical accelerate ferry
# The resolutions are listed in the run folder (beside log.metrics), the header counts them.
grep -q "fsdp_sharding_strategy = FULL_SHARD -> zero_optimization.stage = 3" trainer.run-config.json || fail "no resolution listed"
grep -q "^fsdp config .*fsdp_config.json: [0-9]* keys mapped onto ferry's" trainer.log || fail "no fsdp line on the header"
grep -q "num_processes is 2 but the run has 1 rank" accelerate.log || fail "no num_processes warning"
# The Trainer's words: stage 3 with parameters and optimizer state on the CPU.
run words --fsdp "full_shard auto_wrap offload"
run ferry_offload --set zero_optimization.stage=3 --set zero_optimization.offload_optimizer.device=cpu \
  --set zero_optimization.offload_param.device=cpu
identical words ferry_offload
echo "PASS: --fsdp files give ferry's losses"
