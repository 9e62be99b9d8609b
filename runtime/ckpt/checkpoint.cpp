#include "runtime/ckpt/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "base/crc32c.h"
#include "base/env.h"
#include "base/log.h"
#include "base/posix_file.h"
#include "base/version.h"
#include "runtime/ckpt/stream_io.h"
#include "runtime/zero/partition.h"

namespace ferry::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Every rank learns whether all succeeded: the number of ranks that failed.
int failures_everywhere(comm::Communicator& comm, bool failed) {
  std::vector<double> v{failed ? 1.0 : 0.0};
  comm.all_reduce_sum(v);
  return static_cast<int>(v[0]);
}

bool fault_kill_here(int rank, int64_t step) {
  const char* f = env_value("FERRY_FAULT_KILL_IN_CHECKPOINT");
  int r = -1;
  long long s = -1;
  return f && std::sscanf(f, "%d:%lld", &r, &s) == 2 && r == rank && s == step;
}

json layout_json(const std::vector<nn::UnitSpec>& layout) {
  json units = json::array();
  for (const nn::UnitSpec& u : layout) {
    json tensors = json::array();
    for (const nn::TensorSpec& t : u.tensors) {
      json j = {{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}, {"decay", t.decay}};
      if (!t.trainable) j["trainable"] = false;  // frozen: not in the checkpoint (the base folder has it)
      if (t.quantized()) {  // NF4 (lora.base_dtype): its pieces' rows, which give its extent in the unit
        json pieces = json::array();
        for (const nn::Nf4Piece& p : t.nf4) pieces.push_back({p.row0, p.layout.rows});
        j["nf4"] = {{"pieces", pieces}, {"double_quant", t.nf4.front().layout.double_quant}};
      }
      tensors.push_back(std::move(j));
    }
    json unit = {{"name", u.name}, {"numel", u.numel}, {"tensors", tensors}};
    // The slices tile the trainable span only (nn/unit.h); absent: the whole unit (format 1).
    if (!u.all_trainable()) unit["trainable_numel"] = u.trainable_numel;
    units.push_back(std::move(unit));
  }
  return units;
}

// This rank's files: its canonical slice of each unit's master, m and v, streamed from
// wherever the optimizer keeps them.
void write_rank_files(const std::string& tmp, const std::vector<nn::UnitSpec>& layout, ShardedUnits& units,
                      OptimizerState& opt, int rank, int world, int64_t step) {
  StreamWriter data((fs::path(tmp) / rank_file(rank, "bin")).string());
  std::vector<float> chunk(2u << 20);  // 8 MiB
  json segments = json::array();
  uint64_t offset = 0;
  for (int u = 0; u < static_cast<int>(layout.size()); ++u) {
    // The trainable span only: a frozen base is the imported folder's, never saved.
    const Partition p = unit_partition(layout[static_cast<size_t>(u)], world, rank).trained;
    const ShardedUnits::Owned o = units.owned(u);
    const int64_t count = p.owned_real(), first = p.begin() - o.begin;  // in owned coordinates
    for (int a = 0; a < 3; ++a) {
      uint32_t crc = 0;
      const uint64_t start = offset;
      for (int64_t k = 0; k < count; k += static_cast<int64_t>(chunk.size())) {
        const int64_t n = std::min<int64_t>(static_cast<int64_t>(chunk.size()), count - k);
        opt.read_state(u, static_cast<OptimizerState::Array>(a), first + k, n, chunk.data());
        const size_t bytes = static_cast<size_t>(n) * 4;
        crc = crc32c(chunk.data(), bytes, crc);
        data.append(chunk.data(), bytes);
        offset += bytes;
      }
      segments.push_back({{"unit", u}, {"array", a}, {"begin", count > 0 ? p.begin() : 0}, {"count", count},
                          {"offset", start}, {"crc32c", crc}});
    }
  }
  data.finish();  // synced
  if (fault_kill_here(rank, step)) {
    log::warn(log::Subsys::ckpt, "FERRY_FAULT_KILL_IN_CHECKPOINT: killing myself while writing step " + std::to_string(step));
    ::raise(SIGKILL);
  }
  const json index = {{"rank", rank}, {"world_size", world}, {"bytes", offset}, {"segments", segments}};
  File idx((fs::path(tmp) / rank_file(rank, "json")).string(), File::create);
  const std::string text = index.dump(1);
  idx.write_at(0, text.data(), text.size());
  idx.sync();
  idx.close();
}

}  // namespace

std::string save_checkpoint(const SaveRequest& req, const std::vector<nn::UnitSpec>& layout, ShardedUnits& units,
                            OptimizerState& opt, comm::Communicator& comm) {
  const int rank = comm.rank(), world = req.shard_world > 0 ? req.shard_world : comm.size();
  const bool writes = rank < world;  // hybrid sharding: the other groups hold copies
  const std::string name = checkpoint_name(req.step);
  const std::string tmp = (fs::path(req.dir) / (".tmp-" + name)).string();
  const std::string final_dir = (fs::path(req.dir) / name).string();
  std::string error;
  if (rank == 0) {
    try {
      fs::create_directories(req.dir);
      for (const auto& e : fs::directory_iterator(req.dir))  // leftovers of saves that crashed
        if (e.path().filename().string().starts_with(".tmp-")) fs::remove_all(e.path());
      fs::create_directories(tmp);
    } catch (const std::exception& e) {
      error = std::string("cannot prepare ") + tmp + ": " + e.what();
    }
  }
  if (failures_everywhere(comm, !error.empty()) > 0) {
    throw std::runtime_error(rank == 0 ? "checkpoint: " + error : "checkpoint: rank 0 could not prepare " + tmp);
  }
  try {
    if (writes) write_rank_files(tmp, layout, units, opt, rank, world, req.step);
  } catch (const std::exception& e) {
    error = e.what();
    // Said here, by the rank that knows which file: the job may end on another rank's
    // message, which can only count the failures.
    log::error(log::Subsys::ckpt, "rank " + std::to_string(rank) + ": checkpoint at step " + std::to_string(req.step) +
                                      ": " + error);
  }
  if (const int failed = failures_everywhere(comm, !error.empty()); failed > 0) {
    throw std::runtime_error("checkpoint at step " + std::to_string(req.step) + " failed on " + std::to_string(failed) +
                             " rank(s)" + (error.empty() ? "" : " (here: " + error + ")") +
                             "; the previous checkpoint is still " + (fs::path(req.dir) / "latest").string());
  }
  if (rank == 0) {
    try {
      json manifest = {{"format", "ferry-checkpoint"},
                             {"format_version", std::all_of(layout.begin(), layout.end(),
                                                            [](const nn::UnitSpec& u) { return u.all_trainable(); })
                                                    ? 1
                                                    : kCheckpointFormat},
                             {"ferry_version", kVersion},
                             {"step", req.step},
                             {"world_size", world},
                             {"zero_stage", req.stage},
                             {"model", req.model},
                             {"trainer", req.meta},
                             {"units", layout_json(layout)}};
      if (!req.lora.is_null()) manifest["lora"] = req.lora;
      for (const std::string& f : req.carry_files) {
        if (!fs::exists(f)) continue;
        const fs::path to = fs::path(tmp) / "hf" /
                            (req.carry_root.empty() ? fs::path(f).filename() : fs::path(f).lexically_relative(req.carry_root));
        fs::create_directories(to.parent_path());
        copy_file_atomic(f, to.string());
      }
      write_file_atomic((fs::path(tmp) / "manifest.json").string(), manifest.dump(1));
      if (fs::exists(final_dir)) {
        // The same step saved before (a resume from an older one), perhaps the one `latest`
        // names: swap the two in one step, so that name never points at nothing. Where the
        // file system cannot swap, the old one goes aside first (a crash between the two
        // renames leaves `latest` naming a missing step; resolve_resume then says so).
        const std::string aside = (fs::path(req.dir) / (".tmp-old-" + name)).string();
        if (exchange_paths(tmp, final_dir)) {
          fs::remove_all(tmp);
        } else {
          rename_path(final_dir, aside);
          rename_path(tmp, final_dir);
          fs::remove_all(aside);
        }
      } else {
        rename_path(tmp, final_dir);
      }
      fsync_dir(req.dir);
      write_file_atomic((fs::path(req.dir) / "latest").string(), name + "\n");
      if (req.keep_last > 0) {
        std::vector<std::string> all = list_checkpoints(req.dir);
        for (size_t i = 0; i + static_cast<size_t>(req.keep_last) < all.size(); ++i)
          if (all[i] != name) fs::remove_all(fs::path(req.dir) / all[i]);
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (failures_everywhere(comm, !error.empty()) > 0) {
    throw std::runtime_error("checkpoint at step " + std::to_string(req.step) + " could not be completed" +
                             (error.empty() ? " (rank 0 failed)" : ": " + error));
  }
  log::info(log::Subsys::ckpt, "checkpoint of step " + std::to_string(req.step) + " written: " + final_dir);
  return final_dir;
}

json load_checkpoint(const std::string& step_dir, const json& model, const std::vector<nn::UnitSpec>& layout,
                     ShardedUnits& units, OptimizerState& opt, comm::Communicator& comm) {
  std::string error;
  json manifest;
  try {
    CheckpointReader reader(step_dir);
    const json& saved = reader.manifest().at("model");
    for (const auto& [key, value] : model.items()) {
      if (saved.contains(key) && saved.at(key) == value) continue;
      throw CheckpointError((fs::path(step_dir) / "manifest.json").string() + ": model." + key + " is " +
                            (saved.contains(key) ? saved.at(key).dump() : std::string("absent")) +
                            " in the checkpoint but " + value.dump() + " in the config (another model shape)");
    }
    reader.check_layout(layout);
    manifest = reader.manifest();
    std::vector<CheckpointReader::Read> reads;
    for (int u = 0; u < static_cast<int>(layout.size()); ++u) {
      const ShardedUnits::Owned o = units.owned(u);
      const int64_t trained = layout[static_cast<size_t>(u)].trainable_numel;
      const int64_t real = std::max<int64_t>(0, std::min(o.begin + o.length, trained) - o.begin);
      for (int a = 0; a < 3; ++a)
        if (real > 0) reads.push_back({u, a, o.begin, real});
    }
    reader.plan(reads);
    std::vector<float> buf;
    for (int u = 0; u < static_cast<int>(layout.size()); ++u) {
      const ShardedUnits::Owned o = units.owned(u);
      if (o.length == 0) continue;  // nothing trained in it: its weights are the base folder's
      const int64_t trained = layout[static_cast<size_t>(u)].trainable_numel;
      const int64_t real = std::max<int64_t>(0, std::min(o.begin + o.length, trained) - o.begin);
      buf.resize(static_cast<size_t>(o.length));
      std::fill(buf.begin() + real, buf.end(), 0.0f);  // padding stays zero; the rest is read
      for (int a = 0; a < 3; ++a) {
        if (real > 0) reader.read(u, a, o.begin, real, buf.data());
        opt.write_state(u, static_cast<OptimizerState::Array>(a), buf.data());
      }
    }
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  // Which ranks refused: the lowest one reports, the others stop quietly with it (most
  // problems, a missing manifest say, are seen by every rank).
  std::vector<double> refused(static_cast<size_t>(comm.size()), 0.0);
  refused[static_cast<size_t>(comm.rank())] = error.empty() ? 0.0 : 1.0;
  comm.all_reduce_sum(refused);
  for (int r = 0; r < comm.size(); ++r) {
    if (refused[static_cast<size_t>(r)] == 0) continue;
    if (r == comm.rank()) throw CheckpointError(error);
    throw CheckpointError("checkpoint " + step_dir + " refused (rank " + std::to_string(r) + " reports why)", true);
  }
  units.publish_params();
  return manifest;
}

}  // namespace ferry::runtime
