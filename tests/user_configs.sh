#!/usr/bin/env bash
# The configuration files users already have (issue 37), through the real executable: each
# fixture of tests/data/user_files/configs (sources in its README) trains 2 steps of a tiny
# model, or is refused with the stated message. One ctest per case:
#   axolotl_zero3     axolotl's zero3_bf16.json: max_live_parameters 0 runs; a bad value is
#                     named as the file writes it; --set replaces the file's value first
#   trl_yaml          TRL's accelerate deepspeed_zero3.yaml through --deepspeed (fp16, ZeRO-3;
#                     num_processes 8 a warning)
#   handbook_yaml     alignment-handbook's deepspeed_zero3.yaml through --fsdp (read as
#                     --deepspeed; cpu offload, bf16)
#   ds_config_file    an accelerate YAML whose deepspeed_config_file sits beside it
#   trainer_fsdp      a Trainer fsdp_config.json with fsdp_cuda_graphs false and FSDP2 keys
#   autotp            tensor_parallel.autotp_size 2: refused
#   nvme_new_folder   relative nvme_paths that do not exist yet: created under the work
#                     folder; one under a regular file: refused naming file, key, OS error
#   batch_mismatch    train_batch_size from the DeepSpeed file: the error names that file
# usage: user_configs.sh CASE FERRY SOURCE_DIR WORKDIR
set -u
case_=$1 ferry=$2 src=$3 work=$4/user-configs-$case_
files=$src/tests/data/user_files/configs
rm -rf "$work" && mkdir -p "$work"
small=(--config "$src/examples/configs/tiny-model.json" --set model.n_layer=2 --set model.n_embd=32
       --set model.n_head=2 --set model.block_size=32 --set train_micro_batch_size_per_gpu=4
       --set device.threads=1 --set train.eval_every=0 --set train.eval_batches=1 --set train.sample_tokens=0
       --set log.every=50 --set train.steps=2 --verbose)  # --verbose: the resolved and ignored lists
fail() { echo "FAIL: $*"; echo "--- output:"; tail -20 "$work/out"; exit 1; }
# expect STATUS PATTERN -- command...: the exit status and one line holding PATTERN.
expect() {
  local want=$1 pattern=$2
  shift 3
  timeout 240 "$@" > "$work/out" 2>&1
  local got=$?
  [ "$got" = "$want" ] || fail "exit status $got, expected $want: $*"
  grep -qF -- "$pattern" "$work/out" || fail "no line with '$pattern'"
  echo "ok: exit $got, $(grep -F -- "$pattern" "$work/out" | head -1)"
}
# has PATTERN: the last command's output holds PATTERN too.
has() { grep -qF -- "$1" "$work/out" || fail "no line with '$1'"; }
# trained: the last command ran its 2 steps.
trained() { grep -q "^step 2/2 | loss" "$work/out" || fail "no step 2 in the output"; }

case $case_ in
axolotl_zero3)
  expect 0 "zero_optimization.stage3_prefetch_bucket_size = 921" -- \
    "$ferry" train "${small[@]}" --deepspeed "$files/axolotl_zero3_bf16.json"
  has '"stage3_max_live_parameters": 0'
  has "zero_optimization.max_reuse_distance"
  trained
  printf '{"zero_optimization": {"stage": 3, "max_live_parameters": -5}}\n' > "$work/ds.json"
  expect 2 "$work/ds.json: key 'zero_optimization.max_live_parameters' must be >= 0, got -5" -- \
    "$ferry" train "${small[@]}" --deepspeed "$work/ds.json"
  expect 0 '"stage3_max_live_parameters": 100000' -- \
    "$ferry" train "${small[@]}" --deepspeed "$work/ds.json" --set zero_optimization.stage3_max_live_parameters=100000
  trained
  ;;
trl_yaml)
  expect 0 "deepspeed_config.zero_stage = 3 -> zero_optimization.stage = 3" -- \
    "$ferry" train "${small[@]}" --deepspeed "$files/trl_deepspeed_zero3.yaml"
  has "mixed_precision = fp16 -> bf16.enabled = false, fp16.enabled = true"
  has "num_processes is 8 but the run has 1 rank(s)"
  has "deepspeed_config.zero3_init_flag"
  trained
  ;;
handbook_yaml)
  expect 0 "distributed_type DEEPSPEED, read as --deepspeed reads it" -- \
    "$ferry" train "${small[@]}" --fsdp "$files/handbook_deepspeed_zero3.yaml"
  has "deepspeed_config.offload_param_device = cpu -> zero_optimization.offload_param.device = cpu"
  has "mixed_precision = bf16 -> bf16.enabled = true"
  trained
  ;;
ds_config_file)
  expect 0 "-> the DeepSpeed keys of $files/ds_config_zero2.json" -- \
    "$ferry" train "${small[@]}" --deepspeed "$files/accelerate_ds_file.yaml"
  has "zero_optimization.reduce_scatter"
  trained
  # Inline keys beside the file: refused as accelerate refuses them.
  sed 's/  zero3_init_flag: false/  zero_stage: 2/' "$files/accelerate_ds_file.yaml" > "$work/both.yaml"
  cp "$files/ds_config_zero2.json" "$work/"
  expect 2 "$work/both.yaml: key 'deepspeed_config.zero_stage': is set beside deepspeed_config_file" -- \
    "$ferry" train "${small[@]}" --deepspeed "$work/both.yaml"
  ;;
trainer_fsdp)
  expect 0 "fsdp_reshard_after_forward = true -> zero_optimization.stage = 3" -- \
    "$ferry" train "${small[@]}" --fsdp "$files/trainer_fsdp_config.json"
  has "fsdp_cuda_graphs"
  trained
  ;;
autotp)
  expect 2 "ds_autotp_size2.json: key 'tensor_parallel.autotp_size': tensor parallelism (AutoTP) over 2 ranks is not implemented" -- \
    "$ferry" train "${small[@]}" --deepspeed "$files/ds_autotp_size2.json"
  ;;
nvme_new_folder)
  cp "$files/ds_nvme_new_folder.json" "$work/ds.json"
  # Given as a relative path: its nvme_paths are relative to its folder, not ferry's file's.
  expect 0 "zero_optimization.stage3_prefetch_bucket_size = 921" -- \
    env -C "$work" "$ferry" train "${small[@]}" --deepspeed ds.json
  trained
  [ -d "$work/nvme-swap/optimizer" ] && [ -d "$work/nvme-swap/params" ] || fail "nvme folders not created under $work"
  touch "$work/plain-file"
  sed 's#nvme-swap/optimizer#plain-file/optimizer#' "$work/ds.json" > "$work/bad.json"
  expect 2 "$work/bad.json: key 'zero_optimization.offload_optimizer.nvme_path': cannot create the nvme_path folder $work/plain-file/optimizer: Not a directory" -- \
    "$ferry" train "${small[@]}" --deepspeed "$work/bad.json"
  ;;
batch_mismatch)
  expect 2 "$files/ds_batch_mismatch.json: train_batch_size (64) must equal train_micro_batch_size_per_gpu (4, from --set) x gradient_accumulation_steps (1) x world size (1) = 4" -- \
    "$ferry" train "${small[@]}" --deepspeed "$files/ds_batch_mismatch.json"
  ;;
*)
  echo "unknown case $case_"
  exit 1
  ;;
esac
rm -rf "$work"
echo "PASS: $case_"
