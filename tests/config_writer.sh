#!/usr/bin/env bash
# ferry config: the written file trains unchanged. For each ZeRO stage x offload (none; cpu
# optimizer; cpu optimizer + parameters at stage 3; nvme optimizer + parameters at stage 3
# in a temp folder) a DeepSpeed file from `ferry config deepspeed` trains 2 steps beside
# tiny-model.json, and a ferry file from `ferry config ferry` trains 2 steps alone. Also:
# an existing output is not overwritten without --force, and a refused combination exits 2.
# Usage: config_writer.sh MPIEXEC FERRY SOURCE_DIR
set -euo pipefail
mpiexec=$1 ferry=$2 src=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
short=(--set train.steps=2 --set train.eval_batches=1 --set train.sample_tokens=0)
train() {  # NAME FERRY-ARGS...: 2 steps must print their loss lines
  local name=$1 out
  shift
  out=$(OMP_NUM_THREADS=1 timeout 120 "$mpiexec" -n 1 "$ferry" train "$@" "${short[@]}" 2>&1) ||
    fail "$name: ferry train failed: $out"
  grep -qE "^step 2/2 \| loss [0-9.]+" <<<"$out" || fail "$name: no loss line for step 2: $out"
  echo "$name: $(grep -E '^step 2/2' <<<"$out" | cut -d'|' -f1-2)"
}
n=0
for stage in 0 1 2 3; do
  offloads=("")
  [ $stage -ge 1 ] && offloads+=("--offload-optimizer cpu")
  [ $stage -eq 3 ] && offloads+=("--offload-optimizer cpu --offload-param cpu"
                                 "--offload-optimizer nvme --offload-param nvme --nvme-path $tmp/nvme")
  for offload in "${offloads[@]}"; do
    mkdir -p "$tmp/nvme"
    n=$((n + 1))
    # shellcheck disable=SC2086  # $offload is a list of flags
    "$ferry" config deepspeed --zero-stage $stage $offload --output "$tmp/ds$n.json" >/dev/null ||
      fail "ferry config deepspeed --zero-stage $stage $offload"
    train "deepspeed stage $stage ${offload:-no offload}" --config "$src/examples/configs/tiny-model.json" \
      --deepspeed "$tmp/ds$n.json"
    # shellcheck disable=SC2086
    "$ferry" config ferry --zero-stage $stage $offload --data "$src/examples/data/kjv.txt" \
      --output "$tmp/ferry$n.json" >/dev/null || fail "ferry config ferry --zero-stage $stage $offload"
    train "ferry stage $stage ${offload:-no offload}" --config "$tmp/ferry$n.json"
  done
done
# An existing file stays without --force; with it, it is replaced.
before=$(cat "$tmp/ds1.json")
if "$ferry" config deepspeed --zero-stage 1 --output "$tmp/ds1.json" 2>/dev/null; then fail "overwrote without --force"; fi
[ "$(cat "$tmp/ds1.json")" = "$before" ] || fail "the existing file changed without --force"
"$ferry" config deepspeed --zero-stage 1 --output "$tmp/ds1.json" --force >/dev/null || fail "--force did not overwrite"
grep -q '"stage": 1' "$tmp/ds1.json" || fail "--force wrote another file"
# A refused combination: exit 2, naming the flag, nothing written.
rc=0
err=$("$ferry" config deepspeed --zero-stage 2 --offload-param cpu --output "$tmp/bad.json" 2>&1) || rc=$?
[ $rc -eq 2 ] || fail "offload_param at stage 2: exit $rc, not 2: $err"
grep -q -- "--offload-param cpu needs --zero-stage 3" <<<"$err" || fail "unclear refusal: $err"
[ ! -e "$tmp/bad.json" ] || fail "a refused file was written"
echo "PASS: $n DeepSpeed and $n ferry files written by ferry config trained"
