// ferry: tools around training runs.
//   ferry export --checkpoint DIR --out model.safetensors [--dtype fp32|bf16]
//       consolidated weights from a sharded checkpoint (a step directory, or a
//       checkpoint.dir whose `latest` is taken), with GPT-2 tensor names, streamed unit by
//       unit (runtime/ckpt/export.h)
//   ferry plan --config FILE --ranks N [--deepspeed DS.json] [--set key=value ...]
//              [--device-memory X] [--host-memory Y] [--nvme-bandwidth BYTES_PER_S] [--bench DIR] [--json FILE]
//       bytes per rank in every tier for every stage and offload choice, whether they fit,
//       and a step-time estimate (runtime/tools/plan.h); --bench reads ferry-bench's JSON results
//   ferry doctor [--config FILE [--deepspeed DS.json] [--set key=value ...]] [--ranks N] [--ranks-per-node R]
//       checks MPI, io_uring, the nvme folders, RLIMIT_MEMLOCK, host memory, CUDA and NCCL
//       against what the configuration needs (runtime/tools/doctor.h); exit 1 if a run would stop
//   ferry plot METRICS.jsonl -o run.png [--title TEXT] [--script FILE.gp]
//       loss and throughput curves of a metrics file, drawn by gnuplot (runtime/tools/plot.h);
//       --script also keeps the gnuplot program (with its data) in FILE.gp
// Exit status: 0 done; 1 the input was refused or the output could not be written;
// 2 the command line is wrong.
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "nn/device.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/export.h"
#include "runtime/tools/doctor.h"
#include "runtime/tools/plan.h"
#include "runtime/tools/plot.h"

namespace {

void usage(std::ostream& os) {
  os << "usage: ferry export --checkpoint DIR --out FILE.safetensors [--dtype fp32|bf16]\n"
        "       ferry plan --config FILE --ranks N [--deepspeed DS.json] [--set key=value ...]\n"
        "                  [--device-memory X] [--host-memory Y] [--nvme-bandwidth BYTES_PER_S] [--bench DIR] [--json FILE]\n"
        "       ferry doctor [--config FILE [--deepspeed DS.json] [--set key=value ...]] [--ranks N] [--ranks-per-node R]\n"
        "       ferry plot METRICS.jsonl -o run.png [--title TEXT] [--script FILE.gp]\n";
}

// The options that name a run's configuration, shared by plan and doctor.
struct RunOptions {
  std::string config, deepspeed;
  std::vector<std::string> sets;
  int ranks = 1;
};

// Reads "--option value" pairs from argv[2..]: the run's own into `run`, the others through
// `extra` (which returns false for an option it does not know). Throws ConfigError.
void parse_options(int argc, char** argv, RunOptions& run,
                   const std::function<bool(const std::string&, const std::string&)>& extra) {
  using ferry::runtime::ConfigError;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) throw ConfigError("option '" + arg + "' needs a value (or is unknown)");
    const std::string v = argv[++i];
    if (arg == "--config") run.config = v;
    else if (arg == "--deepspeed") run.deepspeed = v;
    else if (arg == "--set") run.sets.push_back(v);
    else if (arg == "--ranks") run.ranks = std::stoi(v);
    else if (!extra(arg, v)) throw ConfigError("unknown option '" + arg + "'");
  }
}

int doctor_command(int argc, char** argv) {
  using namespace ferry::runtime;
  if (argc == 3 && std::string(argv[2]) == "--mpi-probe") return mpi_probe_main();
  RunOptions run;
  int per_node = 0;
  try {
    parse_options(argc, argv, run, [&](const std::string& arg, const std::string& v) {
      if (arg != "--ranks-per-node") return false;
      per_node = std::stoi(v);
      return true;
    });
    if (run.ranks < 1 || per_node < 0) throw ConfigError("--ranks and --ranks-per-node must be positive");
  } catch (const std::exception& e) {
    std::cerr << "ferry doctor: " << e.what() << "\n";
    usage(std::cerr);
    return 2;
  }
  Config c;
  DoctorOptions o;
  try {
    if (!run.config.empty()) {
      c = load_config(run.config, run.sets, run.ranks, run.deepspeed);
      o.config = &c;
    }
  } catch (const ConfigError& e) {
    std::cerr << "ferry doctor: config error: " << e.what() << "\n";
    return 2;
  }
  o.ranks_per_node = per_node > 0 ? per_node : run.ranks;
  o.self = std::filesystem::canonical("/proc/self/exe").string();
  const std::vector<DoctorCheck> checks = run_doctor(o);
  std::cout << format_checks(checks);
  for (const DoctorCheck& k : checks)
    if (k.status == DoctorCheck::fail) return 1;
  return 0;
}

int plan_command(int argc, char** argv) {
  using namespace ferry::runtime;
  RunOptions run;
  std::string bench, json_out;
  size_t device_memory = 0, host_memory = 0;
  double nvme_bw = 0;
  try {
    parse_options(argc, argv, run, [&](const std::string& arg, const std::string& v) {
      if (arg == "--device-memory") device_memory = parse_bytes(v, "--device-memory");
      else if (arg == "--host-memory") host_memory = parse_bytes(v, "--host-memory");
      else if (arg == "--nvme-bandwidth") nvme_bw = static_cast<double>(parse_bytes(v, "--nvme-bandwidth"));
      else if (arg == "--bench") bench = v;
      else if (arg == "--json") json_out = v;
      else return false;
      return true;
    });
    if (run.config.empty() || run.ranks < 1) throw ConfigError("--config FILE and --ranks N (>= 1) are required");
  } catch (const std::exception& e) {
    std::cerr << "ferry plan: " << e.what() << "\n";
    usage(std::cerr);
    return 2;
  }
  try {
    const Config base = load_config(run.config, run.sets, run.ranks, run.deepspeed);
    const int ranks = run.ranks;
    Rates rates = bench.empty() ? Rates{} : rates_from_bench(bench);
    if (nvme_bw > 0) {
      rates.nvme_bytes_per_s = nvme_bw;
      rates.sources.push_back("nvme bandwidth from --nvme-bandwidth");
    }
    const std::vector<PlanRow> rows = plan_all(base, ranks, rates, device_memory, host_memory);
    std::cout << format_plan(base, ranks, rates, rows, device_memory, host_memory);
    const MemoryPlan chosen = plan_memory(base, ranks);
    std::cout << "\nthis configuration (stage " << base.zero.stage << ", optimizer " << base.offload.optimizer_device
              << ", params " << (base.zero.stage == 3 ? base.offload.param_device : "none")
              << "): device peak " << ferry::nn::format_bytes(chosen.device_peak) << ", host "
              << ferry::nn::format_bytes(chosen.host_states + chosen.host_pinned) << ", nvme "
              << ferry::nn::format_bytes(chosen.nvme) << " per rank\n";
    if (!json_out.empty()) std::ofstream(json_out) << plan_json(rows).dump(1) << "\n";
  } catch (const ConfigError& e) {
    std::cerr << "ferry plan: config error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ferry plan: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

int plot_command(int argc, char** argv) {
  std::string metrics, png, title, script_path;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 < argc && (arg == "-o" || arg == "--out" || arg == "--title" || arg == "--script")) {
      (arg == "--title" ? title : arg == "--script" ? script_path : png) = argv[++i];
    } else if (metrics.empty() && !arg.starts_with("-")) {
      metrics = arg;
    } else {
      std::cerr << "ferry plot: unknown argument '" << arg << "'\n";
      usage(std::cerr);
      return 2;
    }
  }
  if (metrics.empty() || png.empty()) {
    usage(std::cerr);
    return 2;
  }
  try {
    const ferry::runtime::MetricsSeries m = ferry::runtime::read_metrics(metrics);
    const std::string script = ferry::runtime::gnuplot_script(m, png, title.empty() ? metrics : title);
    if (!script_path.empty()) {
      std::ofstream(script_path) << script;
    }
    ferry::runtime::run_gnuplot(script, png);
    std::cout << "plotted " << m.step.size() << " steps and " << m.eval_step.size() << " evaluations of " << metrics
              << " -> " << png << "\n";
  } catch (const std::exception& e) {
    std::cerr << "ferry plot: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

int export_command(int argc, char** argv) {
  std::string checkpoint, out, dtype = "fp32";
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 < argc && (arg == "--checkpoint" || arg == "--out" || arg == "--dtype")) {
      (arg == "--checkpoint" ? checkpoint : arg == "--out" ? out : dtype) = argv[++i];
    } else {
      std::cerr << "ferry export: unknown argument '" << arg << "'\n";
      usage(std::cerr);
      return 2;
    }
  }
  if (checkpoint.empty() || out.empty() || (dtype != "fp32" && dtype != "bf16")) {
    usage(std::cerr);
    return 2;
  }
  try {
    const ferry::runtime::ExportReport r = ferry::runtime::export_safetensors(checkpoint, out, dtype);
    std::cout << "exported " << r.checkpoint << " (step " << r.step << "): " << r.tensors << " tensors, "
              << r.parameters << " parameters, " << dtype << ", " << ferry::nn::format_bytes(r.bytes) << " -> " << out
              << " (largest unit buffered: " << ferry::nn::format_bytes(r.largest_unit_bytes) << ")\n";
  } catch (const ferry::runtime::CheckpointError& e) {
    std::cerr << "ferry export: checkpoint refused: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ferry export: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "export") return export_command(argc, argv);
  if (cmd == "plot") return plot_command(argc, argv);
  if (cmd == "plan") return plan_command(argc, argv);
  if (cmd == "doctor") return doctor_command(argc, argv);
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(std::cout);
    return 0;
  }
  std::cerr << (cmd.empty() ? std::string("ferry: no command") : "ferry: unknown command '" + cmd + "'") << "\n";
  usage(std::cerr);
  return 2;
}
