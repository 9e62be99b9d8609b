// ferry export --checkpoint DIR --hf OUTDIR [--dtype fp32|bf16|fp16] [--max-shard-size 5GB]
// ferry export --checkpoint DIR --out model.safetensors [--dtype fp32|bf16]
// ferry export --checkpoint DIR --peft OUTDIR [--dtype ...]         (a LoRA run's adapters)
// ferry export --checkpoint DIR --hf OUTDIR --merge [--base DIR]    (a LoRA run, merged)
// A sharded checkpoint (a step directory, or a checkpoint.dir whose `latest` is taken),
// streamed unit by unit, as a Hugging Face model folder that transformers loads
// (runtime/hf/hf_export.h), or as one safetensors file with ferry's tensor names
// (runtime/ckpt/export.h). Exit status: 0 written; 1 the checkpoint was refused or the
// output could not be written; 2 the command line is wrong.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "examples/commands.h"
#include "nn/device.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/ckpt/export.h"
#include "runtime/config/config.h"
#include "runtime/hf/hf_export.h"
#include "runtime/hf/peft.h"

namespace ferry::cli {

namespace {

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

struct ExportArgs {
  std::string checkpoint, out, hf, peft, base, dtype = "fp32", max_shard = "5GB";
  bool merge = false;
};

int export_weights(const ExportArgs& a) {
  if (!a.peft.empty()) {
    const runtime::PeftExportReport r = runtime::export_peft(a.checkpoint, a.peft, a.dtype);
    std::cout << "exported " << r.checkpoint << " (step " << r.step << ") as a PEFT LoRA adapter: " << r.tensors
              << " tensors, " << r.parameters << " parameters, " << a.dtype << " -> " << a.peft
              << " (adapter_config.json, adapter_model.safetensors)\n";
    return 0;
  }
  if (!a.hf.empty()) {
    uint64_t limit = 0;
    try {
      limit = runtime::parse_bytes(nlohmann::json(a.max_shard), "--max-shard-size");
    } catch (const runtime::ConfigError& e) {
      throw UsageError(e.what());  // an option of the command line, as plan's byte sizes
    }
    const runtime::HfExportReport r = runtime::export_hf(a.checkpoint, a.hf, a.dtype, limit, a.merge, a.base);
    std::cout << "exported " << r.checkpoint << " (step " << r.step << ") as " << r.architecture << ": " << r.tensors
              << " tensors, " << r.parameters << " parameters, " << a.dtype << ", " << nn::format_bytes(r.bytes)
              << " in " << r.files << " safetensors file" << (r.files == 1 ? "" : "s") << ", "
              << (r.carried.empty() ? std::string("no tokenizer/generation files (the run did not start from a "
                                                  "Hugging Face folder)")
                                    : "carried from the source folder: " + join(r.carried))
              << " -> " << a.hf << " (largest unit buffered: " << nn::format_bytes(r.largest_unit_bytes) << ")\n";
    return 0;
  }
  if (a.dtype == "fp16") throw std::runtime_error("--dtype fp16 is for --hf folders; --out takes fp32 or bf16");
  const runtime::ExportReport r = runtime::export_safetensors(a.checkpoint, a.out, a.dtype);
  std::cout << "exported " << r.checkpoint << " (step " << r.step << "): " << r.tensors << " tensors, " << r.parameters
            << " parameters, " << a.dtype << ", " << nn::format_bytes(r.bytes) << " -> " << a.out
            << " (largest unit buffered: " << nn::format_bytes(r.largest_unit_bytes) << ")\n";
  return 0;
}

}  // namespace

Run export_command(CLI::App& cmd) {
  auto a = std::make_shared<ExportArgs>();
  cmd.description("write a checkpoint as a Hugging Face model folder (--hf), a PEFT adapter (--peft) or one "
                  "safetensors file (--out)");
  cmd.add_option("--checkpoint", a->checkpoint, "a step directory, or a checkpoint.dir (its `latest` is taken)")
      ->required();
  auto* hf = cmd.add_option("--hf", a->hf, "the folder to write: config.json, *.safetensors (+ index), tokenizer files");
  auto* out = cmd.add_option("--out", a->out, "one .safetensors file with ferry's tensor names");
  auto* peft = cmd.add_option("--peft", a->peft, "a LoRA run's adapters as a PEFT folder: adapter_config.json, "
                                                 "adapter_model.safetensors (peft's PeftModel.from_pretrained loads it)");
  auto* merge = cmd.add_flag("--merge", a->merge, "--hf of a LoRA run: the base with the adapters merged in (W + scale B A)");
  auto* base = cmd.add_option("--base", a->base, "--merge: the base model folder, when it moved since the run (default: "
                                                 "the run's model.init_from)");
  hf->excludes(out);
  peft->excludes(hf);
  peft->excludes(out);
  merge->needs(hf);
  base->needs(merge);
  cmd.add_option("--dtype", a->dtype, "fp32 | bf16 | fp16 (default fp32; fp16 with --hf only)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd.add_option("--max-shard-size", a->max_shard, "--hf: the largest safetensors file (default 5GB)");
  cmd.callback([hf, out, peft] {
    if (hf->count() == 0 && out->count() == 0 && peft->count() == 0) throw CLI::RequiredError("--hf, --peft or --out");
  });
  return [a] { return export_weights(*a); };
}

}  // namespace ferry::cli
