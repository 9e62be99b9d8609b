// ferry bench step: is the overlapped step as fast as its slowest resource?
//
// Cases, each a median over timed steps after warm-up steps (the first step records the
// unit order; prefetching starts with the second):
//   overlapped   the default schedule (overlap_comm, schedule.overlap_offload)
//   sequential   both off: every read, collective and update waited for in turn
//   compute      the same model and batch with every state in memory: the CPU cores alone
//   nvme         the bytes the step moves, replayed through ferry's io_uring storage with
//                the step's request sizes: reads on one thread, writes on another, then
//                serially; the faster of the two is the disk alone
// Headline: steps/s overlapped against sequential (speedup_vs_sequential, goal 1.6) and
// step_over_longest_resource (goal <= 1.1: 90% of the work off the critical path hidden),
// and the NVMe bytes per parameter per step (--bf16: bf16 parameter shards). --device cuda:
// the same on a GPU, with the bytes over PCIe per parameter against their minimum.
// --peers PY: DeepSpeed ZeRO-Infinity on the CPU with the same model, batch, threads, NVMe
// folder and aio settings (benchmarks/peers/step_peer.py), three rounds alternating with
// ferry's overlapped case, each starting with the other side; medians of the rounds' medians
// with min-max, and ferry's steps/s over DeepSpeed's.
#include "benchmarks/bench_step.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <ostream>
#include <thread>

#include "benchmarks/peer_process.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "offload/pinned_pool.h"
#include "offload/storage.h"
#include "runtime/train/trainer.h"
#include "runtime/zero/partition.h"

namespace ferry::bench {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

nlohmann::json bench_doc(const StepBenchOptions& opt, const std::string& dir, bool offload) {
  const bool q = opt.quick;
  nlohmann::json zero = {{"stage", 3}};
  if (offload) {
    zero["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", dir}};
    zero["offload_param"] = {{"device", "nvme"}, {"nvme_path", dir}};
  }
  nlohmann::json doc = {{"model", {{"n_layer", q ? 2 : 8}, {"n_head", q ? 2 : 12}, {"n_embd", q ? 64 : 768}, {"block_size", q ? 32 : 128}}},
          {"data", {{"path", std::string(FERRY_SOURCE_DIR) + "/examples/data/kjv.txt"}}},
          {"device", {{"memory", "8GiB"}}},
          {"train_micro_batch_size_per_gpu", q ? 2 : 8},
          {"zero_optimization", zero},
          {"train", {{"steps", 1000}, {"eval_every", 0}, {"eval_batches", 1}, {"sample_tokens", 0}}}};
  if (opt.bf16) doc["bf16"] = {{"enabled", true}};
  if (opt.device == "cuda") doc["device"]["type"] = "cuda";
  return doc;
}

struct Timed {
  double step_s = 0;
  StepBreakdown last;
  std::vector<int> order;
  std::vector<int64_t> shards;  // per unit, elements (one rank: the whole padded unit)
  int64_t params = 0;
  double nvme_bytes = 0;        // median over timed steps: parameter and optimizer reads + writes
  size_t param_bytes = 4;       // bytes per element of the parameter shards on NVMe
  double up_bytes = 0, down_bytes = 0;  // medians over timed steps: host -> device, device -> host
};

Timed time_steps(comm::Communicator& comm, const nlohmann::json& doc, const std::vector<std::string>& overrides,
                 int warmup, int timed, const std::string& trace) {
  std::ostream discard(nullptr);
  runtime::Trainer t(runtime::config_from_json(doc, "ferry bench step", "", overrides), comm, discard);
  Timed r;
  std::vector<double> times, nvme, up, down;
  for (int s = 0; s < warmup + timed; ++s) {
    if (!trace.empty() && s == warmup + timed - 1) t.tracer().open_file(trace);
    const runtime::StepStats st = t.train_step(s);
    if (s >= warmup) {
      times.push_back(st.time.wall_s);
      double b = 0;
      for (Activity a : {Activity::param_read, Activity::param_write, Activity::optim_read, Activity::optim_write})
        b += static_cast<double>(st.time.bytes[static_cast<size_t>(a)]);
      nvme.push_back(b);
      up.push_back(static_cast<double>(st.to_device_bytes));
      down.push_back(static_cast<double>(st.to_host_bytes));
    }
    r.last = st.time;
  }
  r.step_s = spread(times).median;
  r.nvme_bytes = spread(nvme).median;
  r.up_bytes = spread(up).median;
  r.down_bytes = spread(down).median;
  r.params = t.model().num_parameters();
  r.param_bytes = t.units().owned_rounded() ? 2 : 4;
  r.order = t.units().order().order();
  for (int u = 0; u < t.model().num_units(); ++u) r.shards.push_back(t.units().partition_of(u).shard);
  return r;
}

struct Replay {
  double concurrent_s = 0, serial_s = 0;
  uint64_t read_bytes = 0, write_bytes = 0;
};

// The step's NVMe requests: each parameter shard read whole at every position of the
// order; per unit, master, m and v read and written in pool-buffer tiles, and the
// parameter shard written back.
Replay replay_nvme(const std::string& dir, const Timed& t, int repeats) {
  const int64_t largest = *std::max_element(t.shards.begin(), t.shards.end());
  const int64_t tile = (largest + 1023) / 1024 * 1024;
  std::vector<uint64_t> base;  // per unit: its parameter region; then 3 optimizer arrays x 2 slots
  uint64_t total = 0;
  for (size_t u = 0; u < t.shards.size(); ++u) base.push_back(total), total += static_cast<uint64_t>(tile) * 4 * 7;
  offload::StorageOptions so;
  so.paths = {dir};
  so.name = "ferry-bench-step-replay";
  so.capacity = total;
  std::string warning;
  auto storage = offload::make_storage(so, &warning);
  if (!warning.empty()) std::cerr << "ferry bench step: " << warning << "\n";
  // Two buffers of a pinned pool registered as fixed buffers: the memory the step's own
  // reads and writes go through.
  offload::PinnedPoolOptions po;
  po.buffer_size = static_cast<size_t>(tile) * 4;
  po.buffer_count = 2;
  po.allow_unpinned = true;
  offload::PinnedPool pool(po);
  try {
    storage->register_buffers(pool.regions());
  } catch (const offload::StorageError& e) {
    std::cerr << "ferry bench step: replay without fixed buffers: " << e.what() << "\n";
  }
  struct Buf {
    offload::PinnedPool& pool;
    char* p;
    ~Buf() { pool.release(p); }
    char* get() const { return p; }
  };
  Buf rbuf{pool, static_cast<char*>(pool.acquire())}, wbuf{pool, static_cast<char*>(pool.acquire())};
  std::memset(wbuf.get(), 1, po.buffer_size);
  auto bytes = [](int64_t n) { return static_cast<size_t>((n + 1023) / 1024 * 1024) * 4; };
  // Parameter shards in their dtype on NVMe (bf16 runs: two bytes), in 4 KiB multiples.
  auto pbytes = [&t](int64_t n) {
    return (static_cast<size_t>(n) * t.param_bytes + 4095) / 4096 * 4096;
  };
  // Every byte written once first: reading never-written extents would cost no I/O.
  for (uint64_t off = 0; off < total; off += static_cast<uint64_t>(tile) * 4) storage->write(off, wbuf.get(), static_cast<size_t>(tile) * 4);
  storage->sync();
  Replay r;
  auto reads = [&] {
    for (int u : t.order) storage->read(base[static_cast<size_t>(u)], rbuf.get(), pbytes(t.shards[static_cast<size_t>(u)]));
    for (size_t u = 0; u < t.shards.size(); ++u)
      for (int a = 0; a < 3; ++a) storage->read(base[u] + static_cast<uint64_t>(tile) * 4 * (1 + a), rbuf.get(), bytes(t.shards[u]));
  };
  auto writes = [&] {
    for (size_t u = 0; u < t.shards.size(); ++u) {
      for (int a = 0; a < 3; ++a) storage->write(base[u] + static_cast<uint64_t>(tile) * 4 * (4 + a), wbuf.get(), bytes(t.shards[u]));
      storage->write(base[u], wbuf.get(), pbytes(t.shards[u]));
    }
  };
  for (int u : t.order) r.read_bytes += pbytes(t.shards[static_cast<size_t>(u)]);
  for (int64_t s : t.shards) r.read_bytes += 3 * bytes(s), r.write_bytes += 3 * bytes(s) + pbytes(s);
  std::vector<double> conc, ser;
  for (int k = 0; k < repeats; ++k) {
    auto t0 = clock_type::now();
    std::thread w(writes);
    reads();
    w.join();
    conc.push_back(seconds_since(t0));
    t0 = clock_type::now();
    reads();
    writes();
    ser.push_back(seconds_since(t0));
  }
  r.concurrent_s = spread(conc).median;
  r.serial_s = spread(ser).median;
  storage.reset();
  fs::remove(fs::path(dir) / "ferry-bench-step-replay.swp");
  return r;
}

}  // namespace

int run_step_bench(const StepBenchOptions& opt, Report& report) {
  if (opt.nvme_path.empty()) throw std::runtime_error("ferry bench step needs --nvme-path DIR (a folder on the disk to use)");
  const std::string dir = (fs::path(opt.nvme_path) / "ferry-bench-step").string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string trace = opt.trace.empty() ? (fs::path(opt.nvme_path) / "ferry-bench-step.trace.json").string() : opt.trace;
  const int warmup = 2, timed = opt.quick ? 1 : 3;
  const std::vector<std::string> sequential = {"zero_optimization.overlap_comm=false", "schedule.overlap_offload=false"};
  // The cuda device starts NCCL over MPI (one rank: an MPI singleton); the CPU device needs
  // no MPI at all.
  comm::SingleProcessCommunicator alone;
  std::unique_ptr<comm::MpiCommunicator> world;
  if (opt.device == "cuda") world = comm::MpiCommunicator::world(/*timeout_s=*/300);
  comm::Communicator& comm = world ? static_cast<comm::Communicator&>(*world) : alone;
  const std::string peer_dir = (fs::path(opt.nvme_path) / "ferry-bench-step-deepspeed").string();
  // Both folders go on every path out, an exception's included (DeepSpeed's swap files are
  // gigabytes); the peer is stopped before its folder is removed.
  struct Remove {
    std::vector<std::string> dirs;
    ~Remove() {
      std::error_code ec;
      for (const std::string& d : dirs) fs::remove_all(d, ec);
    }
  } remove{{dir, peer_dir}};
  std::unique_ptr<PeerProcess> peer;  // after `remove`: stopped before the folders go
  int64_t peer_params = 0;
  if (!opt.peers.empty()) {
    if (opt.device != "cpu" || opt.bf16) {
      throw std::runtime_error("--peers: DeepSpeed's side of ferry bench step is fp32 on the CPU: leave out --device cuda and --bf16");
    }
    fs::remove_all(peer_dir);
    fs::create_directories(peer_dir);
    const nlohmann::json d = bench_doc(opt, dir, true);
    const int threads = omp_get_max_threads();  // what ferry's CPU device takes
    peer = std::make_unique<PeerProcess>("DeepSpeed ZeRO-Infinity", opt.peers,
                                         std::string(FERRY_SOURCE_DIR) + "/benchmarks/peers/step_peer.py",
                                         std::vector<std::string>{"OMP_NUM_THREADS=" + std::to_string(threads),
                                                                  "DS_ACCELERATOR=cpu"});
    peer_params = peer->request({{"init",
                                  {{"n_layer", d["model"]["n_layer"]}, {"n_head", d["model"]["n_head"]},
                                   {"n_embd", d["model"]["n_embd"]}, {"vocab_size", 256},
                                   {"block_size", d["model"]["block_size"]},
                                   {"batch", d["train_micro_batch_size_per_gpu"]}, {"nvme_path", peer_dir},
                                   {"lr", 1e-3}, {"weight_decay", 0.0}, {"warmup", warmup}}}})
                      .at("params")
                      .get<int64_t>();
  }
  const Timed seq = time_steps(comm, bench_doc(opt, dir, true), sequential, warmup, timed, "");
  if (peer && peer_params != seq.params) {
    throw std::runtime_error("--peers " + opt.peers + ": DeepSpeed's model has " + std::to_string(peer_params) +
                             " parameters and ferry's " + std::to_string(seq.params) +
                             ": benchmarks/peers/model_peer.py no longer mirrors nn/gpt.h");
  }
  // The overlapped case: once alone, or in rounds alternating with the peer.
  const int rounds = peer ? 3 : 1;
  std::vector<double> ovl_rounds, peer_rounds;
  Timed ovl;
  int round = 0;
  alternate_sides(
      rounds,
      [&] {
        ovl = time_steps(comm, bench_doc(opt, dir, true), {}, warmup, timed, ++round == rounds ? trace : "");
        ovl_rounds.push_back(ovl.step_s);
      },
      !peer ? nullptr : std::function<void()>([&] {
        peer_rounds.push_back(spread(peer->request({{"steps", timed}}).at("seconds").get<std::vector<double>>()).median);
      }));
  ovl.step_s = spread(ovl_rounds).median;
  peer.reset();  // stopped before its folder goes
  const Timed cpu = time_steps(comm, bench_doc(opt, dir, false), {}, warmup, timed, "");
  const Replay io = replay_nvme(dir, ovl, opt.quick ? 1 : 3);
  const double nvme_s = std::min(io.concurrent_s, io.serial_s), comm_s = 0;
  const double longest = std::max({cpu.step_s, nvme_s, comm_s});
  const char* longest_name = longest == cpu.step_s ? "compute" : "nvme";
  const double speedup = seq.step_s / ovl.step_s, over_longest = ovl.step_s / longest;

  report.columns = {"case", "step s", "what it measures; where the time went (seconds busy per activity)"};
  auto row = [&](const std::string& name, double s, const std::string& what) {
    report.table.push_back({name, fixed(s, 3), what});
    report.rows.push_back({{"case", name}, {"step_s", s}, {"what", what}});
  };
  row("overlapped", ovl.step_s, "default schedule; " + runtime::describe_breakdown(ovl.last));
  const Spread ferry_spread = spread(ovl_rounds), peer_spread = spread(peer_rounds);
  if (!peer_rounds.empty()) {
    row("deepspeed zero-3 nvme", peer_spread.median,
        "DeepSpeed ZeRO-Infinity on the CPU, same model, batch, threads and disk: rounds " + fixed(peer_spread.min, 3) +
            "-" + fixed(peer_spread.max, 3) + " s against ferry's overlapped " + fixed(ferry_spread.min, 3) + "-" +
            fixed(ferry_spread.max, 3) + " s; ferry / DeepSpeed (steps/s) " +
            fixed(peer_spread.median / ferry_spread.median, 3));
  }
  row("sequential", seq.step_s, "overlap off; " + runtime::describe_breakdown(seq.last));
  const bool gpu = opt.device == "cuda";
  row("compute alone", cpu.step_s, gpu ? "every state on the GPU: the device alone" : "every state in memory: the CPU cores");
  row("nvme alone", nvme_s,
      "replay of " + fixed(static_cast<double>(io.read_bytes) / 1e9, 2) + " GB read + " +
          fixed(static_cast<double>(io.write_bytes) / 1e9, 2) + " GB written: concurrent " + fixed(io.concurrent_s, 3) +
          " s, serial " + fixed(io.serial_s, 3) + " s");
  row("comm alone", comm_s, "one rank: nothing crosses a process");
  const double per_param = ovl.nvme_bytes / static_cast<double>(ovl.params);
  report.table.push_back({"nvme bytes/param", fixed(per_param, 1),
                          std::string(opt.bf16 ? "bf16" : "fp32") + " parameter shards: the overlapped step's reads + writes over " +
                              std::to_string(ovl.params) + " parameters"});
  // The minimum over PCIe at one rank (docs/design/zero.md): each gather position of the recorded
  // order uploads its shard in the compute dtype, each unit's fp32 gradient shard comes down.
  double up_min = 0, down_min = 0;
  for (int u : ovl.order) up_min += static_cast<double>(ovl.shards[static_cast<size_t>(u)] * static_cast<int64_t>(ovl.param_bytes));
  for (int64_t sh : ovl.shards) down_min += 4.0 * static_cast<double>(sh);
  const double P = static_cast<double>(ovl.params);
  if (gpu) {
    report.table.push_back({"pcie bytes/param", fixed((ovl.up_bytes + ovl.down_bytes) / P, 2),
                            "up " + fixed(ovl.up_bytes / P, 2) + " (minimum " + fixed(up_min / P, 2) + "), down " +
                                fixed(ovl.down_bytes / P, 2) + " (minimum " + fixed(down_min / P, 2) +
                                "): shards only, plus tokens and the loss"});
  }
  report.rows.push_back({{"speedup_vs_sequential", speedup},
                         {"step_over_longest_resource", over_longest},
                         {"longest_resource", longest_name},
                         {"nvme_bytes_per_param", per_param},
                         {"bf16", opt.bf16},
                         {"device", opt.device},
                         {"trace", trace}});
  if (gpu) {
    report.rows.back()["pcie_up_bytes_per_param"] = ovl.up_bytes / P;
    report.rows.back()["pcie_down_bytes_per_param"] = ovl.down_bytes / P;
    report.rows.back()["pcie_up_min_bytes_per_param"] = up_min / P;
    report.rows.back()["pcie_down_min_bytes_per_param"] = down_min / P;
  }
  if (!peer_rounds.empty()) {
    report.rows.back()["deepspeed_step_s"] = peer_spread.median;
    report.rows.back()["deepspeed_step_s_min_max"] = {peer_spread.min, peer_spread.max};
    report.rows.back()["overlapped_step_s_min_max"] = {ferry_spread.min, ferry_spread.max};
    report.rows.back()["ferry_over_deepspeed"] = peer_spread.median / ferry_spread.median;
  }
  report.headline = {"steps_per_s_overlapped", 1.0 / ovl.step_s, "steps_per_s_sequential", 1.0 / seq.step_s, 1.6,
                     {{"speedup_vs_sequential", speedup},
                      {"step_over_longest_resource", over_longest},
                      {"step_over_longest_resource_goal", 1.1},
                      {"nvme_bytes_per_param", per_param},
                      {"longest_resource", longest_name},
                      {"trace", trace}}};
  if (!peer_rounds.empty()) {
    report.headline.extra["ferry_over_deepspeed_zero_infinity"] = peer_spread.median / ferry_spread.median;
  }
  return 0;
}

}  // namespace ferry::bench
