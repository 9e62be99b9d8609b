#!/usr/bin/env bash
# Hugging Face Trainer names, lr 0 and the validation split, through the real executable.
# One ctest per case:
#   trainer_names  a ferry file written with TrainingArguments names (tests/data/user_files/
#                  trainer/sft_trainer_args.json) runs; the header lists each name with the
#                  ferry key it became, and the schedule it asked for; a name ferry spells
#                  otherwise (num_train_epochs) stops with what to set; both spellings of one
#                  setting with two values stop naming both
#   lr_zero        optimizer.params.lr 0 (and learning_rate=0) is taken and leaves the weights
#                  as they are: the validation loss is the same after every step (and is not
#                  with lr 1e-2, so the check can fail)
#   validation     data.val_fraction 0: no validation, a final training-loss line; data.val_path:
#                  all of that file validates (the header says so), a missing one is named under
#                  its key; data.val_path beside a fraction is refused
# usage: user_keys.sh CASE FERRY SOURCE_DIR WORKDIR
set -u
case_=$1 ferry=$2 src=$3 work=$4/user-keys-$case_
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
export OMP_NUM_THREADS=1
small=(--config "$src/examples/configs/tiny.json" --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2
       --set model.block_size=32 --set train_micro_batch_size_per_gpu=4 --set device.threads=1
       --set train.eval_every=0 --set train.eval_batches=1 --set train.sample_tokens=0 --set log.every=50
       --set scheduler.params.warmup_num_steps=1 --set scheduler.params.total_num_steps=100)
fail() { echo "FAIL: $*"; echo "--- output:"; tail -20 "$work/out"; exit 1; }
# expect STATUS PATTERN -- command...: the exit status and one line holding PATTERN.
expect() {
  local want=$1 pattern=$2
  shift 3
  timeout 120 "$@" > "$work/out" 2>&1
  local got=$?
  [ "$got" = "$want" ] || fail "exit status $got, expected $want: $*"
  grep -qF -- "$pattern" "$work/out" || fail "no line with '$pattern'"
  echo "ok: exit $got, $(grep -F -- "$pattern" "$work/out" | head -1 | cut -c1-200)"
}
has() { grep -qF -- "$1" "$work/out" || fail "no line with '$1'"; }
# The distinct validation losses of the last run.
val_losses() { grep -oE 'val loss [0-9.]+' "$work/out" | sort -u | wc -l; }

case $case_ in
trainer_names)
  args="$src/tests/data/user_files/trainer/sft_trainer_args.json"
  expect 0 "learning_rate = 0.0002 -> optimizer.params.lr" -- "$ferry" train --config "$args"
  has "gradient_checkpointing = true -> activation_checkpointing.enabled"
  has "per_device_train_batch_size = 4 -> train_micro_batch_size_per_gpu"
  has "optim = \"adamw_torch\" -> optimizer.type = \"AdamW\""
  has "seed = 42 -> model.seed, data.seed"
  has "lr_scheduler_type = \"cosine\", warmup 1 steps (warmup_ratio 0.1 x 10 steps) -> scheduler.type = WarmupCosineLR"
  has "step 10/10"
  expect 2 "unknown key 'num_train_epochs': ferry counts optimizer steps: set train.steps" -- \
    "$ferry" train --config "$args" --set num_train_epochs=3
  # --set replaces a file's value whatever its spelling; one file with both spellings of one
  # setting is refused.
  expect 0 "step 10/10" -- "$ferry" train --config "$args" --set optimizer.params.lr=0.001
  has "WarmupCosineLR: lr 0.001"
  printf '{"data": {"path": "%s"}, "learning_rate": 1e-4, "optimizer": {"params": {"lr": 1e-3}}}\n' \
    "$src/examples/data/kjv.txt" > both.json
  expect 2 "both.json: key 'learning_rate' is 0.0001 but 'optimizer.params.lr' is 0.001" -- \
    "$ferry" train --config both.json
  expect 2 "key 'lr_scheduler_type' is \"polynomial\"" -- "$ferry" train --config "$args" --set lr_scheduler_type=polynomial
  ;;
lr_zero)
  expect 0 "step 4/4" -- "$ferry" train "${small[@]}" --set train.steps=4 --set optimizer.params.lr=0 \
    --set train.eval_every=1 --set optimizer.params.weight_decay=0.1
  [ "$(val_losses)" = 1 ] || fail "lr 0 changed the validation loss: $(grep -oE 'val loss [0-9.]+' "$work/out" | tr '\n' ' ')"
  expect 0 "step 4/4" -- "$ferry" train "${small[@]}" --set train.steps=4 --set learning_rate=0 --set train.eval_every=1
  [ "$(val_losses)" = 1 ] || fail "learning_rate=0 changed the validation loss"
  expect 0 "step 4/4" -- "$ferry" train "${small[@]}" --set train.steps=4 --set optimizer.params.lr=0.01 --set train.eval_every=1
  [ "$(val_losses)" -gt 1 ] || fail "lr 0.01 left the validation loss unchanged: the check cannot tell"
  ;;
validation)
  expect 0 "final training loss" -- "$ferry" train "${small[@]}" --set train.steps=2 --set data.val_fraction=0
  has "no validation data (data.val_fraction 0, no data.val_path)"
  grep -q "val loss" "$work/out" && fail "a run without validation data evaluated"
  head -c 8000 "$src/examples/data/kjv.txt" | tail -c 4000 > eval.txt
  expect 0 "(validation: all of $work/eval.txt)" -- "$ferry" train "${small[@]}" --set train.steps=2 \
    --set data.val_fraction=0 --set data.val_path=eval.txt
  has "4000 validation tokens"
  has "final validation loss"
  expect 1 "data.val_path: cannot open '$work/nope.txt'" -- "$ferry" train "${small[@]}" --set train.steps=2 \
    --set data.val_fraction=0 --set data.val_path=nope.txt
  expect 2 "data.val_path and data.val_fraction 0.05 both choose the validation data" -- \
    "$ferry" train "${small[@]}" --set train.steps=2 --set data.val_path=eval.txt
  ;;
*) fail "unknown case $case_" ;;
esac
echo "PASS: $case_"
