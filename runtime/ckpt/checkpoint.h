// Checkpoints: sharded, atomic, loadable at any world size.
//
// Layout of one checkpoint, DIR/step-00000100/:
//   rank-00003.bin   saving rank 3's slice of every unit's fp32 master weights, Adam m and v
//   rank-00003.json  its index: per (unit, array) the element range, byte offset, CRC-32C
//   hf/              the source model folder's config and tokenizer files (model.init_from)
//   manifest.json    written by rank 0 after every rank's files are synced: format version,
//                    ferry version, step, world size, stage, model shape, unit layout, and
//                    the trainer's state (data position, scheduler, seeds)
// DIR/latest holds the name of the newest complete checkpoint.
//
// Canonical slices: whatever the stage, saving rank r of N writes elements
// [r * shard, r * shard + owned_real) of each unit (runtime/zero/partition.h), so a file's
// contents depend only on (unit, N, r). A loading rank of any world size M reads the parts
// of those slices that overlap the range its stage gives it: re-sharding is a range copy.
//
// Atomicity: ranks write under DIR/.tmp-step-N, fsync their files, and agree (collective);
// only then rank 0 writes the manifest, renames the directory to step-N, fsyncs DIR, and
// replaces `latest` by rename. A crash at any moment leaves the previous `latest` whole.
//
// Memory: state is streamed in chunks (nvme state through one pinned buffer); loading
// holds one unit's owned range of one array at a time.
// Errors: CheckpointError naming the file and what is wrong (missing, truncated, bad
// checksum, other model shape, unknown version). Threads: the training thread; save and
// load are collective (every rank calls them in the same order).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "nn/unit.h"
#include "runtime/ckpt/stream_io.h"
#include "runtime/zero/optimizer_state.h"
#include "runtime/zero/sharded_units.h"

namespace ferry::runtime {

class CheckpointError : public std::runtime_error {
 public:
  // reported_elsewhere: another rank found the problem and printed it; this rank only
  // stops with the others.
  explicit CheckpointError(const std::string& what, bool reported_elsewhere = false)
      : std::runtime_error(what), reported_elsewhere(reported_elsewhere) {}
  bool reported_elsewhere;
};

// Format 2 adds frozen tensors (adapters' checkpoints: "trainable_numel" per unit, the slices
// tiling that span); a checkpoint without frozen tensors is still written as format 1, which
// older ferry reads. The reader takes 1 and 2.
constexpr int kCheckpointFormat = 2;
extern const char* const kArrayNames[3];  // "master", "m", "v"

std::string checkpoint_name(int64_t step);        // "step-00000100"
std::string rank_file(int rank, const char* ext);  // "rank-00003.bin"

// Where to resume from: "none" -> ""; "auto" -> DIR/<latest>, or "" when DIR has no
// `latest` yet; anything else is a checkpoint directory. Throws CheckpointError when
// `latest` names a directory that is not there.
std::string resolve_resume(const std::string& spec, const std::string& dir);

// The step directories under dir, oldest first.
std::vector<std::string> list_checkpoints(const std::string& dir);

// Reads one checkpoint directory. The constructor checks the manifest (format, version),
// that every saving rank's index and data file are there, and that each data file has
// the size its index says; read() verifies the checksum of every segment it touches.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& step_dir);

  const nlohmann::json& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  int64_t step() const { return manifest_.at("step").get<int64_t>(); }
  int world_size() const { return world_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const std::string& unit_name(int unit) const { return units_.at(static_cast<size_t>(unit)).name; }
  int64_t unit_numel(int unit) const { return units_.at(static_cast<size_t>(unit)).numel; }
  // The unit layout as saved: tensor names, shapes and offsets.
  std::vector<nn::UnitSpec> layout() const;
  // Throws CheckpointError naming what differs when `layout` (the model being loaded
  // into) is not the saved one.
  void check_layout(const std::vector<nn::UnitSpec>& layout) const;

  // Copies [begin, begin + n) of `array` (0 master, 1 m, 2 v) of `unit` in unit
  // coordinates (within the unit's numel) into dst. Every segment it touches is read
  // whole (streamed, O_DIRECT where allowed) to verify its checksum.
  void read(int unit, int array, int64_t begin, int64_t n, float* dst);

  // Optional: the read() calls to come, in order. Each saving rank's file is then streamed
  // once, read ahead across segment boundaries, instead of one stream per segment.
  struct Read {
    int unit, array;
    int64_t begin, n;
  };
  void plan(const std::vector<Read>& reads);

 private:
  struct Segment {
    int64_t begin = 0, count = 0;
    uint64_t offset = 0;
    uint32_t crc = 0;
  };
  struct UnitInfo {
    std::string name;
    int64_t numel = 0;
    std::vector<std::vector<Segment>> segments;  // [array][saving rank]
  };
  std::string dir_;
  nlohmann::json manifest_;
  int world_ = 0;
  std::vector<UnitInfo> units_;
  // Per saving rank: the planned stream and the (unit, array) segments it will deliver.
  std::vector<std::unique_ptr<StreamReader>> streams_;
  std::vector<std::deque<std::pair<int, int>>> planned_;
};

struct SaveRequest {
  std::string dir;
  int64_t step = 0;     // optimizer steps completed
  int keep_last = 0;    // 0: keep every checkpoint
  nlohmann::json meta;  // the trainer's state, stored in the manifest under "trainer"
  nlohmann::json model; // the model's shape, stored under "model"
  // Adapters (lora.r > 0): {"scale", "adapters": runtime/hf/peft.h's adapters_json, "base":
  // the model.init_from folder}, stored under "lora"; null: a full fine-tune.
  nlohmann::json lora;
  int stage = 0;
  // Files rank 0 copies into the checkpoint's hf/ folder (those that exist): a Hugging Face
  // model's config and tokenizer files, which `ferry export --hf` carries along. Each keeps
  // its path relative to carry_root (its file name alone when carry_root is empty).
  std::vector<std::string> carry_files;
  std::string carry_root;
  // Hybrid sharding: the ranks of one shard group (0 = every rank). Groups hold the same
  // state, so the first group (ranks 0 .. shard_world - 1) writes a checkpoint of
  // shard_world ranks and the others write nothing; any world size loads it.
  int shard_world = 0;
};

// Collective. Returns the checkpoint's directory. A rank that fails (disk full, I/O
// error) makes every rank throw, after the others finished their part; `latest` then
// still names the previous checkpoint. Test-only fault: FERRY_FAULT_KILL_IN_CHECKPOINT=
// RANK:STEP makes that rank SIGKILL itself after writing its data file, before its index.
std::string save_checkpoint(const SaveRequest& request, const std::vector<nn::UnitSpec>& layout, ShardedUnits& units,
                            OptimizerState& optimizer, comm::Communicator& comm);

// Collective. Loads master weights, m and v for this rank's owned ranges (any saved world
// size), sets the compute weights and publishes them. Returns the manifest. `model` (the
// shape keys) must equal the saved one. Every rank throws CheckpointError if any rank
// refuses the checkpoint; the lowest such rank carries the message, the others have
// reported_elsewhere set.
nlohmann::json load_checkpoint(const std::string& step_dir, const nlohmann::json& model,
                               const std::vector<nn::UnitSpec>& layout, ShardedUnits& units,
                               OptimizerState& optimizer, comm::Communicator& comm);

}  // namespace ferry::runtime
