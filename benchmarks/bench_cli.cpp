#include "benchmarks/bench_cli.h"

#include <iostream>
#include <memory>
#include <string>

#include "benchmarks/bench_adam.h"
#include "benchmarks/bench_attention.h"
#include "benchmarks/bench_ckpt.h"
#include "benchmarks/bench_comm.h"
#include "benchmarks/bench_io.h"
#include "benchmarks/bench_model.h"
#include "benchmarks/bench_report.h"
#include "benchmarks/bench_step.h"
#include "benchmarks/bench_lora.h"
#include "benchmarks/bench_tokenize.h"

namespace ferry::bench {

namespace {

// --threads: all digits and >= 1 (CLI11's PositiveNumber calls "abc" out of range).
const CLI::Validator kPositive(
    [](std::string& v) -> std::string {
      const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
      return digits && v.find_first_not_of('0') != std::string::npos ? "" : "'" + v + "' is not a whole number >= 1";
    },
    ">=1");

struct BenchArgs {
  std::string json_path, path, trace_path, tokenizer, python, peers;
  ModelBenchOptions opt;  // threads, quick, only, device, bf16 (model); threads, quick elsewhere
};

int run(const std::string& name, const BenchArgs& a) {
  try {
    Report report;
    bool is_root = true;
    int rc = 0;
    const auto publish = [&] {
      print_table(report);
      if (!a.json_path.empty()) {
        write_json(report, a.json_path);
        std::cout << "wrote " << a.json_path << "\n";
      }
      std::cout.flush();
    };
    if (name == "model") {
      ModelBenchOptions o = a.opt;
      if (o.device == "cuda") o.device_memory = 0;  // sized to the GPU
      rc = run_model_bench(o, report);
    } else if (name == "io") {
      rc = run_io_bench(IoBenchOptions{a.path, a.opt.quick, a.peers}, report);
    } else if (name == "step") {
      rc = run_step_bench(StepBenchOptions{a.path, a.opt.quick, a.trace_path, a.opt.bf16, a.opt.device, a.peers}, report);
    } else if (name == "lora") {
      rc = run_lora_bench(LoraBenchOptions{a.opt.threads, a.opt.quick, a.peers}, report);
    } else if (name == "ckpt") {
      rc = run_ckpt_bench(CkptBenchOptions{a.path, a.opt.quick}, report);
    } else if (name == "tokenize") {
      rc = run_tokenize_bench(TokenizeBenchOptions{a.tokenizer, a.path, a.python, a.opt.threads, a.opt.quick}, report);
    } else if (name == "attention") {
      rc = run_attention_bench(AttentionBenchOptions{a.opt.device, a.opt.bf16, a.python, a.opt.threads, a.opt.quick},
                               report);
    } else if (name == "adam") {
      rc = run_adam_bench(AdamBenchOptions{a.opt.threads, 100'000'000, a.opt.quick, a.peers},
                          report);
    } else {
      bool printed = false;
      rc = run_comm_bench(CommBenchOptions{a.opt.quick}, report, is_root, [&] {
        publish();
        printed = true;
      });
      if (printed || !is_root) return rc;
    }
    publish();
    return rc;
  } catch (const std::exception& e) {
    std::cerr << "ferry bench " << name << ": error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

std::function<int()> bench_command(CLI::App& cmd) {
  auto a = std::make_shared<BenchArgs>();
  cmd.description(
      "measure ferry against references taken in the same run (model, comm, adam, io, ckpt, step, lora, tokenize)");
  cmd.require_subcommand(1);
  const auto add = [&](const char* name, const char* what) {
    CLI::App* b = cmd.add_subcommand(name, what);
    b->add_option("--json", a->json_path, "also write the result as JSON to this file");
    b->add_flag("--quick", a->opt.quick, "fewer sizes and repetitions (a smoke test)");
    return b;
  };
  const auto threads = [&](CLI::App* b) {
    b->add_option("--threads", a->opt.threads, "CPU threads (default: all cores)")->check(kPositive);
  };
  CLI::App* model = add("model",
                        "forward+backward tokens/s and GFLOP/s of the tiny and a ~50M-parameter GPT on the CPU, as a "
                        "fraction of Eigen's GEMM at the model's shapes; --device cuda: GPT-2 124M/350M shapes against "
                        "cuBLAS's GEMM (MFU)");
  threads(model);
  model->add_option("--only", a->opt.only, "one configuration by name (e.g. tiny)");
  model->add_option("--device", a->opt.device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  model->add_flag("--bf16", a->opt.bf16, "bf16 weights and activations (fp32 accumulation)");
  model->add_option("--attention-kernel", a->opt.attention_kernel,
                    "cuda: attention's kernels, as device.attention_kernel (auto: mma where it can run, else "
                    "tensor_cores, else simt)")
      ->check(CLI::IsMember({"auto", "simt", "tensor_cores", "mma"}));
  model->add_flag("--predict", a->opt.predict,
                  "--device cuda: also the roofline ledger's predicted step time and MFU on an H100 and an H200 "
                  "(alone where there is no GPU)");
  model->add_option("--contexts", a->opt.contexts,
                    "the whole step at these contexts (e.g. 256,1024,4096,8192): --only's config, else the largest "
                    "config's shape, at the same tokens per step")
      ->delimiter(',');
  model->add_option("--peers", a->opt.peers,
                    "a Python with torch (scripts/make_peers_env.sh): PyTorch eager on the same GPT, tokens and "
                    "threads, alternating with ferry: forward+backward, and a whole training step (clipping, AdamW) "
                    "against ferry's Trainer")
      ->envname("FERRY_PEERS_PYTHON");
  model->add_option("--ranks", a->opt.ranks,
                    "also a whole training step at this many ranks, ferry's ZeRO-3 under mpiexec (with --peers, "
                    "against FSDP2 over gloo; threads per rank: --threads, or the cores split among the ranks)")
      ->check(kPositive);
  add("comm",
      "all_gather and reduce_scatter GB/s through ferry's communicator, 4-256 MiB, as a fraction of the same MPI "
      "collective called directly (run under mpiexec -n N); at 2+ hosts also the bytes each ZeRO-3 layout (plain, "
      "hybrid, hpZ) sends between hosts");
  CLI::App* adam = add(
      "adam",
      "CPU AdamW params/s on 100M fp32 params at 1 and all threads, against a STREAM-style triad; "
      "with --peers, against DeepSpeed's CPU Adam in the same run");
  threads(adam);
  adam->add_option("--peers", a->peers,
                   "a Python with torch and deepspeed (scripts/make_peers_env.sh): DeepSpeedCPUAdam "
                   "measured alongside, alternating with ferry")
      ->envname("FERRY_PEERS_PYTHON");
  CLI::App* io = add("io",
                     "sequential read/write GB/s of the NVMe store (io_uring, O_DIRECT) against fio on the same "
                     "file; with --peers, also against DeepSpeed's aio (libaio) in the same run");
  io->add_option("--path", a->path, "a folder on the disk to measure")->required();
  io->add_option("--peers", a->peers,
                 "a Python with torch and deepspeed (scripts/make_peers_env.sh): DeepSpeed's aio_handle measured "
                 "alongside, alternating with ferry and fio")
      ->envname("FERRY_PEERS_PYTHON");
  add("ckpt", "checkpoint write and read GB/s of a GPT with 1 GB of state against fio's sequential write and read")
      ->add_option("--path", a->path, "a folder on the disk to measure")
      ->required();
  CLI::App* tokenize = add("tokenize",
                           "encoding MB/s of a tokenizer.json on the bundled corpus at 1 and all threads; with --python, "
                           "against Hugging Face tokenizers in the same run");
  threads(tokenize);
  tokenize->add_option("--tokenizer", a->tokenizer, "tokenizer.json (default: tests/data/tokenizers/llama3)");
  tokenize->add_option("--corpus", a->path, "UTF-8 text (default: examples/data/kjv.txt)");
  tokenize->add_option("--python", a->python, "a Python with the tokenizers package: the reference");
  CLI::App* attention = add("attention",
                            "attention forward and backward alone at contexts 256-8192 (12 heads of 64, 8192 tokens "
                            "per call); on a GPU each kernel that can run (simt, tensor_cores, mma) a row; with "
                            "--python, against PyTorch's scaled_dot_product_attention in the same run");
  threads(attention);
  attention->add_option("--device", a->opt.device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  attention->add_flag("--bf16", a->opt.bf16, "bf16 q, k, v (f32 accumulation)");
  attention->add_option("--python", a->python, "a Python with torch: PyTorch's SDPA as the reference");
  CLI::App* lora = add("lora",
                       "LoRA (fp32) and QLoRA (bf16, NF4 base) training steps of a Llama-shape model on the CPU, "
                       "against PEFT on PyTorch eager with --peers (ferry's tokens/s over PEFT's; goal 1.2)");
  threads(lora);
  lora->add_option("--peers", a->peers,
                   "a Python with torch, transformers, peft and bitsandbytes (scripts/make_peers_env.sh): PEFT on "
                   "PyTorch eager, same model, rank, targets, batch and threads, alternating with ferry")
      ->envname("FERRY_PEERS_PYTHON");
  CLI::App* step = add("step",
                       "a step with parameters and optimizer state on NVMe: overlapped vs sequential, and vs the "
                       "longest of its resources measured alone");
  step->add_option("--nvme-path", a->path, "a folder on the disk to use")->required();
  step->add_option("--trace", a->trace_path, "Chrome trace of the overlapped run's last step");
  step->add_flag("--bf16", a->opt.bf16, "bf16 compute: parameter shards on NVMe in bf16 (half the reads)");
  step->add_option("--peers", a->peers,
                   "a Python with torch and deepspeed (scripts/make_peers_env.sh): DeepSpeed ZeRO-Infinity on the "
                   "CPU (parameters and optimizer on NVMe in the same folder) alternating with ferry's overlapped step")
      ->envname("FERRY_PEERS_PYTHON");
  step->add_option("--device", a->opt.device, "cpu | cuda (the GPU offload path; reports PCIe bytes per parameter)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  return [a, &cmd] { return run(cmd.get_subcommands().front()->get_name(), *a); };
}

}  // namespace ferry::bench
