// ferry bench ckpt: one training step of a ~85M-parameter GPT (so m and v hold real
// values), then a timed save_checkpoint (write, CRC-32C, fdatasync, rename) and, after the
// checkpoint's pages are dropped from the page cache (posix_fadvise DONTNEED on the synced
// files), a timed load_checkpoint (read, verify, place). The reference is fio's sequential
// write and read (1 MiB blocks, depth 8, O_DIRECT, end_fsync) of the same byte count in
// the same folder.
#include "benchmarks/bench_ckpt.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <ostream>

#include "benchmarks/bench_io.h"
#include "comm/communicator.h"
#include "runtime/ckpt/checkpoint.h"
#include "runtime/train/trainer.h"

namespace ferry::bench {

namespace fs = std::filesystem;

namespace {

uint64_t drop_cached(const std::string& dir) {
  uint64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    bytes += e.path().extension() == ".bin" ? fs::file_size(e.path()) : 0;
  }
  return bytes;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int run_ckpt_bench(const CkptBenchOptions& opt, Report& report) {
  if (opt.path.empty()) throw std::runtime_error("ferry bench ckpt needs --path DIR (a folder on the disk to measure)");
  const std::string dir = (fs::path(opt.path) / "ferry-bench-ckpt").string();
  fs::remove_all(dir);
  nlohmann::json doc = {
      {"model", {{"n_layer", opt.quick ? 2 : 12}, {"n_head", opt.quick ? 2 : 12}, {"n_embd", opt.quick ? 64 : 768}, {"block_size", 128}}},
      {"data", {{"path", std::string(FERRY_SOURCE_DIR) + "/examples/data/kjv.txt"}}},
      {"device", {{"memory", "8GiB"}}},
      {"train_micro_batch_size_per_gpu", 1},
      {"train", {{"steps", 1}, {"eval_every", 0}, {"eval_batches", 1}, {"sample_tokens", 0}}},
      {"checkpoint", {{"dir", dir}, {"keep_last", 1}}}};
  const runtime::Config cfg = runtime::config_from_json(doc, "ferry bench ckpt", "", {});
  comm::SingleProcessCommunicator alone;
  std::ostream discard(nullptr);
  runtime::Trainer trainer(cfg, alone, discard);
  const runtime::StepStats s = trainer.train_step(0);

  auto t0 = std::chrono::steady_clock::now();
  const std::string saved = trainer.save_checkpoint(1, s.lr);
  const double write_s = seconds_since(t0);
  const uint64_t bytes = drop_cached(saved);
  t0 = std::chrono::steady_clock::now();
  trainer.load_checkpoint(saved);
  const double read_s = seconds_since(t0);

  const std::string fio_file = (fs::path(opt.path) / "ferry-bench-ckpt.fio").string();
  const double fio_write = fio_bandwidth(fio_file, true, 1u << 20, 8, bytes);
  const double fio_read = fio_bandwidth(fio_file, false, 1u << 20, 8, bytes);
  fs::remove(fio_file);
  fs::remove_all(dir);

  const double w = static_cast<double>(bytes) / write_s, r = static_cast<double>(bytes) / read_s;
  report.bench = "ckpt";
  report.threads = 1;  // checkpoint I/O runs on the training thread
  report.columns = {"op", "bytes", "ferry GB/s", "fio GB/s", "ratio"};
  for (const auto& [op, mine, ref] : {std::tuple{"write", w, fio_write}, std::tuple{"read", r, fio_read}}) {
    report.table.push_back({op, std::to_string(bytes), fixed(mine / 1e9, 3), fixed(ref / 1e9, 3), fixed(mine / ref, 3)});
    report.rows.push_back({{"op", op},
                           {"bytes", bytes},
                           {"parameters", trainer.model().num_parameters()},
                           {"ferry_bytes_per_s", mine},
                           {"fio_bytes_per_s", ref},
                           {"ratio", mine / ref}});
  }
  // The headline is the weaker direction.
  const bool write_worse = w / fio_write <= r / fio_read;
  report.headline = {write_worse ? "ckpt_write_bytes_per_s" : "ckpt_read_bytes_per_s", write_worse ? w : r,
                     write_worse ? "fio_write_bytes_per_s" : "fio_read_bytes_per_s", write_worse ? fio_write : fio_read,
                     0.8};
  return 0;
}

}  // namespace ferry::bench
