#!/usr/bin/env bash
# Runs the fuzz targets (tests/fuzz/fuzz_*.cpp) one after another over their seed corpora.
# Usage: run_fuzzers.sh BUILD_DIR [TARGET...]      (default: every target)
#   FUZZ_RUNS=N      executions per target (default 3000; `make test-fuzz`), from a fresh
#                    scratch corpus and a fixed seed: the same inputs every time
#   FUZZ_SECONDS=S   instead: S seconds per target, random seed, -use_value_profile, and the
#                    corpus grown under BUILD_DIR/fuzz-corpus/TARGET kept for the next run
# The targets write each input's files under a scratch folder of this run in /dev/shm when
# writable (the runs on a disk wait on the file system), else in ${TMPDIR:-/tmp}; it is
# removed at the end (a crashed target cannot remove its own).
# Limits on every run: 2 GiB resident, 1 GiB for one allocation, 10 s for one input; an
# input past them, a sanitizer report, a crash or a broken contract (fuzz_util.h) fails the
# target: its log and the input that did it (BUILD_DIR/fuzz-artifacts/) are kept. Prints one
# line per target (executions, time, coverage), exits 1 if any target failed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:?usage: run_fuzzers.sh BUILD_DIR [TARGET...]}"
shift
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(fuzz_config fuzz_deepspeed fuzz_checkpoint fuzz_safetensors fuzz_tokens fuzz_jsonl fuzz_hf_folder
           fuzz_tokenizer fuzz_chat_template fuzz_fsdp)
fi
bin="$build/tests/fuzz"
base="${TMPDIR:-/tmp}"
if [ -d /dev/shm ] && [ -w /dev/shm ]; then base=/dev/shm; fi
TMPDIR="$(mktemp -d "$base/ferry-fuzz-run-XXXXXX")" || exit 1
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
mkdir -p "$build/fuzz-artifacts" "$build/fuzz-logs"
failed=()
for t in "${targets[@]}"; do
  log="$build/fuzz-logs/$t.log"
  if [ -n "${FUZZ_SECONDS:-}" ]; then
    corpus="$build/fuzz-corpus/$t"
    mkdir -p "$corpus"
    mode=(-max_total_time="$FUZZ_SECONDS" -use_value_profile=1)
  else
    corpus="$build/fuzz-scratch/$t"
    rm -rf "$corpus"
    mkdir -p "$corpus"
    # -max_total_time only guards a slow machine; the runs end first.
    mode=(-runs="${FUZZ_RUNS:-3000}" -seed=1 -max_total_time=60)
  fi
  start=$(date +%s)
  # New inputs go to the first folder; the seeds (second) stay as committed.
  "$bin/$t" "$corpus" "$here/corpus/$t" "${mode[@]}" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$t-" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -aE '^#[0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+')
  if [ $rc -ne 0 ]; then
    failed+=("$t")
    echo "$t: FAILED (exit $rc) after ${runs:-?} runs in ${secs} s; log $log"
    grep -aE 'ERROR|runtime error|contract broken|Test unit written|^ +#[0-9]+ 0x[0-9a-f]+ in .* [^ (]*/(runtime|base|nn|tests/fuzz)/[^ ]*:[0-9]+' "$log" | head -20
  else
    echo "$t: ${runs:-?} runs in ${secs} s, ${last:-no coverage line}"
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz targets failed: ${failed[*]}"
  exit 1
fi
