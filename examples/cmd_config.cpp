// ferry config deepspeed|ferry [choices] [--output FILE [--force]]
// Writes a ready configuration from a few flags (runtime/tools/config_writer.h): a DeepSpeed
// ds_config.json, or a ferry configuration file; checked by ferry's own loader first, then
// written to FILE (never over an existing one without --force) or, with no --output or
// `-`, to stdout. What it chose is printed one key a line: on stdout after writing a file,
// on stderr when the JSON itself goes to stdout. Exit status: 0 written; 1 the output
// exists or cannot be written; 2 the command line is wrong or the choices do not go together.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "examples/commands.h"
#include "runtime/config/config.h"
#include "runtime/tools/config_writer.h"

namespace ferry::cli {

namespace {

struct ConfigArgs {
  runtime::ConfigChoices c;
  std::string output;
  bool force = false;
};

// The choices both kinds take.
void add_choices(CLI::App& cmd, ConfigArgs& a) {
  runtime::ConfigChoices& c = a.c;
  cmd.add_option("--zero-stage", c.zero_stage, "ZeRO stage 0-3 (default 2)")
      ->check(CLI::Range(0, 3));
  cmd.add_option("--offload-optimizer", c.offload_optimizer,
                 "none | cpu | nvme: Adam state (stage 1-3)")
      ->check(CLI::IsMember({"none", "cpu", "nvme"}));
  cmd.add_option("--offload-param", c.offload_param,
                 "none | cpu | nvme: parameter shards (stage 3)")
      ->check(CLI::IsMember({"none", "cpu", "nvme"}));
  cmd.add_option("--nvme-path", c.nvme_path, "the folder nvme offload swaps to (written absolute)");
  cmd.add_flag("!--no-pin-memory", c.pin_memory,
               "offload without page-locked buffers (pin_memory: false)");
  cmd.add_flag("--bf16", c.bf16, "mixed precision in bf16 (bf16.enabled)");
  cmd.add_flag("--fp16", c.fp16,
               "mixed precision in fp16 with dynamic loss scaling (fp16.enabled)");
  // Unset optionals: "auto" in a DeepSpeed file, left out of a ferry file.
  cmd.add_option("--micro-batch", c.micro_batch, "train_micro_batch_size_per_gpu")
      ->check(at_least(1));
  cmd.add_option("--grad-accum", c.grad_accum, "gradient_accumulation_steps")->check(at_least(1));
  cmd.add_option("--clip", c.clip, "gradient_clipping (0 = none)")->check(CLI::NonNegativeNumber);
  cmd.add_option("--lr", c.lr, "optimizer.params.lr (AdamW)")->check(CLI::PositiveNumber);
  cmd.add_option("--weight-decay", c.weight_decay, "optimizer.params.weight_decay")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--warmup-steps", c.warmup_steps, "a scheduler warming up over N steps (linear)")
      ->check(at_least(0));
  cmd.add_option("--scheduler", c.scheduler,
                 "with --warmup-steps: WarmupLR | WarmupDecayLR (default) | WarmupCosineLR")
      ->check(CLI::IsMember({"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}));
  cmd.add_option("--shard-group-size", c.shard_group_size,
                 "hybrid sharding: shard within groups of G ranks (DeepSpeed's mics_shard_size)")
      ->check(at_least(1));
  cmd.add_option("-o,--output", a.output, "the file to write; '-' or none: stdout");
  cmd.add_flag("--force", a.force, "overwrite an existing --output");
}

int write(const ConfigArgs& a, bool deepspeed) {
  runtime::WrittenConfig w;
  try {
    w = deepspeed ? runtime::deepspeed_config(a.c) : runtime::ferry_config(a.c);
  } catch (const runtime::ConfigError& e) {
    throw UsageError(e.what());
  }
  const std::string text = w.doc.dump(2) + "\n";
  const bool to_stdout = a.output.empty() || a.output == "-";
  std::ostream& report = to_stdout ? std::cerr : std::cout;
  if (to_stdout) {
    std::cout << text;
  } else {
    if (std::filesystem::exists(a.output) && !a.force) {
      std::cerr << "ferry config: " << a.output << " exists; --force overwrites it\n";
      return 1;
    }
    std::ofstream out(a.output);
    out << text;
    out.close();
    if (!out) {
      std::cerr << "ferry config: cannot write " << a.output << "\n";
      return 1;
    }
  }
  report << "ferry config: " << (deepspeed ? "DeepSpeed" : "ferry")
         << " configuration, checked by ferry's loader, "
         << (to_stdout ? std::string("on stdout") : "written to " + a.output) << ":\n";
  for (const std::string& line : w.choices) report << "  " << line << "\n";
  const std::string file =
      to_stdout ? std::string(deepspeed ? "ds_config.json" : "ferry.json") : a.output;
  if (deepspeed) {
    report << "train with: ferry train --config FERRY.json --deepspeed " << file
           << "  (FERRY.json: model, data, device, train; e.g. examples/configs/tiny-model.json)\n";
  } else {
    report << "train with: ferry train --config " << file << "\n";
  }
  return 0;
}

}  // namespace

Run config_command(CLI::App& cmd) {
  auto a = std::make_shared<ConfigArgs>();
  cmd.description(
      "write a ready DeepSpeed ds_config.json or ferry configuration from a few choices");
  cmd.require_subcommand(1);
  CLI::App* ds = cmd.add_subcommand(
      "deepspeed", "a DeepSpeed ds_config.json (what no flag chooses is \"auto\")");
  CLI::App* fe = cmd.add_subcommand(
      "ferry", "a ferry configuration: model, data, device, train and the runtime keys");
  // Each sub-command has its own options, bound to the same fields: one of them parses.
  add_choices(*ds, *a);
  add_choices(*fe, *a);
  runtime::ConfigChoices& c = a->c;
  fe->add_option(
      "--model", c.model,
      "tiny (4 layers, 128 channels; default) or a model.preset (llama-tiny, llama-1b, ...)");
  fe->add_option("--init-from", c.init_from,
                 "a Hugging Face model folder: its shape and weights (instead of --model)");
  fe->add_option("--block-size", c.block_size, "model.block_size (context length)")
      ->check(at_least(1));
  fe->add_option("--data", c.data, "data.path: the training corpus (written absolute)")->required();
  fe->add_option("--data-format", c.data_format, "data.format (default text)")
      ->check(CLI::IsMember({"text", "uint16", "tokens", "jsonl"}));
  fe->add_option("--device", c.device, "cpu (default) or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  fe->add_option("--device-memory", c.device_memory, "device.memory, e.g. 1GiB");
  fe->add_option("--steps", c.steps, "train.steps")->check(at_least(1));
  return [a, ds] { return write(*a, ds->parsed()); };
}

}  // namespace ferry::cli
