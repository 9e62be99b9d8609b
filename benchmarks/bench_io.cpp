// ferry bench io --path DIR: sequential write then read GB/s of ferry's store (io_uring,
// O_DIRECT) for block sizes 128 KiB to 8 MiB and queue depths 1 to 64, and in the same run
// fio (ioengine=io_uring, direct=1) on the same file with the same block size and depth;
// with --peers PY also DeepSpeed's aio_handle (libaio, O_DIRECT: ZeRO-Infinity's engine,
// benchmarks/peers/io_peer.py, one process for the whole run). Each case moves the whole
// file (1 GiB) in one call, so the queue stays full; writes end with fdatasync on every
// side (fio --end_fsync=1). The file is written once before the first case. Within a case
// the sides alternate, repetition by repetition (3; --quick 1), each repetition starting
// with another side, and each figure is the median with min and max; the ratios are
// ferry's median over each peer's. Each side moves data through the memory it uses for I/O
// in its own runs: ferry through a buffer of its pinned pool (2 MiB aligned, huge pages
// advised, mlocked, registered with io_uring as fixed buffers: what its swapper reads into),
// DeepSpeed through its page-locked tensor (new_cpu_locked_tensor), fio through its own
// (its defaults: malloc'd, neither locked nor registered; fio's users get those too).
#include "benchmarks/bench_io.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "benchmarks/peer_process.h"
#include "offload/pinned_pool.h"
#include "offload/storage.h"
#include "runtime/tools/launch.h"

namespace ferry::bench {

namespace {

std::string run_command(const std::string& cmd) {
  std::array<char, 4096> buf{};
  std::string out;
  std::unique_ptr<FILE, decltype(&pclose)> pipe(popen(cmd.c_str(), "r"), &pclose);
  if (!pipe) throw std::runtime_error("cannot run: " + cmd);
  while (fgets(buf.data(), buf.size(), pipe.get())) out += buf.data();
  return out;
}

}  // namespace

double fio_bandwidth(const std::string& file, bool write, size_t bs, int qd, uint64_t size) {
  const std::string cmd = "fio --name=ferry --filename=" + runtime::shell_quote(file) + " --rw=" + (write ? "write" : "read") +
                          " --bs=" + std::to_string(bs) + " --iodepth=" + std::to_string(qd) +
                          " --ioengine=io_uring --direct=1 --end_fsync=1 --size=" + std::to_string(size) +
                          " --output-format=json 2>/dev/null";
  const std::string out = run_command(cmd);
  const auto start = out.find('{');
  if (start == std::string::npos) throw std::runtime_error("fio gave no JSON (is fio installed?): " + cmd);
  const auto j = nlohmann::json::parse(out.substr(start));
  return j["jobs"][0][write ? "write" : "read"]["bw_bytes"].get<double>();
}


namespace {

std::string gbps(const Spread& s, bool with_range) {
  std::string t = fixed(s.median / 1e9, 2);
  if (with_range) t.append(" (").append(fixed(s.min / 1e9, 2)).append("-").append(fixed(s.max / 1e9, 2)).append(")");
  return t;
}

}  // namespace

int run_io_bench(const IoBenchOptions& opt, Report& report) {
  if (opt.path.empty()) throw std::runtime_error("ferry bench io needs --path DIR (a folder on the disk to measure)");
  const uint64_t size = opt.quick ? (64u << 20) : (1u << 30);
  std::vector<size_t> blocks = {128u << 10, 1u << 20, 8u << 20};
  std::vector<int> depths = {1, 8, 64};
  if (opt.quick) blocks = {1u << 20}, depths = {1, 8};
  const int reps = opt.quick ? 1 : 3;
  offload::PinnedPoolOptions po;
  po.buffer_size = size;
  po.buffer_count = 1;
  po.allow_unpinned = true;  // measured all the same; the warning says so
  offload::PinnedPool pool(po);
  if (!pool.warning().empty()) std::fprintf(stderr, "ferry bench io: %s\n", pool.warning().c_str());
  void* raw = pool.acquire();
  for (uint64_t i = 0; i < size / 8; ++i) static_cast<uint64_t*>(raw)[i] = i * 0x9e3779b97f4a7c15ull;
  std::unique_ptr<PeerProcess> peer;
  if (!opt.peers.empty()) {
    peer = std::make_unique<PeerProcess>("DeepSpeed's aio", opt.peers,
                                         std::string(FERRY_SOURCE_DIR) + "/benchmarks/peers/io_peer.py",
                                         std::vector<std::string>{"DS_ACCELERATOR=cpu"});
  }
  report.bench = "io";
  report.threads = 1;
  report.columns = {"op", "block", "depth", "ferry GB/s", "fio GB/s", "ferry / fio"};
  if (peer) report.columns.insert(report.columns.end(), {"DeepSpeed aio GB/s", "ferry / DeepSpeed", "ferry / best"});
  double sum_ferry = 0, sum_fio = 0, sum_ds = 0, worst_best = 1e30;
  std::string file;
  for (size_t bs : blocks) {
    for (int qd : depths) {
      offload::StorageOptions o;
      o.paths = {opt.path};
      o.name = "ferry-bench-io";
      o.capacity = size;
      o.aio.block_size = bs;
      o.aio.queue_depth = qd;
      std::string warning;
      auto store = offload::make_storage(o, &warning);
      if (!warning.empty()) std::fprintf(stderr, "ferry bench io: %s\n", warning.c_str());
      std::string registered = "fixed buffers";
      try {
        store->register_buffers(pool.regions());  // as ShardStore::use_pool does
      } catch (const offload::StorageError& e) {
        registered = std::string("not registered: ") + e.what();
      }
      file = opt.path + "/ferry-bench-io.swp";
      // Write the file once untimed: first writes into fallocated (unwritten) extents cost
      // an extent conversion that fio, coming second, would never pay.
      if (bs == blocks.front() && qd == depths.front()) store->write(0, raw, size), store->sync();
      for (bool write : {true, false}) {
        std::vector<double> ferry_v, fio_v, ds_v;
        const int sides = peer ? 3 : 2;
        for (int r = 0; r < reps; ++r) {
          // Each repetition starts with another side: on a shared virtual disk the first
          // pass after a change of pattern was seen 2x faster or slower than the next.
          for (int k = 0; k < sides; ++k) {
            const int side = (r + k) % sides;
            if (side == 0) {
              const auto t0 = std::chrono::steady_clock::now();
              write ? store->write(0, raw, size) : store->read(0, raw, size);
              if (write) store->sync();
              ferry_v.push_back(static_cast<double>(size) /
                                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            } else if (side == 1) {
              fio_v.push_back(fio_bandwidth(file, write, bs, qd, size));
            } else {
              const nlohmann::json a = peer->request({{"op", write ? "write" : "read"},
                                                      {"path", file},
                                                      {"bytes", size},
                                                      {"block_size", bs},
                                                      {"queue_depth", qd}});
              ds_v.push_back(static_cast<double>(size) / a.at("seconds").get<double>());
            }
          }
        }
        const Spread f = spread(ferry_v), fi = spread(fio_v);
        sum_ferry += f.median;
        sum_fio += fi.median;
        std::vector<std::string> row = {write ? "write" : "read", std::to_string(bs >> 10) + " KiB",
                                        std::to_string(qd), gbps(f, reps > 1), gbps(fi, reps > 1),
                                        fixed(f.median / fi.median, 3)};
        nlohmann::json jrow = {{"op", write ? "write" : "read"},
                               {"block_size", bs},
                               {"queue_depth", qd},
                               {"bytes", size},
                               {"repetitions", reps},
                               {"storage", store->describe()},
                               {"ferry_buffer", std::string(pool.pinned() ? "pinned pool, " : "pool (not pinned), ") + registered},
                               {"ferry_bytes_per_s", f.median},
                               {"ferry_min_max", {f.min, f.max}},
                               {"fio_bytes_per_s", fi.median},
                               {"fio_min_max", {fi.min, fi.max}},
                               {"ratio", f.median / fi.median}};
        if (peer) {
          const Spread d = spread(ds_v);
          sum_ds += d.median;
          const double best = std::max(fi.median, d.median);
          worst_best = std::min(worst_best, f.median / best);
          row.insert(row.end(), {gbps(d, reps > 1), fixed(f.median / d.median, 3), fixed(f.median / best, 3)});
          jrow["deepspeed_aio_bytes_per_s"] = d.median;
          jrow["deepspeed_aio_min_max"] = {d.min, d.max};
          jrow["ratio_deepspeed"] = f.median / d.median;
          jrow["ratio_best_peer"] = f.median / best;
        }
        report.table.push_back(row);
        report.rows.push_back(jrow);
      }
    }
  }
  pool.release(raw);
  unlink(file.c_str());
  const double cases = static_cast<double>(report.rows.size());
  report.headline = {"ferry_bytes_per_s (mean over cases)", sum_ferry / cases, "fio_bytes_per_s (mean over cases)",
                     sum_fio / cases, 0.95};
  if (peer) {
    report.headline.extra["deepspeed_aio_bytes_per_s (mean over cases)"] = sum_ds / cases;
    report.headline.extra["worst ferry / best peer (per case)"] = worst_best;
    report.headline.extra["peer"] = peer->hello();
  }
  return 0;
}

}  // namespace ferry::bench
