#!/usr/bin/env bash
# Input built to break a reader, and the scratch a run leaves, through the real executable
# (issue 37, "Robustness and output"). One ctest per case:
#   deep_config       a --config nested 200,000 levels deep (one line, and one level a line),
#                     and a --set value nested past the bound: refused naming the file (the
#                     --set) and the line, exit 2, where it used to end on SIGSEGV
#   deep_runtime      --deepspeed JSON, --fsdp YAML (flow [[[, block "- - -", block maps one
#                     level a line) and --fsdp JSON, each 200,000 (maps: 2,000) levels deep
#   deep_data         a JSONL record nested 200,000 levels deep, on line 3
#   deep_model        a model folder whose config.json, tokenizer.json or tokenizer_config.json
#                     nests 200,000 levels deep; and a checkpoint manifest as deep
#   deep_template     a chat template (tokenizer_config.json) nested 100,000 levels deep:
#                     parentheses, {% if %} blocks, a chain 1 + 1 + ... (the bound: 256)
#   deep_value        a chat template (data.chat_template) that builds a value 90,000 levels
#                     deep in two loops of 300 ({% set ns.x = [ns.x] %}) and prints it or its
#                     tojson, or a chain of 2,000 namespaces: refused naming the line and
#                     column (the bound: 512), where it ended on SIGSEGV; a namespace holding
#                     itself prints as jinja2 prints it, and a value at the bound trains
#   nvme_swap         a 2-step run with the optimizer and the parameters on NVMe leaves no
#                     *.swp behind (nor does a run that stops on an error after opening them);
#                     its checkpoint is whole
#   nvme_abort        two ranks with the swap files open; rank 1's NVMe writes fail and it
#                     ends the job through MPI_Abort: no *.swp left on any rank, the
#                     checkpoint in the same folder untouched
# The bound (base/nesting_limit.h): 512 levels of JSON, 64 of YAML.
# usage: user_robustness.sh CASE FERRY SOURCE_DIR WORKDIR
set -u
case_=$1 ferry=$2 src=$3 work=$4/user-robustness-$case_
rm -rf "$work" && mkdir -p "$work"
tiny=$src/examples/configs/tiny.json
small=(--config "$tiny" --set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2
       --set model.block_size=32 --set train_micro_batch_size_per_gpu=4 --set device.threads=1
       --set train.eval_every=0 --set train.eval_batches=1 --set train.sample_tokens=0 --set log.every=50
       --set scheduler.params.warmup_num_steps=1 --set scheduler.params.total_num_steps=100)
fail() { echo "FAIL: $*"; echo "--- output:"; tail -c 2000 "$work/out"; exit 1; }
# expect STATUS PATTERN -- command...: the exit status (a signal would be 128+N) and one
# line holding PATTERN.
expect() {
  local want=$1 pattern=$2
  shift 3
  timeout 120 "$@" > "$work/out" 2>&1
  local got=$?
  [ "$got" = "$want" ] || fail "exit status $got, expected $want: ${*:0:6}"
  grep -qF -- "$pattern" "$work/out" || fail "no line with '$pattern'"
  echo "ok: exit $got, $(grep -F -- "$pattern" "$work/out" | head -1 | cut -c1-240)"
}
# deep TEXT_BEFORE OPEN N VALUE CLOSE TEXT_AFTER > file: OPEN x N, VALUE, CLOSE x N.
deep() { python3 -c 'import sys; b, o, n, v, c, a = sys.argv[1:]; n = int(n); sys.stdout.write(b + o * n + v + c * n + a)' "$@"; }
json_limit="nested deeper than 512 levels (ferry reads JSON nested at most 512 deep)"
yaml_limit="nested deeper than 64 levels (ferry reads YAML nested at most 64 deep)"

case $case_ in
deep_config)
  deep '' '{"a": ' 200000 1 '}' '' > "$work/deep.json"
  expect 2 "$work/deep.json: line 1: $json_limit" -- "$ferry" train --config "$work/deep.json"
  deep '{"model":' $'\n[' 200000 '' $'\n]' '}' > "$work/lines.json"
  expect 2 "$work/lines.json: line 513: $json_limit" -- "$ferry" train --config "$work/lines.json"
  # At the bound a file is read (and refused for what it says).
  deep '{"model": {"n_layer": ' '[' 510 '' ']' '}}' > "$work/edge.json"
  expect 2 "key 'model.n_layer'" -- "$ferry" train --config "$work/edge.json"
  grep -qF "nested deeper" "$work/out" && fail "a file at the bound was refused for its nesting"
  expect 2 "--set train.steps=[[[" -- "$ferry" train "${small[@]}" --set "train.steps=$(deep '' '[' 1000 '' ']' '')"
  grep -qF "line 1: $json_limit" "$work/out" || fail "the --set refusal does not name the bound"
  ;;
deep_runtime)
  deep '{"zero_optimization": ' '{"stage": ' 200000 3 '}' '}' > "$work/ds.json"
  expect 2 "$work/ds.json: line 1: $json_limit" -- "$ferry" train "${small[@]}" --deepspeed "$work/ds.json"
  deep 'fsdp_config: ' '[' 200000 'a' ']' $'\n' > "$work/flow.yaml"
  expect 2 "$work/flow.yaml: line 1: $yaml_limit" -- "$ferry" train "${small[@]}" --fsdp "$work/flow.yaml"
  deep $'fsdp_config:\n  fsdp_transformer_layer_cls_to_wrap:\n' '- ' 200000 'GPT2Block' '' $'\n' > "$work/seq.yaml"
  expect 2 "$work/seq.yaml: line 3: $yaml_limit" -- "$ferry" train "${small[@]}" --fsdp "$work/seq.yaml"
  python3 -c 'import sys; sys.stdout.write("".join(" " * i + "k%d:\n" % i for i in range(2000)))' > "$work/maps.yaml"
  expect 2 "$work/maps.yaml: line 65: $yaml_limit" -- "$ferry" train "${small[@]}" --fsdp "$work/maps.yaml"
  deep '{"fsdp_config": ' '[' 200000 '' ']' '}' > "$work/fsdp.json"
  expect 2 "$work/fsdp.json: line 1: $json_limit" -- "$ferry" train "${small[@]}" --fsdp "$work/fsdp.json"
  # accelerate's own FSDP file, as it ships, still reads.
  printf 'compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_transformer_layer_cls_to_wrap: GPT2Block\nnum_processes: 1\n' > "$work/ok.yaml"
  expect 0 "step 1/1" -- "$ferry" train "${small[@]}" --set train.steps=1 --fsdp "$work/ok.yaml"
  ;;
deep_data)
  head -2 "$src/examples/data/verses.jsonl" > "$work/train.jsonl"
  deep '{"prompt": "a", "completion": ' '[' 200000 '"b"' ']' $'}\n' >> "$work/train.jsonl"
  expect 1 "data.path '$work/train.jsonl': line 3: $json_limit" -- \
    "$ferry" train "${small[@]}" --set data.path="$work/train.jsonl" --set data.format=jsonl --set train.steps=1
  ;;
deep_model)
  cp -r "$src/tests/data/hf/llama3" "$work/model"
  cat > "$work/run.json" <<JSON
{"model": {"init_from": "$work/model", "block_size": 32},
 "data": {"path": "$src/examples/data/kjv.txt", "format": "text"},
 "device": {"type": "cpu", "memory": "64MiB", "threads": 1},
 "train_micro_batch_size_per_gpu": 2,
 "train": {"steps": 1, "eval_every": 0, "eval_batches": 1, "sample_tokens": 0}}
JSON
  run=(train --config "$work/run.json")
  expect 0 "step 1/1" -- "$ferry" "${run[@]}"  # the folder as it is reads
  for f in config.json tokenizer.json tokenizer_config.json; do
    cp "$work/model/$f" "$work/$f.orig"
    deep '{"x": ' '[' 200000 '' ']' '}' > "$work/model/$f"
    expect "$([ $f = config.json ] && echo 2 || echo 1)" "$work/model/$f: line 1: $json_limit" -- "$ferry" "${run[@]}"
    cp "$work/$f.orig" "$work/model/$f"
  done
  ck=$work/ck
  timeout 120 "$ferry" train "${small[@]}" --set train.steps=1 --set checkpoint.dir="$ck" > "$work/out" 2>&1 ||
    fail "the run that writes the checkpoint failed"
  deep '{"format_version": 1, "x": ' '[' 200000 '' ']' '}' > "$ck/step-00000001/manifest.json"
  expect 1 "$ck/step-00000001/manifest.json: line 1: $json_limit" -- \
    "$ferry" train "${small[@]}" --set train.steps=2 --set checkpoint.dir="$ck" --resume auto
  ;;
deep_template)
  cp -r "$src/tests/data/hf/llama3" "$work/model"
  rm -f "$work/model/chat_template.jinja"
  for i in 1 2 3 4 5 6; do echo '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'; done > "$work/chat.jsonl"
  cat > "$work/run.json" <<JSON
{"model": {"init_from": "$work/model", "block_size": 32},
 "data": {"path": "$work/chat.jsonl", "format": "jsonl", "val_fraction": 0.5},
 "device": {"type": "cpu", "memory": "64MiB", "threads": 1},
 "train_micro_batch_size_per_gpu": 2,
 "train": {"steps": 1, "eval_every": 0, "eval_batches": 1, "sample_tokens": 0}}
JSON
  tc=$work/model/tokenizer_config.json
  cp "$tc" "$work/tc.orig"
  for kind in parens blocks chain; do
    python3 - "$work/tc.orig" "$tc" "$kind" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
n = 100000
doc["chat_template"] = {"parens": "{{ " + "(" * n + "1" + ")" * n + " }}",
                        "blocks": "{% if true %}" * n + "x" + "{% endif %}" * n,
                        "chain": "{{ 1" + " + 1" * n + " }}"}[sys.argv[3]]
json.dump(doc, open(sys.argv[2], "w"))
PY
    expect 1 "chat template $tc: chat_template:1:" -- "$ferry" train --config "$work/run.json"
    grep -qF "nested deeper than 256 levels" "$work/out" || fail "the $kind template's refusal does not name the bound"
  done
  ;;
deep_value)
  cp -r "$src/tests/data/hf/llama3" "$work/model"
  for i in 1 2 3 4 5 6; do echo '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'; done > "$work/chat.jsonl"
  cat > "$work/run.json" <<JSON
{"model": {"init_from": "$work/model", "block_size": 32},
 "data": {"path": "$work/chat.jsonl", "format": "jsonl", "val_fraction": 0.5, "chat_template": "$work/t.jinja"},
 "device": {"type": "cpu", "memory": "64MiB", "threads": 1},
 "train_micro_batch_size_per_gpu": 2,
 "train": {"steps": 1, "eval_every": 0, "eval_batches": 1, "sample_tokens": 0}}
JSON
  turns='{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>{{ m.content }}<|eot_id|>{% endfor %}'
  turns+='{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{% endif %}'
  # template LINE2: a first line making a namespace, LINE2 building in it, then the turns.
  template() { printf '%s\n%s\n%s' "{% set ns = namespace(x=[]) %}{% set h = namespace(n=none) %}" "$1" "$turns" > "$work/t.jinja"; }
  wrap="{% for i in 'x' * 300 %}{% for j in 'x' * 300 %}{% set ns.x = [ns.x] %}{% endfor %}{% endfor %}"
  limit="a value nested deeper than 512 levels"
  template "$wrap{{ ns.x }}"
  expect 1 "chat template $work/t.jinja:2:63: $limit" -- "$ferry" train --config "$work/run.json"
  template "$wrap{{ ns.x | tojson }}"
  expect 1 "chat template $work/t.jinja:2:63: $limit" -- "$ferry" train --config "$work/run.json"
  template "{% for i in 'x' * 2000 %}{% set h.n = namespace(n=h.n) %}{% endfor %}{{ h }}"
  expect 1 "chat template $work/t.jinja:2:70: $limit" -- "$ferry" train --config "$work/run.json"
  # jinja2's own output for a namespace inside itself (the sample's prompt, 32 tokens, is the
  # rendering's start); a value at the bound renders and trains.
  template "{% set ns.x = [ns] %}{{ ns }}"
  expect 0 "<Namespace {'x': [<Namespace {...}>]" -- "$ferry" train --config "$work/run.json" --set train.sample_tokens=1
  grep -qF "step 1/1" "$work/out" || fail "no step"
  template "{% for i in 'x' * 511 %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x | tojson | length }}"
  expect 0 "step 1/1" -- "$ferry" train --config "$work/run.json"
  ;;
nvme_swap)
  nvme=$work/nvme ck=$work/ck
  mkdir -p "$nvme"
  on_nvme=(--set zero_optimization.stage=3 --set zero_optimization.offload_optimizer.device=nvme
           --set zero_optimization.offload_optimizer.nvme_path="$nvme" --set zero_optimization.offload_param.device=nvme
           --set zero_optimization.offload_param.nvme_path="$nvme")
  # A file a killed run left: reused, then removed with the rest.
  head -c 4096 /dev/zero > "$nvme/ferry-optimizer-rank0.swp"
  expect 0 "step 2/2" -- "$ferry" train "${small[@]}" "${on_nvme[@]}" --set train.steps=2 --set checkpoint.dir="$ck"
  grep -qF "nvme" "$work/out" || fail "the run did not say it used NVMe"
  left=$(find "$nvme" -name '*.swp')
  [ -z "$left" ] || fail "swap files left after a normal end: $left"
  echo "ok: no *.swp under $nvme after the run"
  [ -f "$ck/step-00000002/manifest.json" ] || fail "the checkpoint is not there"
  (cd "$ck" && find . -type f -exec sha256sum {} + | sort) > "$work/ck.sums"
  # A run that stops on an error after its swap files are open: a checkpoint of another shape.
  expect 1 "model.n_embd is 32 in the checkpoint but 64 in the config" -- \
    "$ferry" train "${small[@]}" "${on_nvme[@]}" --set model.n_embd=64 --set train.steps=3 --set checkpoint.dir="$ck" --resume auto
  left=$(find "$nvme" -name '*.swp')
  [ -z "$left" ] || fail "swap files left after an error exit: $left"
  echo "ok: no *.swp under $nvme after the error exit"
  (cd "$ck" && find . -type f -exec sha256sum {} + | sort) | diff -q "$work/ck.sums" - > /dev/null ||
    fail "the checkpoint changed"
  echo "ok: the checkpoint is untouched"
  ;;
nvme_abort)
  # Two ranks, optimizer and parameters on NVMe: rank 1's optimizer writes fail
  # (FERRY_IO_FAULTS on its file only), so it ends the job through MPI_Abort, which kills
  # rank 0 where it stands (mpiexec's SIGKILL: no destructor runs). Rank 0's swap files
  # go too (rank 1 tells every peer before aborting: comm/peers.h, base/scratch_files.h);
  # the checkpoint beside them, in the same folder, is untouched.
  nvme=$(cd "$work" && pwd)/nvme ck=$(cd "$work" && pwd)/nvme/ck  # absolute: FERRY_IO_FAULTS matches absolute paths
  mkdir -p "$nvme"
  on_nvme=(--set zero_optimization.stage=3 --set zero_optimization.offload_optimizer.device=nvme
           --set zero_optimization.offload_optimizer.nvme_path="$nvme" --set zero_optimization.offload_param.device=nvme
           --set zero_optimization.offload_param.nvme_path="$nvme")
  expect 0 "step 1/1" -- mpiexec -n 2 "$ferry" train "${small[@]}" "${on_nvme[@]}" --set train.steps=1 --set checkpoint.dir="$ck"
  [ -f "$ck/step-00000001/manifest.json" ] || fail "the checkpoint is not there"
  (cd "$ck" && find . -type f -exec sha256sum {} + | sort) > "$work/ck.sums"
  expect 1 "rank 1: write '$nvme/ferry-optimizer-rank1.swp' at offset" -- \
    env FERRY_IO_FAULTS="1:1:eio:$nvme/ferry-optimizer-rank1" mpiexec -n 2 \
    "$ferry" train "${small[@]}" "${on_nvme[@]}" --set train.steps=3 --set checkpoint.dir="$ck" --resume auto
  grep -qF "ending the job (MPI_Abort)" "$work/out" || fail "the job did not end through MPI_Abort"
  left=$(find "$nvme" -name '*.swp')
  [ -z "$left" ] || fail "swap files left after MPI_Abort: $left"
  echo "ok: no *.swp under $nvme after MPI_Abort"
  (cd "$ck" && find . -type f -exec sha256sum {} + | sort) | diff -q "$work/ck.sums" - > /dev/null ||
    fail "the checkpoint changed"
  echo "ok: the checkpoint is untouched"
  ;;
*)
  echo "unknown case $case_"; exit 1 ;;
esac
echo "PASS: $case_"
