#!/usr/bin/env bash
# ferry across "hosts" made of network namespaces (netns_hosts.sh), where MPICH moves data
# between hosts over TCP as between real machines:
#   - every ZeRO stage at 2 hosts x 1 and x 2 ranks gives the single-process losses;
#   - the ranks see 2 nodes (local ranks and the startup line's host list);
#   - a host whose link goes down, and a host whose ranks are killed, end the job with a
#     message naming the rank and the host, well within a bound; never a hang;
#   - the bytes between hosts under plain ZeRO-3, hybrid sharding and hpZ, from the links'
#     counters, for training and for ferry bench comm.
# Usage: multi_host.sh FERRY SOURCE_DIR WORK_DIR     (exit 77: skipped, with the reason)
set -uo pipefail
ferry=$1 src=$2 work=$3
source "$src/tests/hosts/netns_hosts.sh"
hosts_can_run
mkdir -p "$work" && cd "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
hosts_up 2
read -r h0 h1 <<<"$HOSTS"
common=(--config "$src/examples/configs/tiny-model.json" --set train.steps=3 --set train.eval_batches=1
        --set train.sample_tokens=0 --set train_batch_size=16 --set train_micro_batch_size_per_gpu=4
        --set device.threads=1 --set log.every=1 --set comm.timeout_s=20)
export OMP_NUM_THREADS=1
source "$src/tests/losses.sh"

for stage in 0 1 2 3; do
  timeout 120 "$ferry" train "${common[@]}" --set zero_optimization.stage=$stage --set log.metrics=ref$stage.jsonl \
    > ref$stage.log 2>&1 || fail "single process, stage $stage: $(tail -5 ref$stage.log)"
  for ppn in 1 2; do
    out=s$stage-$ppn
    hosts_mpiexec -hosts "$h0:$ppn,$h1:$ppn" -n $((2 * ppn)) "$ferry" train "${common[@]}" \
      --set zero_optimization.stage=$stage --set log.metrics="$work/$out.jsonl" > $out.log 2>&1 \
      || fail "2 hosts x $ppn, stage $stage: exit status $?: $(grep -v '^ ' $out.log | tail -5)"
    same_losses ref$stage.jsonl $out.jsonl || fail "stage $stage at 2 hosts x $ppn"
    if [ $ppn = 1 ]; then nodes="2 node(s): $h0 (rank 0), $h1 (rank 1)"; else nodes="2 node(s): $h0 (ranks 0-1), $h1 (ranks 2-3)"; fi
    grep -qF "$nodes" $out.log \
      || fail "the ranks do not see two hosts: $(grep 'rank(s) over MPI' $out.log)"
  done
  echo "stage $stage: the losses at 2 hosts x 1 and x 2 ranks equal the single process's"
done

# Hybrid sharding with a group per host: gathers and reduce-scatters stay in the host,
# only gradient shards cross. The bytes that cross are the hosts' own link counters.
tx() { local n=0 h; for h in $HOSTS; do n=$((n + $(ip netns exec "$h" cat /sys/class/net/eth0/statistics/tx_bytes))); done; echo $n; }
for mode in plain hybrid hpz; do
  extra=()
  [ $mode = hybrid ] && extra=(--set zero_optimization.shard_group_size=2)
  [ $mode = hpz ] && extra=(--set zero_optimization.zero_hpz_partition_size=2)
  before=$(tx)
  hosts_mpiexec -hosts "$h0:2,$h1:2" -n 4 "$ferry" train "${common[@]}" --set zero_optimization.stage=3 \
    --set train.steps=6 --set log.metrics="$work/x-$mode.jsonl" "${extra[@]}" > x-$mode.log 2>&1 \
    || fail "2 hosts x 2, $mode: $(tail -5 x-$mode.log)"
  declare "bytes_$mode=$(( $(tx) - before ))"
done
timeout 120 "$ferry" train "${common[@]}" --set zero_optimization.stage=3 --set train.steps=6 \
  --set log.metrics=x-ref.jsonl > x-ref.log 2>&1 || fail "single process, 6 steps"
same_losses x-ref.jsonl x-hybrid.jsonl || fail "hybrid sharding across 2 hosts"
same_losses x-ref.jsonl x-hpz.jsonl || fail "hpZ across 2 hosts"
[ "$bytes_hybrid" -lt "$bytes_plain" ] || fail "hybrid sharding sent $bytes_hybrid bytes between hosts, plain $bytes_plain"
[ "$bytes_hpz" -lt "$bytes_plain" ] || fail "hpZ sent $bytes_hpz bytes between hosts, plain $bytes_plain"
ratio() { awk -v a="$1" -v b="$bytes_plain" 'BEGIN { printf "%.2f", a / b }'; }
echo "across hosts, 6 steps of stage 3 at 2 hosts x 2 ranks: plain $bytes_plain bytes, hybrid (a group per host)" \
     "$bytes_hybrid ($(ratio $bytes_hybrid) of plain), hpZ (node copies per host) $bytes_hpz ($(ratio $bytes_hpz));" \
     "the losses equal the single process's"

# ferry bench comm reads the same counters from inside the hosts: each layout's bytes per
# rank for one step's collectives, hybrid and hpZ below plain.
hosts_mpiexec -hosts "$h0:2,$h1:2" -n 4 "$ferry" bench comm --quick > bench.log 2>&1 \
  || fail "ferry bench comm at 2 hosts x 2: $(tail -5 bench.log)"
layout() { awk -v l="$1" '$1 == l && $(NF - 2) ~ /^[0-9.]+$/ { print $(NF - 2) }' bench.log; }
b_plain=$(layout plain) b_hybrid=$(layout hybrid) b_hpz=$(layout hpZ)
[ -n "$b_plain" ] && [ -n "$b_hybrid" ] && [ -n "$b_hpz" ] || fail "ferry bench comm gave no byte counts: $(cat bench.log)"
awk -v p="$b_plain" -v y="$b_hybrid" -v z="$b_hpz" 'BEGIN { exit !(p > 0 && y < 0.6 * p && z < 0.85 * p) }' \
  || fail "ferry bench comm's bytes across hosts: plain $b_plain MB, hybrid $b_hybrid, hpZ $b_hpz"
echo "ferry bench comm at 2 hosts x 2 ranks, MB per rank per 4 MiB unit: plain $b_plain, hybrid $b_hybrid, hpZ $b_hpz"

# Runs long enough to be cut short.
long=(--set train.steps=400 --set comm.timeout_s=6 --set zero_optimization.stage=3)

# A host whose ranks are killed: mpiexec ends the job, naming the host; the pids line maps
# the pid it names to a rank. (Before the link test: a link taken down and up again leaves
# failed neighbour entries behind for a while.)
hosts_mpiexec -hosts "$h0:2,$h1:2" -n 4 "$ferry" train "${common[@]}" "${long[@]}" > kill.log 2>&1 &
job=$!
for _ in $(seq 100); do grep -q "^step 2/" kill.log && break; sleep 0.2; done
ip netns pids "$h1" | xargs -r ps -o pid=,comm= -p | awk '$2 == "ferry" { print $1 }' | xargs -r kill -9
for _ in $(seq 120); do kill -0 $job 2>/dev/null || break; sleep 0.5; done
kill -0 $job 2>/dev/null && { kill -9 $job; fail "the job still runs 60 s after $h1's ranks were killed"; }
wait $job && fail "the job exited 0 after $h1's ranks were killed"
pid=$(grep -m1 -oE "PID [0-9]+ RUNNING AT $h1" kill.log | cut -d' ' -f2)
[ -n "$pid" ] || fail "mpiexec did not name a process of $h1: $(tail -15 kill.log)"
rank=$(grep -m1 -oE "r[0-9]+=$pid( |$)" kill.log | cut -d= -f1)
[ "$rank" = r2 ] || [ "$rank" = r3 ] || fail "pid $pid is not one of $h1's ranks (2, 3): $(grep -m1 pids: kill.log)"
echo "ranks killed: the job ended; mpiexec named pid $pid at $h1, which the startup line maps to rank ${rank#r}"

# A host that drops off the network mid-run: the other host's ranks must stop the job and
# name the rank and host that stopped answering.
start=$(date +%s)
hosts_mpiexec -hosts "$h0:1,$h1:1" -n 2 "$ferry" train "${common[@]}" "${long[@]}" > link.log 2>&1 &
job=$!
for _ in $(seq 100); do grep -q "^step 2/" link.log && break; sleep 0.2; done
host_link "$h1" down
for _ in $(seq 120); do kill -0 $job 2>/dev/null || break; sleep 0.5; done
kill -0 $job 2>/dev/null && { kill -9 $job; fail "the job still runs 60 s after $h1's link went down"; }
wait $job && fail "the job exited 0 after $h1's link went down"
grep -qE "rank 1 on $h1 .*does not answer" link.log || fail "no message naming rank 1 on $h1: $(grep -iE 'watchdog|error' link.log | head -5)"
echo "link down: the job ended after $(( $(date +%s) - start )) s: $(grep -m1 -oE "rank 1 on $h1 [^;]*" link.log)"

echo "PASS: ferry across 2 hosts"
