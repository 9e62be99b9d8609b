// ferry tokenize --config FILE [--set key=value ...] --out DIR
// Encodes the run's data once (data.path in data.format, through data.tokenizer, with the
// run's prompt masking) into DIR: tokens.bin (uint32), for JSONL records counted.bin and
// starts.bin, and meta.json (runtime/train/data.h, TokenData::save). Runs on many nodes then
// read DIR with data.format tokens, memory-mapped, instead of tokenizing on every rank.
// Exit status: 0 written; 1 the data or the output was refused; 2 the command line or the
// configuration is wrong.
#include <iostream>
#include <memory>
#include <string>

#include "examples/commands.h"
#include "runtime/config/config.h"
#include "runtime/train/data.h"
#include "runtime/train/trainer.h"

namespace ferry::cli {

namespace {

struct TokenizeArgs {
  RunOptions run;
  std::string out;
};

int tokenize(const TokenizeArgs& a) {
  using namespace ferry::runtime;
  if (a.run.config.empty()) throw UsageError("--config FILE is required");
  const Config c = load_config(a.run.config, a.run.sets, 1, a.run.deepspeed, a.run.fsdp);
  if (c.data.format == "tokens") throw ConfigError("data.format is already 'tokens': nothing to tokenize");
  DataOptions options = data_options(c);
  options.val_fraction = 0;  // the split is the training run's choice
  const TokenData d = TokenData::load(options);
  d.save(a.out);
  std::cout << "tokenized " << d.describe() << " -> " << a.out << " (read it with data.format tokens, data.path "
            << a.out << ")\n";
  return 0;
}

}  // namespace

Run tokenize_command(CLI::App& cmd) {
  auto a = std::make_shared<TokenizeArgs>();
  cmd.description("encode a run's data (text or JSONL, through its tokenizer, prompts masked) once into token files");
  add_run_options(cmd, a->run, /*with_ranks=*/false);
  cmd.add_option("--out", a->out, "the folder to write (tokens.bin, counted.bin, starts.bin, meta.json)")->required();
  return [a] { return tokenize(*a); };
}

}  // namespace ferry::cli
