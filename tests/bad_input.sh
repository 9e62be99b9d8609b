#!/usr/bin/env bash
# Bad input the way users get it wrong, through the real executable: each case ends with
# one message naming what is wrong, a non-zero exit status, and nothing already saved lost.
# One ctest per case (docs/guide/troubleshooting.md's table lists them):
#   wrong_path         a config file or a data file that is not there
#   half_written       a checkpoint whose save was cut off (no manifest), and a save's leftovers
#   other_model        a checkpoint of another model shape
#   newer_ferry        a config key this ferry does not know, a checkpoint of a newer format
#   deepspeed_typo     a DeepSpeed file with a key misspelt
#   token_width        a token file whose size is not a whole number of uint16 ids
#   missing_shard      a sharded model folder with one shard gone
#   full_disk          an NVMe folder on a file system too small for it (a 256 KiB tmpfs for
#                      813 KiB of optimizer state; needs root, else it skips)
#   ranks_beyond_data  mpiexec -n 2 on a data file shorter than one window
# usage: bad_input.sh CASE MPIEXEC FERRY CONFIG WORKDIR
set -u
case_=$1 mpiexec=$2 ferry=$3 config=$4 work=$5/bad-input-$case_
rm -rf "$work" && mkdir -p "$work"
small=(--config "$config" --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2
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
  echo "ok: exit $got, $(grep -F -- "$pattern" "$work/out" | head -1)"
}
train_ok() {  # a clean run that must succeed
  timeout 300 "$ferry" train "${small[@]}" "$@" > "$work/ok" 2>&1 || { tail -20 "$work/ok"; fail "clean run failed: $*"; }
}
same_files() {  # DIR SNAPSHOT: nothing under DIR changed since the snapshot
  (cd "$1" && find . -type f -exec sha256sum {} + | sort) > "$work/after"
  diff -q "$2" "$work/after" > /dev/null || fail "files under $1 changed"
}
snapshot() { (cd "$1" && find . -type f -exec sha256sum {} + | sort) > "$2"; }

case $case_ in
wrong_path)
  expect 2 "$work/nope.json" -- "$ferry" train --config "$work/nope.json"
  expect 1 "data.path: cannot open '$work/nope.txt'" -- "$ferry" train "${small[@]}" --set data.path="$work/nope.txt" --set train.steps=1
  ;;
half_written)
  ck=$work/ck
  train_ok --set train.steps=2 --set checkpoint.dir="$ck"
  snapshot "$ck/step-00000002" "$work/before"
  # A save cut off before its manifest: the step folder exists, the manifest does not.
  cp -r "$ck/step-00000002" "$ck/step-00000003" && rm "$ck/step-00000003/manifest.json"
  mkdir -p "$ck/.tmp-step-00000004" && head -c 1000 /dev/urandom > "$ck/.tmp-step-00000004/rank-00000.bin"
  expect 1 "manifest.json is missing (an incomplete checkpoint" -- \
    "$ferry" train "${small[@]}" --set train.steps=4 --set checkpoint.dir="$ck" --set checkpoint.resume="$ck/step-00000003"
  grep -qF "$ck/step-00000003" "$work/out" || fail "the message does not name the checkpoint"
  same_files "$ck/step-00000002" "$work/before"
  # --resume auto follows `latest`, past both leftovers.
  train_ok --set train.steps=3 --set checkpoint.dir="$ck" --resume auto
  grep -qF "resumed from $ck/step-00000002" "$work/ok" || fail "auto did not resume from the last complete checkpoint"
  ;;
other_model)
  ck=$work/ck
  train_ok --set train.steps=2 --set checkpoint.dir="$ck"
  snapshot "$ck" "$work/before"
  expect 1 "model.n_embd is 32 in the checkpoint but 64 in the config" -- \
    "$ferry" train "${small[@]}" --set model.n_embd=64 --set train.steps=3 --set checkpoint.dir="$ck" --resume auto
  same_files "$ck" "$work/before"
  ;;
newer_ferry)
  printf '{"model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 256, "block_size": 32, "n_expert": 8}}\n' > "$work/new.json"
  expect 2 "unknown key 'model.n_expert'" -- "$ferry" train --config "$work/new.json"
  grep -qF "$work/new.json" "$work/out" || fail "the message does not name the file"
  ck=$work/ck
  train_ok --set train.steps=2 --set checkpoint.dir="$ck"
  sed -i 's/"format_version": *1/"format_version": 99/' "$ck/step-00000002/manifest.json"
  grep -q '"format_version": 99' "$ck/step-00000002/manifest.json" || fail "could not edit the manifest"
  expect 1 "checkpoint format version 99" -- \
    "$ferry" train "${small[@]}" --set train.steps=3 --set checkpoint.dir="$ck" --resume auto
  [ -f "$ck/step-00000002/rank-00000.bin" ] || fail "the checkpoint was removed"
  ;;
deepspeed_typo)
  printf '{"train_micro_batch_size_per_gpuu": 4, "zero_optimization": {"stage": 3}}\n' > "$work/ds.json"
  expect 2 "key 'train_micro_batch_size_per_gpuu': is not a DeepSpeed key; did you mean 'train_micro_batch_size_per_gpu'?" -- \
    "$ferry" train "${small[@]}" --deepspeed "$work/ds.json"
  ;;
token_width)
  head -c 20001 /dev/urandom > "$work/tokens.bin"
  expect 1 "data.path '$work/tokens.bin': a uint16 token file must have a size divisible by 2, it has 20001 bytes" -- "$ferry" train "${small[@]}" --set data.path="$work/tokens.bin" --set data.format=tokens \
    --set data.dtype=uint16 --set train.steps=1
  ;;
missing_shard)
  ck=$work/ck
  train_ok --set train.steps=1 --set checkpoint.dir="$ck"
  "$ferry" export --checkpoint "$ck" --hf "$work/model" --max-shard-size 20KB > "$work/export" 2>&1 || { cat "$work/export"; fail "export"; }
  shard=$(ls "$work/model" | grep -- '-of-' | sed -n 2p)
  [ -n "$shard" ] || fail "the export has no second shard"
  rm "$work/model/$shard"
  expect 1 "$shard" -- "$ferry" train "${small[@]}" --set model.init_from="$work/model" --set train.steps=1
  ;;
full_disk)
  mkdir -p "$work/nvme"
  if ! mount -t tmpfs -o size=256k tmpfs "$work/nvme" 2> /dev/null; then echo "SKIP: cannot mount a tmpfs here (not root)"; exit 0; fi
  trap 'umount "$work/nvme"' EXIT
  expect 1 "nvme_path: too small: needs 1048576 bytes, 262144 free, for '$work/nvme/ferry-optimizer-rank0.swp'" -- "$ferry" train "${small[@]}" --set train.steps=1 --set zero_optimization.stage=3 \
    --set zero_optimization.offload_optimizer.device=nvme --set zero_optimization.offload_optimizer.nvme_path="$work/nvme"
  ;;
ranks_beyond_data)
  head -c 40 "$(dirname "$config")/../data/kjv.txt" > "$work/short.txt"
  expect 1 "each need at least block_size + 1 = 33 tokens" -- \
    "$mpiexec" -n 2 "$ferry" train "${small[@]}" --set data.path="$work/short.txt" --set train.steps=1
  grep -qF "$work/short.txt" "$work/out" || fail "the message does not name the file"
  ;;
*)
  echo "unknown case $case_"; exit 1 ;;
esac
echo "PASS: $case_"
