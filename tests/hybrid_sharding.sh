#!/usr/bin/env bash
# Hybrid sharding (zero_optimization.shard_group_size, DeepSpeed's mics_shard_size) on 4
# ranks of this machine:
#   - groups of 2 at stages 1-3 give the single process's losses, and only gradient
#     shards cross groups (the all-reduce bytes are half a model per rank per step);
#   - a hybrid checkpoint resumes at other layouts (2 ranks plain, 1 process) and a plain
#     one resumes hybrid, continuing the uninterrupted losses;
#   - hpZ (zero_hpz_partition_size 2): node copies serve the later gathers, same losses,
#     also with nvme parameters and 2 micro-batches;
#   - a group size that does not divide the world, stage 0, hpZ below stage 3 or not
#     dividing the group are refused naming the key.
# Usage: hybrid_sharding.sh MPIEXEC FERRY SOURCE_DIR WORK_DIR [sanitizer]
# `sanitizer` (the ASan build: 4 ranks of it on two cores took 172 s for the whole script)
# runs each code path once: stage 3 hybrid, hpZ, a hybrid checkpoint resumed plain, two
# refusals; the release build runs every variant.
set -uo pipefail
mpiexec=$1 ferry=$2 src=$3 work=$4 mode=${5:-full}
full() { [ "$mode" = full ]; }
mkdir -p "$work" && cd "$work" || exit 1
rm -rf ./*
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1
common=(--config "$src/examples/configs/tiny-model.json" --set train.eval_batches=1 --set train.sample_tokens=0
        --set train_batch_size=16 --set train_micro_batch_size_per_gpu=4 --set device.threads=1 --set log.every=1)
source "$src/tests/losses.sh"
run() {  # run NAME RANKS ARGS...
  local name=$1 np=$2
  shift 2
  timeout 300 "$mpiexec" -n "$np" "$ferry" train "${common[@]}" --set log.metrics="$work/$name.jsonl" "$@" \
    > "$name.log" 2>&1 || fail "$name: $(grep -v '^ ' "$name.log" | tail -5)"
}

stages="1 2 3"
full || stages=3
for stage in $stages; do
  run ref$stage 1 --set train.steps=3 --set zero_optimization.stage=$stage
  run hyb$stage 4 --set train.steps=3 --set zero_optimization.stage=$stage --set zero_optimization.shard_group_size=2
  same_losses ref$stage.jsonl hyb$stage.jsonl || fail "stage $stage, groups of 2"
  grep -q "hybrid: sharded within 2 groups of 2 ranks" hyb$stage.log || fail "no hybrid layout line: $(grep 'state lives' hyb$stage.log)"
  # Across groups only this rank's gradient shard moves: 842,496 parameters / 2 x 4 bytes.
  ar=$(grep -o '"all_reduce":[0-9]*' hyb$stage.jsonl | head -1 | cut -d: -f2)
  [ "$ar" = 1684992 ] || fail "stage $stage: $ar bytes all-reduced across groups per step, not 1684992 (half the fp32 model)"
  echo "stage $stage: groups of 2 on 4 ranks give the single process's losses; $ar bytes per rank per step across groups"
done

# hpZ: node copies serve every gather after a unit's first in the step; the same losses.
# With parameters on nvme and 2 micro-batches, reads ahead for units whose node copy is
# ready are dropped. The trace names the gathers from node copies.
run hpz 4 --set train.steps=3 --set zero_optimization.stage=3 --set zero_optimization.zero_hpz_partition_size=2 \
  --set log.trace="$work/hpz-trace.json"
same_losses ref3.jsonl hpz.jsonl || fail "hpZ, node groups of 2"
grep -q "(node copy)" hpz-trace*.json || fail "no gather from the node copies in the trace"
grep -q "hpZ: a node copy of the weights over groups of 2 ranks" hpz.log || fail "no hpZ layout line"
echo "hpZ: node groups of 2 give the single process's losses"
if full; then
run ref3m 1 --set train.steps=3 --set zero_optimization.stage=3 --set train_micro_batch_size_per_gpu=2
mkdir -p nvme
run hpznvme 4 --set train.steps=3 --set zero_optimization.stage=3 --set zero_optimization.zero_hpz_partition_size=2 \
  --set train_micro_batch_size_per_gpu=2 --set zero_optimization.offload_param.device=nvme \
  --set zero_optimization.offload_param.nvme_path="$work/nvme" --set zero_optimization.shard_group_size=4
same_losses ref3m.jsonl hpznvme.jsonl || fail "hpZ with parameters on nvme, 2 micro-batches"
echo "hpZ: node groups of 2 give the single process's losses (also with nvme parameters and 2 micro-batches)"
fi

if full; then
# DeepSpeed's spelling, from a DeepSpeed file.
# (DeepSpeed's defaults differ from a ferry file's, so the reference reads a DeepSpeed file too.)
printf '{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}}\n' > ds-plain.json
printf '{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3, "mics_shard_size": 2}}\n' > ds.json
run ds-plain 1 --set train.steps=3 --deepspeed ds-plain.json
run ds 4 --set train.steps=3 --deepspeed ds.json
same_losses ds-plain.jsonl ds.jsonl || fail "mics_shard_size 2 from a DeepSpeed file"
grep -q "hybrid: sharded within 2 groups of 2 ranks" ds.log || fail "mics_shard_size not taken: $(grep 'state lives' ds.log)"
fi

# Checkpoints across layouts: hybrid -> plain 2 ranks, hybrid -> 1 process, plain 2 ranks -> hybrid.
run full 4 --set train.steps=4 --set zero_optimization.stage=3 --set zero_optimization.shard_group_size=2
run save 4 --set train.steps=2 --set zero_optimization.stage=3 --set zero_optimization.shard_group_size=2 \
  --set checkpoint.dir="$work/ck-hyb"
[ "$(ls ck-hyb/step-*2/*.bin 2>/dev/null | wc -l)" = 2 ] || fail "the hybrid checkpoint should hold 2 ranks' files (one group): $(ls ck-hyb/*/)"
cp -a ck-hyb ck-hyb-again  # each resume saves its own end over `latest`
run resume2 2 --set train.steps=4 --set zero_optimization.stage=3 --set checkpoint.dir="$work/ck-hyb" --set checkpoint.resume=auto
same_losses full.jsonl resume2.jsonl 2 || fail "a hybrid checkpoint resumed on 2 plain ranks"
echo "checkpoints: hybrid -> 2 plain ranks continues the losses"
if full; then
run resume1 1 --set train.steps=4 --set zero_optimization.stage=2 --set checkpoint.dir="$work/ck-hyb-again" --set checkpoint.resume=auto
same_losses full.jsonl resume1.jsonl 2 || fail "a hybrid checkpoint resumed by one process"
run plain 2 --set train.steps=2 --set zero_optimization.stage=3 --set checkpoint.dir="$work/ck-plain"
run resume4 4 --set train.steps=4 --set zero_optimization.stage=3 --set zero_optimization.shard_group_size=2 \
  --set checkpoint.dir="$work/ck-plain" --set checkpoint.resume=auto
same_losses full.jsonl resume4.jsonl 2 || fail "a plain checkpoint resumed hybrid"
echo "checkpoints: hybrid -> 2 plain ranks, hybrid -> 1 process, 2 plain ranks -> hybrid continue the losses"
fi

# Refusals name the key.
bads=("shard_group_size 3 3" "shard_group_size 2 0" "zero_hpz_partition_size 2 2" "zero_hpz_partition_size 3 3")
full || bads=("shard_group_size 3 3" "zero_hpz_partition_size 2 2")
for bad in "${bads[@]}"; do
  read -r key value stage <<<"$bad"
  if timeout 60 "$mpiexec" -n 4 "$ferry" train "${common[@]}" --set zero_optimization.stage=$stage \
       --set zero_optimization.$key=$value > bad.log 2>&1; then fail "$key $value at stage $stage accepted"; fi
  grep -q "zero_optimization.$key $value" bad.log || fail "no message naming the key: $(tail -3 bad.log)"
done
echo "PASS: hybrid sharding"
