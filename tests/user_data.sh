#!/usr/bin/env bash
# Model folders and data the way users have them (issue 37, "Models and data"), through the
# real executable, on tests/data/user_files/models (a Llama 3.x Instruct folder as
# transformers 5 saves it, and the ids transformers gives: see the README there).
# One ctest per case:
#   records      prompt/completion, text and messages records: ids equal to transformers'
#                (<|eot_id|>, the tokenizer's eos_token, ends them although config.json's
#                eos_token_id list starts with <|end_of_text|>; conversations through
#                chat_template.jinja); the run's header names the end token and its source
#   text_bos     a text corpus: one document, <|begin_of_text|> first as tokenizer(text) gives;
#                the header says so
#   text_lines   data.text_documents lines: a document per line, ids equal to datasets' text
#                loader + transformers as run_clm reads a .txt (CRLF, lone CR, a blank line,
#                U+2028 and form feeds that do not end a line)
#   export_chat  fine-tune 1 step, export --hf: every tokenizer, chat-template and generation
#                file comes back byte for byte (chat_template.jinja, additional_chat_templates/),
#                and the exported folder tokenizes the records as the source did
# usage: user_data.sh CASE FERRY SOURCE_DIR WORKDIR
set -u
case_=$1 ferry=$2 src=$3 work=$4/user-data-$case_
models=$src/tests/data/user_files/models
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; echo "--- output:"; tail -20 "$work/out"; exit 1; }
# run NAME command...: must succeed; output in $work/NAME.log.
run() {
  local name=$1 status=0
  shift
  timeout 120 "$@" > "$work/$name.log" 2>&1 || status=$?
  [ "$status" = 0 ] || { cp "$work/$name.log" "$work/out"; fail "exit status $status: $*"; }
}
# A config for a folder and a data file (block_size and val_fraction given).
config() {  # FOLDER DATA FORMAT BLOCK VAL > file
  cat <<JSON
{"model": {"init_from": "$1", "block_size": $4},
 "data": {"path": "$2", "format": "$3", "val_fraction": $5},
 "device": {"type": "cpu", "memory": "64MiB", "threads": 1},
 "train_micro_batch_size_per_gpu": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "train": {"steps": 1, "eval_every": 0, "eval_batches": 1, "sample_tokens": 0},
 "log": {"every": 1}}
JSON
}
ids_of() { od -An -tu4 -v "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'; }
same_ids() {  # TOKENIZE_DIR EXPECTED_IDS_FILE
  local got want
  got=$(ids_of "$1/tokens.bin")
  want=$(tr -s ' \n' ' ' < "$2" | sed 's/^ //; s/ $//')
  [ "$got" = "$want" ] || { echo "got:  $got"; echo "want: $want"; fail "ids differ from transformers' ($2)"; }
  echo "ok: $(echo "$got" | wc -w) ids equal to transformers' ($(basename "$2"))"
}
header_has() {  # FILE TEXT
  grep -qF -- "$2" "$1" || { cp "$1" "$work/out"; fail "no line with '$2'"; }
  echo "ok: $(grep -oF -- "$2" "$1" | head -1)"
}

case $case_ in
records)
  config "$models/llama3-instruct" "$models/expected/records.jsonl" jsonl 64 0.2 > "$work/cfg.json"
  run tok "$ferry" tokenize --config "$work/cfg.json" --out "$work/tok"
  same_ids "$work/tok" "$models/expected/records.ids"
  run train "$ferry" train --config "$work/cfg.json"
  header_has "$work/train.log" "prompt/completion and text records end with <|eot_id|> (id 1005), tokenizer_config.json's eos_token"
  header_has "$work/train.log" "messages records rendered by the chat template of $models/llama3-instruct/chat_template.jinja"
  header_has "$work/train.log" "step 1/1"
  ;;
text_bos)
  config "$models/llama3-instruct" "$models/expected/corpus.txt" text 16 0.3 > "$work/cfg.json"
  run tok "$ferry" tokenize --config "$work/cfg.json" --out "$work/tok"
  same_ids "$work/tok" "$models/expected/corpus.ids"
  run train "$ferry" train --config "$work/cfg.json"
  header_has "$work/train.log" "the file is one document, encoded as tokenizer(text) encodes it (data.text_documents lines: one per line): the tokenizer's post-processor puts <|begin_of_text|> (id 1001) before it"
  header_has "$work/train.log" "step 1/1"
  ;;
text_lines)
  config "$models/llama3-instruct" "$models/expected/lines.txt" text 16 0.0 > "$work/cfg.json"
  run tok "$ferry" tokenize --config "$work/cfg.json" --out "$work/tok" --set data.text_documents=lines
  same_ids "$work/tok" "$models/expected/lines.ids"
  run train "$ferry" train --config "$work/cfg.json" --set data.text_documents=lines
  header_has "$work/train.log" "each line is a document (data.text_documents lines: datasets' text loader with its line ends, as run_clm reads a .txt), encoded as tokenizer(line) encodes it"
  ;;
export_chat)
  config "$models/llama3-instruct" "$models/expected/records.jsonl" jsonl 64 0.2 > "$work/cfg.json"
  run train "$ferry" train --config "$work/cfg.json" --set checkpoint.dir="$work/ck"
  run export "$ferry" export --checkpoint "$work/ck" --hf "$work/out-model" --dtype bf16
  header_has "$work/export.log" "carried from the source folder: additional_chat_templates/tool_use.jinja, chat_template.jinja, generation_config.json, tokenizer.json, tokenizer_config.json"
  for f in tokenizer.json tokenizer_config.json chat_template.jinja additional_chat_templates/tool_use.jinja generation_config.json; do
    cmp -s "$models/llama3-instruct/$f" "$work/out-model/$f" || fail "$f is not carried as it was"
  done
  echo "ok: every tokenizer, chat-template and generation file carried byte for byte"
  grep -q '"eos_token_id": \[' "$work/out-model/config.json" || fail "config.json lost its eos_token_id list"
  # The fine-tuned folder comes back with its chat format: the same records, the same ids.
  config "$work/out-model" "$models/expected/records.jsonl" jsonl 64 0.2 > "$work/cfg2.json"
  run tok "$ferry" tokenize --config "$work/cfg2.json" --out "$work/tok"
  same_ids "$work/tok" "$models/expected/records.ids"
  ;;
*)
  echo "unknown case $case_"
  exit 2
  ;;
esac
echo "PASS: $case_"
