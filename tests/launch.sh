#!/usr/bin/env bash
# ferry launch: the Slurm script is valid bash with the requested allocation, and the
# mpiexec command it prints for a hosts file actually trains on 2 ranks of this machine,
# with each rank's output in its own files (--log-dir).
# Usage: launch.sh FERRY SOURCE_DIR WORK_DIR   (runs `FERRY launch`)
set -euo pipefail
ferry=$1 src=$2 work=$3
mkdir -p "$work"
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }

script=$("$ferry" launch slurm --nodes 2 --gpus-per-node 4 --time 01:30:00 --partition gpu --account proj7 \
  -- --config "$src/examples/configs/tiny.json" --set zero_optimization.stage=3)
bash -n <(echo "$script") || fail "the sbatch script is not valid bash"
for want in "#SBATCH --nodes=2" "#SBATCH --ntasks-per-node=4" "#SBATCH --gpus-per-node=4" "#SBATCH --time=01:30:00" \
            "#SBATCH --partition=gpu" "#SBATCH --account=proj7" "mpiexec -launcher slurm -n 8 -ppn 4 " \
            "--config $src/examples/configs/tiny.json --set zero_optimization.stage=3"; do
  grep -qF -- "$want" <<<"$script" || fail "slurm script lacks '$want':"$'\n'"$script"
done
grep -qE "/ferry train --config " <<<"$script" || fail "the ranks do not run 'ferry train':"$'\n'"$script"
srun=$("$ferry" launch slurm --nodes 3 --ranks-per-node 2 --time 10 --launcher srun --cpus-per-rank 8 -- --config x.json)
grep -qF "srun --mpi=pmi2 --kill-on-bad-exit=1 --ntasks=6 --ntasks-per-node=2 " <<<"$srun" || fail "srun line: $srun"
grep -qF -- "--set device.threads=8" <<<"$srun" || fail "cpus per rank not passed: $srun"
grep -q "gpus-per-node" <<<"$srun" && fail "GPUs requested for a CPU job"

# --max-restarts: the script retries in its allocation, every later attempt resuming from
# the latest checkpoint, and stops at once on bad input (exit status 2). Run here with a
# stand-in for Slurm's mpiexec that fails the first attempt and records the arguments.
script=$("$ferry" launch slurm --nodes 2 --ranks-per-node 1 --time 10 --max-restarts 2 -- --config x.json)
bash -n <(echo "$script") || fail "the restarting sbatch script is not valid bash"
export SLURM_JOB_ID=1 SLURM_JOB_NODELIST=n[1-2] FERRY_RESTART_PAUSE=0
mkdir -p fake && cat > fake/mpiexec <<'FAKE'
#!/bin/bash
echo "$*" >> "$FAKE_LOG"
n=$(wc -l < "$FAKE_LOG")
[ "$n" -ge "${FAKE_OK_AT:-2}" ] && exit 0
exit "${FAKE_STATUS:-9}"
FAKE
chmod +x fake/mpiexec
rm -f calls; FAKE_LOG=$PWD/calls PATH=$PWD/fake:$PATH bash <(echo "$script") > loop.out || fail "the loop did not recover: $(cat loop.out)"
[ "$(wc -l < calls)" = 2 ] || fail "expected 2 attempts: $(cat calls)"
head -1 calls | grep -q "checkpoint.resume" && fail "the first attempt resumes"
tail -1 calls | grep -qF -- "--set checkpoint.resume=auto" || fail "the restart does not resume: $(tail -1 calls)"
grep -q "attempt 1 of 3 ended with exit status 9" loop.out || fail "the restart is not logged: $(cat loop.out)"
rc=0; rm -f calls; FAKE_LOG=$PWD/calls FAKE_STATUS=2 FAKE_OK_AT=9 PATH=$PWD/fake:$PATH bash <(echo "$script") > loop.out || rc=$?
[ $rc = 2 ] && [ "$(wc -l < calls)" = 1 ] || fail "bad input (exit 2) was retried: $(cat calls)"
rc=0; rm -f calls; FAKE_LOG=$PWD/calls FAKE_OK_AT=9 PATH=$PWD/fake:$PATH bash <(echo "$script") > loop.out || rc=$?
[ $rc = 9 ] && [ "$(wc -l < calls)" = 3 ] || fail "not 3 attempts then the failure's status ($rc): $(cat calls)"
if "$ferry" launch mpiexec --hosts x --min-nodes 1 -- --config x.json 2> err.txt; then fail "--min-nodes without --max-restarts accepted"; fi
grep -qF -- "--min-nodes and --launcher-exec go with --max-restarts" err.txt || fail "$(cat err.txt)"
printf 'localhost:1\n' > one_host
if "$ferry" launch mpiexec --hosts one_host --max-restarts 1 -- --config "$src/examples/configs/tiny-model.json" 2> err.txt; then
  fail "--max-restarts without checkpoint.dir accepted"
fi
grep -qF -- "--max-restarts resumes from checkpoints" err.txt || fail "$(cat err.txt)"

# Errors name what is wrong, with exit status 2.
printf 'localhost:two\n' > bad_hosts
if "$ferry" launch mpiexec --hosts bad_hosts -- --config x.json 2> err.txt; then fail "bad hosts file accepted"; fi
grep -qF "bad_hosts:1: the rank count in 'localhost:two' must be a positive integer" err.txt || fail "$(cat err.txt)"
if "$ferry" launch slurm --nodes 2 --gpus-per-node 4 -- --config x.json 2> err.txt; then fail "no --time accepted"; fi
grep -qF -- "--time is required" err.txt || fail "$(cat err.txt)"

# The printed mpiexec command, run as printed: 2 ranks from the hosts file.
printf '# this machine\nlocalhost:2\n' > hosts
# --log-dir: each rank's output in its own files as well (rank 0's also on the terminal).
rm -rf rank-logs
cmd=$("$ferry" launch mpiexec --hosts hosts --log-dir rank-logs -- --config "$src/examples/configs/tiny-model.json" \
      --set train.steps=3 --set train.eval_batches=1 --set train.sample_tokens=0 --set zero_optimization.stage=2)
echo "$cmd"
grep -qF -- "--set log.rank_logs=$work/rank-logs" <<<"$cmd" || fail "--log-dir not passed as an absolute log.rank_logs"
out=$(OMP_NUM_THREADS=1 timeout 120 bash -c "$cmd" 2>&1) || fail "the printed command failed: $out"
grep -q "2 rank(s) over MPI" <<<"$out" || fail "not 2 ranks: $out"
grep -q "final validation loss" <<<"$out" || fail "no training: $out"
for r in 0 1; do
  grep -q "final validation loss" rank-logs/rank$r.out || fail "rank $r's file lacks the run: $(ls -l rank-logs)"
  head -1 rank-logs/rank$r.err | grep -q "^==== ferry rank $r of 2, pid" || fail "rank $r's .err has no header"
done
[ "$(grep -c 'final validation loss' <<<"$out")" = 1 ] || fail "rank 1's stdout reached the terminal"
script=$("$ferry" launch slurm --nodes 2 --ranks-per-node 1 --time 10 --log-dir /scratch/logs -- --config x.json)
grep -qF -- "--set log.rank_logs=/scratch/logs" <<<"$script" || fail "slurm script without the rank logs: $script"
echo "PASS: ferry launch"
