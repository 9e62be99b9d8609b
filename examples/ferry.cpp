// ferry: tools around training runs.
//   ferry export --checkpoint DIR --out model.safetensors [--dtype fp32|bf16]
//       consolidated weights from a sharded checkpoint (a step directory, or a
//       checkpoint.dir whose `latest` is taken), with GPT-2 tensor names, streamed unit by
//       unit (runtime/export.h)
// Exit status: 0 done; 1 the checkpoint was refused or the output could not be written;
// 2 the command line is wrong.
#include <iostream>
#include <string>

#include "nn/device.h"
#include "runtime/checkpoint.h"
#include "runtime/export.h"

namespace {

void usage(std::ostream& os) {
  os << "usage: ferry export --checkpoint DIR --out FILE.safetensors [--dtype fp32|bf16]\n";
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
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(std::cout);
    return 0;
  }
  std::cerr << (cmd.empty() ? std::string("ferry: no command") : "ferry: unknown command '" + cmd + "'") << "\n";
  usage(std::cerr);
  return 2;
}
