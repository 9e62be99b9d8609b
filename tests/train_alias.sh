#!/usr/bin/env bash
# ferry-train is `ferry train`: the same losses, step by step, on 1 rank and on 2 ranks
# under mpiexec (the alias must not change what is computed or how ranks start).
# Usage: train_alias.sh MPIEXEC FERRY FERRY_TRAIN CONFIG
set -euo pipefail
mpiexec=$1 ferry=$2 ferry_train=$3 config=$4
fail() { echo "FAIL: $*" >&2; exit 1; }  # stderr: seen from inside $(...) too
short=(--config "$config" --set train.steps=5 --set train.eval_every=0 --set train.eval_batches=1
       --set train.sample_tokens=0 --set log.every=1 --set model.block_size=32)
losses() {  # the step and validation losses of one run: PROGRAM... ; fails with its output
  local out
  out=$(OMP_NUM_THREADS=1 timeout 120 "$mpiexec" -n $ranks "$@" "${short[@]}" 2>&1) || fail "$* failed: $out"
  grep -oE "step [0-9]+/5 \| loss [0-9.]+|final validation loss [0-9.]+" <<<"$out" || true
}
for ranks in 1 2; do
  verb=$(losses "$ferry" train)
  alias=$(losses "$ferry_train")
  [ "$(grep "^step" <<<"$verb" | wc -l)" -eq 5 ] || fail "$ranks rank(s): not 5 step lines from ferry train: $verb"
  grep -q "final validation loss" <<<"$verb" || fail "$ranks rank(s): no final validation loss: $verb"
  [ "$verb" = "$alias" ] || fail "$ranks rank(s): ferry train and ferry-train differ:"$'\n'"$verb"$'\n---\n'"$alias"
  echo "$ranks rank(s): identical"$'\n'"$verb"
done
echo "PASS: ferry-train = ferry train"
