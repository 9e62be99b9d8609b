#!/usr/bin/env bash
# ferry launch --max-restarts across two "hosts" (netns_hosts.sh):
#   - a rank killed mid-run: the launcher logs the cause, restarts from the latest
#     checkpoint, and the run ends on the uninterrupted run's losses, to the bit;
#   - a whole host gone (its processes killed, its link down): with --min-nodes 1 the
#     launcher goes on over the host left, at half the ranks with twice the accumulation
#     (the global batch kept), and the losses continue the uninterrupted run's;
#   - without --min-nodes it stops, saying which host does not answer.
# Usage: restarts.sh FERRY SOURCE_DIR WORK_DIR     (exit 77: skipped, with the reason)
set -uo pipefail
ferry=$1 src=$2 work=$3
source "$src/tests/hosts/netns_hosts.sh"
hosts_can_run
mkdir -p "$work" && cd "$work" || exit 1
rm -rf ./*
fail() { echo "FAIL: $*"; exit 1; }
hosts_up 2
read -r h0 h1 <<<"$HOSTS"
printf '%s:1\n%s:1\n' "$h0" "$h1" > hosts
export OMP_NUM_THREADS=1
common=(--config "$src/examples/configs/tiny-model.json" --set train.steps=30 --set train.eval_batches=1
        --set train.eval_every=0 --set train.sample_tokens=0 --set train_batch_size=16
        --set train_micro_batch_size_per_gpu=4 --set device.threads=1 --set log.every=1 --set comm.timeout_s=10
        --set zero_optimization.stage=3 --set checkpoint.every_steps=3)
source "$src/tests/losses.sh"
wait_step() {  # wait_step METRICS N: until step N is logged (at most 60 s)
  local n
  for _ in $(seq 600); do
    n=$(grep -c '"loss"' "$1" 2>/dev/null)
    [ "${n:-0}" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "step $2 never came in $1"
}
launch() {  # launch NAME EXTRA_LAUNCH_ARGS... -- : runs ferry launch on host 0 in the background
  local name=$1
  shift
  hosts_exec0 "$ferry" launch mpiexec --hosts hosts --launcher-exec "$HOSTS_DIR/launcher.sh" --probe-timeout 5 "$@" \
    > "$name.log" 2>&1 &
}

hosts_mpiexec -hosts "$h0:1,$h1:1" -n 2 "$ferry" train "${common[@]}" --set checkpoint.dir="$work/ck-ref" \
  --set log.metrics="$work/ref.jsonl" > ref.log 2>&1 || fail "the uninterrupted run: $(tail -5 ref.log)"

# A rank killed: the same world again, the same losses to the bit.
launch kill --max-restarts 2 -- "${common[@]}" --set checkpoint.dir="$work/ck-kill" --set log.metrics="$work/kill.jsonl"
job=$!
wait_step kill.jsonl 8
victim=$(ip netns pids "$h1" | xargs -r ps -o pid=,comm= -p | awk '$2 == "ferry" { print $1 }')
[ -n "$victim" ] || fail "no rank on $h1 to kill"
kill -9 $victim
wait $job || fail "the launcher failed after one kill: $(grep 'ferry launch' kill.log)"
grep "ferry launch" kill.log
grep -qE "ferry launch: attempt 1 failed \(mpiexec: process $victim on $h1 \(rank 1\) ended.*restarting from $work/ck-kill/step-" kill.log \
  || fail "the restart is not logged with its cause"
same_step_losses ref.jsonl kill.jsonl 30 || fail "the restarted run's losses differ from the uninterrupted run's"
echo "rank killed: restarted once, the 30 losses equal the uninterrupted run's to the bit"

# A host gone, --min-nodes 1: on with the host left, the global batch kept.
launch host --max-restarts 2 --min-nodes 1 -- "${common[@]}" --set checkpoint.dir="$work/ck-host" --set log.metrics="$work/host.jsonl"
job=$!
wait_step host.jsonl 8
ip netns pids "$h1" | xargs -r kill -9
sleep 0.3  # mpiexec hears of it before the link goes; the launcher probes after 2 s
host_link "$h1" down
wait $job || fail "the launcher failed after a host went away: $(grep 'ferry launch' host.log)"
grep "ferry launch" host.log
grep -qF "without $h1: 1 ranks, the global batch of 16 kept with 4 accumulation steps" host.log || fail "no shrink logged"
grep -q "global batch 16 x 128 tokens (4 per micro-batch x 4 accumulation steps x 1 ranks)" host.log || fail "not 1 rank x 4 accumulation"
same_step_losses ref.jsonl host.jsonl 30 1e-6 || fail "the shrunk run's losses do not continue the uninterrupted run's"
echo "host gone: continued on $h0 alone (4 accumulation steps); the 30 losses equal the uninterrupted run's to 1e-6"

# Without --min-nodes, a host missing stops the launcher with its name. (Its link is still down.)
launch stop --max-restarts 1 -- "${common[@]}" --set checkpoint.dir="$work/ck-host" --set train.steps=40 --set log.metrics="$work/stop.jsonl"
job=$!
wait $job && fail "the launcher succeeded without $h1"
grep -qF "hosts answer (not: $h1)" stop.log || fail "no message naming $h1: $(grep 'ferry launch' stop.log)"
grep "ferry launch" stop.log | tail -1
echo "PASS: ferry launch restarts"
