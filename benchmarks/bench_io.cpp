// ferry bench io --path DIR: sequential write then read GB/s of ferry's store (io_uring,
// O_DIRECT) for block sizes 128 KiB to 8 MiB and queue depths 1 to 64, and in the same run
// fio (ioengine=io_uring, direct=1) on the same file with the same block size and depth.
// Each case moves the whole file (1 GiB) in one call, so the queue stays full; writes
// end with fdatasync on both sides (fio --end_fsync=1). The file is written once before
// the first case. The ratio is ferry's GB/s over fio's.
#include "benchmarks/bench_io.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "offload/storage.h"

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
  const std::string cmd = "fio --name=ferry --filename=" + file + " --rw=" + (write ? "write" : "read") +
                          " --bs=" + std::to_string(bs) + " --iodepth=" + std::to_string(qd) +
                          " --ioengine=io_uring --direct=1 --end_fsync=1 --size=" + std::to_string(size) +
                          " --output-format=json 2>/dev/null";
  const std::string out = run_command(cmd);
  const auto start = out.find('{');
  if (start == std::string::npos) throw std::runtime_error("fio gave no JSON (is fio installed?): " + cmd);
  const auto j = nlohmann::json::parse(out.substr(start));
  return j["jobs"][0][write ? "write" : "read"]["bw_bytes"].get<double>();
}


int run_io_bench(const IoBenchOptions& opt, Report& report) {
  if (opt.path.empty()) throw std::runtime_error("ferry bench io needs --path DIR (a folder on the disk to measure)");
  const uint64_t size = opt.quick ? (64u << 20) : (1u << 30);
  std::vector<size_t> blocks = {128u << 10, 1u << 20, 8u << 20};
  std::vector<int> depths = {1, 8, 64};
  if (opt.quick) blocks = {1u << 20}, depths = {1, 8};
  void* raw = std::aligned_alloc(4096, size);
  std::unique_ptr<void, decltype(&std::free)> buf(raw, &std::free);
  for (uint64_t i = 0; i < size / 8; ++i) static_cast<uint64_t*>(raw)[i] = i * 0x9e3779b97f4a7c15ull;
  report.bench = "io";
  report.threads = 1;
  report.columns = {"op", "block", "depth", "ferry GB/s", "fio GB/s", "ratio"};
  double sum_ferry = 0, sum_fio = 0;
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
      file = opt.path + "/ferry-bench-io.swp";
      // Write the file once untimed: first writes into fallocated (unwritten) extents cost
      // an extent conversion that fio, coming second, would never pay.
      if (bs == blocks.front() && qd == depths.front()) store->write(0, raw, size), store->sync();
      for (bool write : {true, false}) {
        const auto t0 = std::chrono::steady_clock::now();
        write ? store->write(0, raw, size) : store->read(0, raw, size);
        if (write) store->sync();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double ferry = static_cast<double>(size) / s;
        const double fio = fio_bandwidth(file, write, bs, qd, size);
        sum_ferry += ferry;
        sum_fio += fio;
        report.table.push_back({write ? "write" : "read", std::to_string(bs >> 10) + " KiB", std::to_string(qd),
                                fixed(ferry / 1e9, 2), fixed(fio / 1e9, 2), fixed(ferry / fio, 3)});
        report.rows.push_back({{"op", write ? "write" : "read"},
                               {"block_size", bs},
                               {"queue_depth", qd},
                               {"bytes", size},
                               {"storage", store->describe()},
                               {"ferry_bytes_per_s", ferry},
                               {"fio_bytes_per_s", fio},
                               {"ratio", ferry / fio}});
      }
    }
  }
  unlink(file.c_str());
  const double cases = static_cast<double>(report.rows.size());
  report.headline = {"ferry_bytes_per_s (mean over cases)", sum_ferry / cases, "fio_bytes_per_s (mean over cases)",
                     sum_fio / cases, 0.95};
  return 0;
}

}  // namespace ferry::bench
