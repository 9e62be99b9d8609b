#!/usr/bin/env bash
# One rank skips a collective (FERRY_FAULT_SKIP_COLLECTIVE, a test-only fault): the job
# must end non-zero, well within a bound, with the watchdog's report; never hang. With
# log.rank_logs the report names the per-rank files, which hold it.
# usage: watchdog_fault.sh MPIEXEC FERRY CONFIG   (runs `FERRY train`)
set -u
mpiexec=$1 ferry=$2 config=$3
start=$(date +%s)
out=$(FERRY_FAULT_SKIP_COLLECTIVE=1:9 timeout 120 "$mpiexec" -n 2 "$ferry" train --config "$config" \
  --set comm.timeout_s=5 --set train.steps=3 --set zero_optimization.stage=3 --set train.sample_tokens=0 \
  --set device.threads=1 --set train.eval_batches=1 --set scheduler.params.warmup_num_steps=1 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | grep -E "watchdog|FAULT|Abort" | head -5
if [ "$rc" -eq 0 ]; then echo "FAIL: the job exited 0"; exit 1; fi
if [ "$rc" -eq 124 ]; then echo "FAIL: the job hung until timeout(1) killed it"; exit 1; fi
if ! echo "$out" | grep -q "watchdog: rank [0-9]* on [^:]*: .* #[0-9]* (.* bytes per rank) has not completed after"; then
  echo "FAIL: no watchdog report naming rank, host, operation, sequence number and bytes"; exit 1
fi
# The skipping rank is alive (its probe thread answers): the report must not call it gone.
if ! echo "$out" | grep -q "every other rank answers within"; then
  echo "FAIL: the report does not say that every peer still answers"; exit 1
fi
if [ "$elapsed" -gt 60 ]; then echo "FAIL: took ${elapsed}s"; exit 1; fi

# With per-rank files (log.rank_logs, ferry launch --log-dir): the report names the files
# to open, and the reporting rank's .err holds the report too.
logs=$(mktemp -d) && trap 'rm -rf "$logs"' EXIT
out2=$(FERRY_FAULT_SKIP_COLLECTIVE=1:9 timeout 120 "$mpiexec" -n 2 "$ferry" train --config "$config" \
  --set comm.timeout_s=5 --set train.steps=3 --set zero_optimization.stage=3 --set train.sample_tokens=0 \
  --set device.threads=1 --set train.eval_batches=1 --set scheduler.params.warmup_num_steps=1 \
  --set log.rank_logs="$logs/ranks" 2>&1)
[ $? -ne 0 ] || { echo "FAIL: the job with rank logs exited 0"; exit 1; }
reporter=$(echo "$out2" | grep -o "This rank's output: $logs/ranks/rank[0-9]*.out, $logs/ranks/rank[0-9]*.err" | head -1)
[ -n "$reporter" ] || { echo "FAIL: the report does not name the rank's files: $(echo "$out2" | grep watchdog | head -2)"; exit 1; }
err=${reporter##*, }
grep -q "watchdog: rank" "$err" || { echo "FAIL: $err lacks the report"; cat "$logs"/ranks/*; exit 1; }
for f in rank0.out rank0.err rank1.out rank1.err; do
  head -1 "$logs/ranks/$f" | grep -q "^==== ferry rank" || { echo "FAIL: $f has no header"; exit 1; }
done
echo "with log.rank_logs: $reporter, its .err holds the report"
echo "PASS: the job ended with status $rc after ${elapsed}s, with the watchdog's report"
