#pragma once

#include <string>

#include "benchmarks/bench_report.h"

namespace ferry::bench {

struct TokenizeBenchOptions {
  std::string tokenizer;  // a tokenizer.json; "" = tests/data/tokenizers/llama3
  std::string corpus;     // "" = examples/data/kjv.txt
  std::string python;     // a Python with `tokenizers`: the reference, measured in the same run
  int threads = 0;        // 0 = all cores
  bool quick = false;
};

int run_tokenize_bench(const TokenizeBenchOptions& opt, Report& report);

}  // namespace ferry::bench
