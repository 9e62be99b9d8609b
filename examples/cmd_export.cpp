// ferry export --checkpoint DIR --out model.safetensors [--dtype fp32|bf16]
// Consolidated weights from a sharded checkpoint (a step directory, or a checkpoint.dir
// whose `latest` is taken), with GPT-2 tensor names, streamed unit by unit
// (runtime/ckpt/export.h). Exit status: 0 written; 1 the checkpoint was refused or the
// output could not be written; 2 the command line is wrong.
#include <iostream>
#include <memory>
#include <string>

#include "examples/commands.h"
#include "nn/device.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/export.h"

namespace ferry::cli {

namespace {

struct ExportArgs {
  std::string checkpoint, out, dtype = "fp32";
};

int export_weights(const ExportArgs& a) {
  try {
    const runtime::ExportReport r = runtime::export_safetensors(a.checkpoint, a.out, a.dtype);
    std::cout << "exported " << r.checkpoint << " (step " << r.step << "): " << r.tensors << " tensors, "
              << r.parameters << " parameters, " << a.dtype << ", " << nn::format_bytes(r.bytes) << " -> " << a.out
              << " (largest unit buffered: " << nn::format_bytes(r.largest_unit_bytes) << ")\n";
  } catch (const runtime::CheckpointError& e) {
    std::cerr << "ferry export: checkpoint refused: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ferry export: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

Run export_command(CLI::App& cmd) {
  auto a = std::make_shared<ExportArgs>();
  cmd.description("write a checkpoint's consolidated weights as one safetensors file (GPT-2 tensor names)");
  cmd.add_option("--checkpoint", a->checkpoint, "a step directory, or a checkpoint.dir (its `latest` is taken)")
      ->required();
  cmd.add_option("--out", a->out, "the .safetensors file to write")->required();
  cmd.add_option("--dtype", a->dtype, "fp32 | bf16 (default fp32)")->check(CLI::IsMember({"fp32", "bf16"}));
  return [a] { return export_weights(*a); };
}

}  // namespace ferry::cli
