#!/usr/bin/env bash
# What `ferry train` prints, through the real executables: a short header on the terminal,
# the full resolved configuration in the run folder and with --verbose, refusals before any
# configuration line, and the words of the baseline and final lines. One ctest per case:
#   short      a 2-step run prints under 40 lines and no configuration dump; checkpoint.dir
#              (else log.metrics's folder) holds run-config.json with every key, counted as
#              the header says; a resumed run records where it resumed
#   verbose    --verbose prints the dump (ferry train and ferry-train); a DeepSpeed file's
#              counts on the header, its lists in the run folder and with --verbose
#   errors     a model folder whose weights do not match its config.json, a data file that
#              is not there, a tokenizer that is not JSON: the error, exit 1, and no
#              configuration line before it (with --verbose)
#   words      "bytes" on byte-level data and "tokens" on token data (a token file, a
#              tokenizer), "% above" with a positive figure when the loss ends above the
#              baseline and "% below" when under it, each figure recomputed from the line;
#              data.chat_template typed "auto or a path"
# usage: user_output.sh CASE FERRY FERRY_TRAIN SOURCE_DIR WORKDIR
set -u
case_=$1 ferry=$2 ferry_train=$3 src=$4 work=$5/user-output-$case_
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
export OMP_NUM_THREADS=1
small=(--config "$src/examples/configs/tiny.json" --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2
       --set model.block_size=32 --set train_micro_batch_size_per_gpu=4 --set device.threads=1
       --set train.eval_every=0 --set train.eval_batches=1 --set train.sample_tokens=0 --set log.every=50
       --set scheduler.params.warmup_num_steps=1 --set scheduler.params.total_num_steps=100)
fail() { echo "FAIL: $*"; echo "--- output:"; tail -20 "$work/out"; exit 1; }
# run STATUS command...: the output in $work/out, the exit status as expected.
run() {
  local want=$1
  shift
  timeout 120 "$@" > "$work/out" 2>&1
  local got=$?
  [ "$got" = "$want" ] || fail "exit status $got, expected $want: $*"
}
has() { grep -qF -- "$1" "${2:-$work/out}" || fail "no line with '$1' in ${2:-the output}"; }
lacks() { ! grep -qE -- "$1" "${2:-$work/out}" || fail "a line matches '$1' in ${2:-the output}: $(grep -E -- "$1" "${2:-$work/out}" | head -1)"; }
# The lines of a resolved-configuration dump: the title, or a JSON key line of it.
dump='^resolved config \(|^ *"[a-z_0-9]+": '
# Leaves of the "config" object in a run-config.json written by ferry (2-space indent):
# the lines from "config": { to its closing brace that hold a value (an array, one value
# over several lines), not an opening or closing brace.
config_leaves() {
  awk '/^  "config": \{/ { on = 1; next }
       on && /^  \}/ { exit }
       in_array { if (/^ *\],?$/) in_array = 0; next }
       on && /\[$/ { n++; in_array = 1; next }
       on && !/\{$/ && !/^ *\},?$/ { n++ }
       END { print n + 0 }' "$1"
}
# Entries of the JSON list KEY (its first occurrence) in a run-config.json.
list_length() {  # FILE KEY
  awk -v key="\"$2\": [" 'index($0, key) { on = 1; next } on && /^ *\],?$/ { exit } on { n++ } END { print n + 0 }' "$1"
}

case $case_ in
short)
  ck=$work/ck
  run 0 "$ferry" train "${small[@]}" --set train.steps=2 --set checkpoint.dir="$ck"
  lines=$(wc -l < out)
  [ "$lines" -lt 40 ] || fail "$lines lines on the terminal for a 2-step run"
  lacks "$dump"
  has "config: $src/examples/configs/tiny.json + 14 --set: "
  has "all of them in $ck/run-config.json (--verbose prints them)"
  for want in "model: GPT-2 style, 2 layers" "where the state lives: 1 rank(s), ZeRO stage 0" "data: " \
              "global batch 4 x 32 tokens" "training: 2 steps; AdamW" "step 2/2 | loss"; do has "$want"; done
  f=$ck/run-config.json
  [ -f "$f" ] || fail "no $f"
  has '"n_embd": 32' "$f"
  has "\"dir\": \"$ck\"" "$f"
  has "\"config\": \"$src/examples/configs/tiny.json\"" "$f"
  has '"model.n_embd=32"' "$f"
  has '"resumed_from": 0' "$f"
  keys=$(grep -oE ': [0-9]+ keys resolved' out | grep -oE '[0-9]+')
  [ "$keys" = "$(config_leaves "$f")" ] || fail "the header counts $keys keys, $f holds $(config_leaves "$f")"
  [ "$keys" -gt 50 ] || fail "only $keys keys resolved"
  echo "ok: $lines lines, $keys keys in $f"
  # Resumed: the file says from which step.
  run 0 "$ferry" train "${small[@]}" --set train.steps=3 --set checkpoint.dir="$ck" --resume auto
  has "resumed from $ck/step-00000002"
  has '"resumed_from": 2' "$f"
  # No checkpoint.dir: beside log.metrics, named after it.
  mkdir -p m
  run 0 "$ferry" train "${small[@]}" --set train.steps=1 --set log.metrics="$work/m/run1.jsonl"
  has "all of them in $work/m/run1.run-config.json"
  has '"n_embd": 32' "$work/m/run1.run-config.json"
  # Neither: the header says how to see them.
  run 0 "$ferry" train "${small[@]}" --set train.steps=1
  has "keys resolved; --verbose prints them (no checkpoint.dir or log.metrics to write them to)"
  lacks "$dump"
  ;;
verbose)
  for prog in "$ferry train" "$ferry_train"; do
    # shellcheck disable=SC2086
    run 0 $prog "${small[@]}" --set train.steps=1 --verbose
    has "resolved config ($src/examples/configs/tiny.json + --set):"
    has '"n_embd": 32,'
    [ "$(grep -cE "$dump" out)" -gt 50 ] || fail "$prog --verbose: no full dump"
    # After the model and data are loaded, before the placement.
    [ "$(grep -n '^resolved config' out | cut -d: -f1)" -lt "$(grep -n '^model: ' out | cut -d: -f1)" ] ||
      fail "$prog --verbose: the dump comes after the header"
    echo "ok: $prog --verbose: $(grep -cE "$dump" out) dump lines"
  done
  ds=$src/examples/deepspeed/zero2_cpu_offload.json
  dsrun=("$ferry" train --config "$src/examples/configs/tiny-model.json" --deepspeed "$ds" --set model.block_size=32
         --set train_micro_batch_size_per_gpu=4 --set device.threads=1 --set train.steps=1 --set train.eval_batches=1
         --set train.sample_tokens=0 --set checkpoint.dir="$work/ds")
  run 0 "${dsrun[@]}"
  lacks "$dump"
  line=$(grep -E "^deepspeed config $ds: " out) || fail "no deepspeed line on the header"
  autos=$(grep -oE '[0-9]+ "auto" values resolved' <<<"$line" | cut -d' ' -f1)
  ignored=$(grep -oE '[0-9]+ key\(s\) ferry does not implement, ignored' <<<"$line" | cut -d' ' -f1)
  has "listed in $work/ds/run-config.json"
  f=$work/ds/run-config.json
  # The counts are those of the lists the file holds.
  n_autos=$(list_length "$f" auto_resolved)
  n_ignored=$(list_length "$f" ignored)
  [ "$autos" = "$n_autos" ] && [ "$ignored" = "$n_ignored" ] ||
    fail "header: $autos autos, $ignored ignored; $f: $n_autos, $n_ignored"
  [ "$autos" -gt 5 ] || fail "only $autos \"auto\" values resolved from $ds"
  has '"train_micro_batch_size_per_gpu = 4"' "$f"
  run 0 "${dsrun[@]}" --verbose
  has "deepspeed config $ds: \"auto\" resolved:"
  has "  train_micro_batch_size_per_gpu = 4"
  echo "ok: $ds: $autos \"auto\" values, $ignored ignored, listed in $f and with --verbose"
  ;;
errors)
  # A model folder whose weights do not match config.json: the tensor's shape is named
  # before any configuration line, although --verbose asks for the dump.
  cp -r "$src/tests/data/hf/llama3" model
  sed -i 's/"intermediate_size": 88/"intermediate_size": 176/' model/config.json
  grep -q '"intermediate_size": 176' model/config.json || fail "could not edit model/config.json"
  head -c 20000 "$src/examples/data/kjv.txt" > small.txt
  ft=(--config "$src/examples/configs/finetune-llama3.json" --set data.path="$work/small.txt" --set train.steps=1
      --set device.threads=1 --set train.eval_batches=1 --verbose)
  run 1 "$ferry" train "${ft[@]}" --set model.init_from="$work/model"
  has "model-00002-of-00005.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape [88, 60] but the model of config.json needs [176, 60]"
  lacks "$dump|^config: |^model: "
  echo "ok: $(grep -F 'has shape' out)"
  run 1 "$ferry" train "${ft[@]}" --set data.path="$work/nope.txt"
  has "data.path: cannot open '$work/nope.txt'"
  lacks "$dump|^config: |^model: "
  echo '{"version": "1.0", "model": ' > bad-tokenizer.json
  run 1 "$ferry" train "${ft[@]}" --set data.tokenizer="$work/bad-tokenizer.json"
  has "data.tokenizer: "
  has "bad-tokenizer.json"
  lacks "$dump|^config: |^model: "
  echo "ok: $(grep -F 'data.tokenizer: ' out | head -1)"
  ;;
words)
  # percent LINE: the figure of the final line, and the one its two losses give.
  check_final() {  # check_final WORD
    local line v b fig want
    line=$(grep '^final validation loss' out) || fail "no final line"
    v=$(sed -E 's/^final validation loss ([0-9.]+) .*/\1/' <<<"$line")
    b=$(sed -E 's/.* vs unigram baseline ([0-9.]+) .*/\1/' <<<"$line")
    fig=$(sed -E 's/.*\(([0-9.]+)% (above|below)\)$/\1/' <<<"$line")
    grep -qE "\(([0-9.]+)% $1\)$" <<<"$line" || fail "expected '% $1' in: $line"
    want=$(awk -v v="$v" -v b="$b" 'BEGIN { d = 100 * (v - b) / b; if (d < 0) d = -d; printf "%.1f", d }')
    # The line rounds both losses to 4 digits: the figure may differ in its last digit.
    awk -v f="$fig" -v w="$want" 'BEGIN { exit !(f - w < 0.15 && w - f < 0.15 && f > 0) }' ||
      fail "figure $fig, the losses give $want: $line"
    echo "ok: $line"
  }
  # Byte-level text: a loss far above the baseline after 2 steps.
  run 0 "$ferry" train "${small[@]}" --set train.steps=2 --set train.sample_tokens=8
  has "unigram baseline (validation bytes scored by training byte frequencies)"
  has "sample (prompt: the first 32 validation bytes;"
  has "(bytes as tokens)"
  check_final above
  # Token ids 0..255 in turn (a uint16 token file): every id equally frequent, so the
  # baseline is ln 256, and each id predicts the next, which 20 steps learn.
  one=""
  for i in $(seq 0 255); do one+=$(printf '\\%03o\\000' "$i"); done
  for _ in $(seq 100); do printf "$one"; done > cycle.u16
  [ "$(wc -c < cycle.u16)" = 51200 ] || fail "cycle.u16 has $(wc -c < cycle.u16) bytes"
  cat > cycle.json <<EOF
{"model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 256, "block_size": 32},
 "data": {"path": "cycle.u16", "format": "uint16"},
 "device": {"memory": "64MiB", "threads": 1},
 "train_micro_batch_size_per_gpu": 4,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.005}},
 "train": {"steps": 20, "eval_every": 0, "eval_batches": 1, "sample_tokens": 0}}
EOF
  run 0 "$ferry" train --config cycle.json
  has "unigram baseline (validation tokens scored by training token frequencies): 5.545"
  has "(token ids as given)"
  check_final below
  # Text through a model's tokenizer: tokens.
  head -c 20000 "$src/examples/data/kjv.txt" > small.txt
  run 0 "$ferry" train --config "$src/examples/configs/finetune-llama3.json" --set data.path="$work/small.txt" \
    --set train.steps=1 --set device.threads=1 --set train.eval_batches=1 --set train.sample_tokens=4
  has "(the model's tokenizer)"
  has "unigram baseline (validation tokens scored by training token frequencies)"
  has "sample (prompt: the first 32 validation tokens;"
  # The keys' table: a path knob with keywords says it takes a path.
  "$ferry" train --help-config > keys.md
  has '| `data.chat_template` | auto or a path |' keys.md
  has '| `data.tokenizer` | auto, bytes or a path |' keys.md
  grep -F '| `data.format` |' keys.md | grep -qF '"messages"' || fail "data.format's help omits messages records"
  ;;
*)
  echo "unknown case $case_"
  exit 2
  ;;
esac
echo "PASS: $case_"
