// ferry-bench <name> [--json PATH] [--threads T] [--quick]
// Each benchmark measures ferry against a reference taken in the same run on the same
// machine, prints a table and a headline ratio, and with --json writes the result.
#include <cstring>
#include <iostream>
#include <string>

#include "benchmarks/bench_adam.h"
#include "benchmarks/bench_ckpt.h"
#include "benchmarks/bench_step.h"
#include "benchmarks/bench_comm.h"
#include "benchmarks/bench_io.h"
#include "benchmarks/bench_model.h"
#include "benchmarks/bench_report.h"

namespace {

void usage(std::ostream& os) {
  os << "usage: ferry-bench model [--json PATH] [--threads T] [--quick] [--only NAME] [--device cpu|cuda] [--bf16]\n"
        "       mpiexec -n N ferry-bench comm [--json PATH] [--quick]\n"
        "       ferry-bench adam [--json PATH] [--threads T] [--quick]\n"
        "       ferry-bench io --path DIR [--json PATH] [--quick]\n"
        "       ferry-bench ckpt --path DIR [--json PATH] [--quick]\n"
        "       ferry-bench step --nvme-path DIR [--trace FILE] [--json PATH] [--quick]\n"
        "  model   forward+backward tokens/s and GFLOP/s of the tiny and a ~50M-parameter GPT\n"
        "          on the CPU device, as a fraction of Eigen's GEMM GFLOP/s at the model's shapes;\n"
        "          --device cuda: GPT-2 124M/350M shapes on the GPU, as a fraction of cuBLAS's GEMM\n"
        "          rate at those shapes measured in the same run (MFU; --bf16 for bf16)\n"
        "  comm    all_gather and reduce_scatter GB/s through ferry's communicator, 4-256 MiB,\n"
        "          as a fraction of the same MPI collective called directly\n"
        "  adam    CPU AdamW params/s on 100M fp32 params at 1 and all threads, against a\n"
        "          STREAM-style triad measured in the same run\n"
        "  io      sequential read/write GB/s of the NVMe store (io_uring, O_DIRECT) against fio\n"
        "          on the same file, block size and queue depth\n"
        "  step    a step with parameters and optimizer state on NVMe: overlapped vs sequential, and vs\n"
        "          the longest of its resources (CPU cores, NVMe traffic, communication) measured alone\n"
        "  ckpt    checkpoint write and read GB/s of a GPT with 1 GB of state against fio's\n"
        "          sequential write and read of as many bytes in the same folder\n";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry::bench;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  std::string json_path, io_path, trace_path;
  ModelBenchOptions opt;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      opt.threads = std::atoi(argv[++i]);
    } else if ((a == "--path" || a == "--nvme-path") && i + 1 < argc) {
      io_path = argv[++i];
    } else if (a == "--trace" && i + 1 < argc) {
      trace_path = argv[++i];
    } else if (a == "--only" && i + 1 < argc) {
      opt.only = argv[++i];
    } else if (a == "--quick") {
      opt.quick = true;
    } else if (a == "--device" && i + 1 < argc) {
      opt.device = argv[++i];
    } else if (a == "--bf16") {
      opt.bf16 = true;
    } else {
      std::cerr << "ferry-bench: unknown argument '" << a << "'\n";
      usage(std::cerr);
      return 2;
    }
  }
  if (name != "model" && name != "comm" && name != "adam" && name != "io" && name != "ckpt" && name != "step") {
    std::cerr << "ferry-bench: unknown benchmark '" << name << "'\n";
    usage(std::cerr);
    return 2;
  }
  try {
    Report report;
    bool is_root = true;
    int rc = 0;
    if (name == "model") {
      rc = run_model_bench(opt, report);
    } else if (name == "io") {
      rc = run_io_bench(IoBenchOptions{io_path, opt.quick}, report);
    } else if (name == "step") {
      rc = run_step_bench(StepBenchOptions{io_path, opt.quick, trace_path}, report);
    } else if (name == "ckpt") {
      rc = run_ckpt_bench(CkptBenchOptions{io_path, opt.quick}, report);
    } else if (name == "adam") {
      rc = run_adam_bench(AdamBenchOptions{opt.threads, 100'000'000, opt.quick}, report);
    } else {
      rc = run_comm_bench(CommBenchOptions{opt.quick}, report, is_root);
    }
    if (!is_root) return rc;
    print_table(report);
    if (!json_path.empty()) {
      write_json(report, json_path);
      std::cout << "wrote " << json_path << "\n";
    }
    return rc;
  } catch (const std::exception& e) {
    std::cerr << "ferry-bench: error: " << e.what() << "\n";
    return 1;
  }
}
