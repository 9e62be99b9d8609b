#!/usr/bin/env bash
# The guides' commands that no other test runs, each shortened (a few steps, a scratch
# folder) and each checked by what it prints or writes:
#   configuration.md  ferry train --config examples/configs/tiny.json --set device.memory=2GiB
#                     --set log.metrics=FILE: one metrics line per step
#   models.md         ferry train --config examples/configs/llama-tiny.json: a Llama trains;
#                     ferry plan ... --set model.preset=llama-8b ... --ranks 8: Meta's 8B count;
#                     ferry train --config examples/configs/tiny.json --set bf16.enabled=true
#   monitoring.md     --set log.tensorboard=DIR: an event file
#   several-ranks.md  mpiexec -n 4 ferry train ... --set zero_optimization.stage=3
#   checkpoints.md    checkpoint.dir, --resume auto, at 2 ranks a checkpoint saved at 1,
#                     ferry export --checkpoint ckpt --out model.safetensors --dtype bf16
# Usage: doc_walkthroughs.sh MPIEXEC FERRY SOURCE_DIR WORK_DIR. Prints PASS: the guides'
# commands at the end; FAIL: and the output of the failing command otherwise.
set -uo pipefail
mpiexec=$1 ferry=$2 src=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
short=(--set train.steps=4 --set train.eval_every=0 --set train.eval_batches=1 --set train.sample_tokens=0
       --set log.every=1 --set model.block_size=32 --set train_micro_batch_size_per_gpu=4)
tiny=$src/examples/configs/tiny.json
export OMP_NUM_THREADS=1

# configuration.md
out=$("$ferry" train --config "$tiny" "${short[@]}" --set device.memory=2GiB --set log.metrics=run.jsonl 2>&1) ||
  fail "train tiny.json: $out"
[[ $(grep -c '"step"' run.jsonl) -ge 4 ]] || fail "run.jsonl has fewer than 4 step lines: $(cat run.jsonl)"
out=$("$ferry" train --help-config 2>&1) || fail "--help-config: $out"
grep -q '^| `train.steps`' <<<"$out" || fail "--help-config does not list train.steps: $out"

# models.md
out=$("$ferry" train --config "$src/examples/configs/llama-tiny.json" "${short[@]}" 2>&1) || fail "llama-tiny: $out"
grep -q 'step 4/4 | loss' <<<"$out" || fail "llama-tiny did not train: $out"
out=$("$ferry" plan --config "$src/examples/configs/llama-tiny.json" --set model.preset=llama-8b \
      --set train_micro_batch_size_per_gpu=1 --set activation_checkpointing.enabled=true \
      --set device.memory=141GB --ranks 8 --host-memory 256GiB 2>&1) || fail "plan llama-8b: $out"
grep -q '8030261248 parameters; 8 ranks' <<<"$out" || fail "plan llama-8b: not Meta's 8,030,261,248 parameters at 8 ranks: $out"
out=$("$ferry" train --config "$tiny" "${short[@]}" --set bf16.enabled=true 2>&1) || fail "bf16: $out"
grep -q 'bf16 activations' <<<"$out" || fail "bf16 run does not say bf16 activations: $out"

# monitoring.md
out=$("$ferry" train --config "$tiny" "${short[@]}" --set log.tensorboard=tb 2>&1) || fail "tensorboard: $out"
ls tb/events.out.tfevents.* >/dev/null 2>&1 || fail "no event file in tb/: $(ls -la tb 2>&1)"

# several-ranks.md
out=$("$mpiexec" -n 4 "$ferry" train --config "$tiny" "${short[@]}" --set zero_optimization.stage=3 2>&1) ||
  fail "4 ranks, stage 3: $out"
grep -q 'ZeRO stage 3' <<<"$out" || fail "not stage 3: $out"
grep -q 'step 4/4 | loss' <<<"$out" || fail "4 ranks did not train: $out"

# checkpoints.md: save every 2 steps, resume to 6, resume at 2 ranks to 8, export.
out=$("$ferry" train --config "$tiny" "${short[@]}" --set checkpoint.dir=ckpt --set checkpoint.every_steps=2 2>&1) ||
  fail "checkpointed run: $out"
[[ -d ckpt/step-00000004 ]] || fail "no checkpoint of step 4: $(ls ckpt)"
out=$("$ferry" train --config "$tiny" "${short[@]}" --set train.steps=6 --set checkpoint.dir=ckpt --resume auto 2>&1) ||
  fail "resume: $out"
grep -q 'step 5/6 | loss' <<<"$out" || fail "resume did not continue at step 5: $out"
out=$("$mpiexec" -n 2 "$ferry" train --config "$tiny" "${short[@]}" --set train.steps=8 --set checkpoint.dir=ckpt \
      --resume auto 2>&1) || fail "resume at 2 ranks: $out"
grep -q 'step 7/8 | loss' <<<"$out" || fail "resume at 2 ranks did not continue at step 7: $out"
out=$("$ferry" export --checkpoint ckpt --out model.safetensors --dtype bf16 2>&1) || fail "export: $out"
[[ -s model.safetensors ]] || fail "export wrote no model.safetensors: $out"

echo "PASS: the guides' commands (configuration, models, monitoring, several ranks, checkpoints)"
