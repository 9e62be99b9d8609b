#pragma once

#include <string>

#include "benchmarks/bench_report.h"

namespace ferry::bench {

struct LoraBenchOptions {
  int threads = 0;     // 0 = all cores, both sides
  bool quick = false;  // a small model (smoke test)
  // A Python with torch, transformers, peft and bitsandbytes (scripts/make_peers_env.sh):
  // PEFT on PyTorch eager on the CPU with the same model shape, rank, targets, batch and
  // threads (benchmarks/peers/lora_peer.py), alternated with ferry round by round. "" =
  // ferry alone.
  std::string peers;
};

// Training steps of a Llama-shape model with LoRA adapters (r 16, alpha 32, every block
// projection; one rank, the CPU device, every state in memory), two cases:
//   lora    fp32, the base in fp32
//   qlora   bf16 compute, the base in NF4 (double quantized), as transformers' QLoRA
//   full    the same model trained in full (fp32): the in-run reference without peers
// each a median over timed steps after warm-up steps; with --peers, five rounds alternating
// with PEFT, each starting with the other side, and ferry's tokens/s over PEFT's (the goal
// is 1.2, issue 40); without, LoRA's tokens/s over the full fine-tune's (goal 1: the frozen
// base must cost less). The peer's trained parameter count must equal ferry's (the same
// adapters), else std::runtime_error naming the peer.
int run_lora_bench(const LoraBenchOptions& opt, Report& report);

}  // namespace ferry::bench
