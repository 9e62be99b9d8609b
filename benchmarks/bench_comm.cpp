// ferry bench comm: all_gather and reduce_scatter through ferry's communicator (funnel,
// worker thread, polling) against the same MPI collective called directly (blocking
// MPI_Allgather / MPI_Reduce_scatter_block), same buffers, same run, interleaved so that
// drift hits both alike. Size is the full buffer (gathered, or reduced before scattering);
// GB/s is size / time (the algorithm bandwidth of nccl-tests). Each case keeps the best of
// its repetitions. A second ratio: the node-local shared-memory path (ShmCollectives)
// against the same direct call. At two or more hosts, what each ZeRO-3 layout sends between
// them (bench_comm_hosts.h).
#include "benchmarks/bench_comm.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "benchmarks/bench_comm_hosts.h"
#include "comm/mpi_communicator.h"
#include "comm/shm_collectives.h"

namespace ferry::bench {

namespace {

double now() { return MPI_Wtime(); }

}  // namespace

int run_comm_bench(const CommBenchOptions& opt, Report& report, bool& is_root,
                   const std::function<void()>& report_ready) {
  auto comm = comm::MpiCommunicator::world(/*timeout_s=*/600);
  const int W = comm->size(), rank = comm->rank();
  is_root = rank == 0;
  MPI_Comm raw = comm->handle();
  report.bench = "comm";
  report.threads = W;
  report.columns = {"op", "size", "ranks", "direct MPI GB/s", "ferry GB/s", "ratio", "shm GB/s", "shm ratio"};
  // The node-local shared-memory path (the stretch): one window of 64 MiB per rank; only
  // where every rank is on one node.
  std::unique_ptr<comm::ShmCollectives> shm;
  if (comm->local_size() == W) shm = std::make_unique<comm::ShmCollectives>(raw, 64u << 20);
  std::vector<size_t> sizes = {4u << 20, 16u << 20, 64u << 20, 256u << 20};
  if (opt.quick) sizes = {1u << 20, 4u << 20};
  const int reps = opt.quick ? 2 : 5;
  double total_bytes = 0, total_direct = 0, total_ferry = 0, total_shm = 0;
  for (const char* op : {"all_gather", "reduce_scatter"}) {
    for (size_t size : sizes) {
      const size_t count = size / 4 / static_cast<size_t>(W);  // floats per rank
      std::vector<float> full(count * static_cast<size_t>(W)), part(count);
      for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>((i + static_cast<size_t>(rank)) % 97);
      std::fill(part.begin(), part.end(), 1.0f + static_cast<float>(rank));
      const bool gather = std::strcmp(op, "all_gather") == 0;
      double best_direct = 1e30, best_ferry = 1e30, best_shm = 1e30;
      for (int r = 0; r < reps + 1; ++r) {  // the first round warms up connections and pages
        MPI_Barrier(raw);
        double t0 = now();
        if (gather) {
          MPI_Allgather(part.data(), static_cast<int>(count), MPI_FLOAT, full.data(), static_cast<int>(count), MPI_FLOAT, raw);
        } else {
          MPI_Reduce_scatter_block(full.data(), part.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, raw);
        }
        const double direct = now() - t0;
        MPI_Barrier(raw);
        t0 = now();
        if (gather) {
          comm->all_gather(part.data(), full.data(), count, comm::DataType::f32)->wait();
        } else {
          comm->reduce_scatter(full.data(), part.data(), count, comm::DataType::f32, comm::ReduceOp::sum)->wait();
        }
        const double ferry = now() - t0;
        double shm_s = 0;
        if (shm) {
          MPI_Barrier(raw);
          t0 = now();
          if (gather) {
            shm->all_gather(part.data(), full.data(), count);
          } else {
            shm->reduce_scatter_sum(full.data(), part.data(), count);
          }
          shm_s = now() - t0;
        }
        if (r > 0) {
          best_direct = std::min(best_direct, direct), best_ferry = std::min(best_ferry, ferry);
          best_shm = std::min(best_shm, shm_s);
        }
      }
      // The slowest rank's time is the collective's time.
      double times[3] = {best_direct, best_ferry, best_shm};
      MPI_Allreduce(MPI_IN_PLACE, times, 3, MPI_DOUBLE, MPI_MAX, raw);
      const double bytes = static_cast<double>(count * static_cast<size_t>(W) * 4);
      total_bytes += bytes;
      total_direct += times[0];
      total_ferry += times[1];
      const double gd = bytes / times[0] / 1e9, gf = bytes / times[1] / 1e9, gs = bytes / times[2] / 1e9;
      total_shm += times[2];
      report.table.push_back({op, std::to_string(size >> 20) + " MiB", std::to_string(W), fixed(gd, 2), fixed(gf, 2),
                              fixed(gf / gd, 3), shm ? fixed(gs, 2) : "n/a", shm ? fixed(gs / gd, 2) : "n/a"});
      report.rows.push_back({{"op", op},
                             {"bytes", bytes},
                             {"ranks", W},
                             {"direct_mpi_seconds", times[0]},
                             {"ferry_seconds", times[1]},
                             {"direct_mpi_gbps", gd},
                             {"ferry_gbps", gf},
                             {"ratio", gf / gd},
                             {"shm_seconds", shm ? nlohmann::json(times[2]) : nlohmann::json()},
                             {"shm_gbps", shm ? nlohmann::json(gs) : nlohmann::json()},
                             {"shm_ratio", shm ? nlohmann::json(gs / gd) : nlohmann::json()}});
    }
  }
  if (!is_root) {
  } else if (shm) {
    std::printf("shared-memory path (comm::ShmCollectives): %.2f GB/s vs direct %.2f GB/s: ratio %.2f\n",
                total_bytes / total_shm / 1e9, total_bytes / total_direct / 1e9, total_direct / total_shm);
  } else {
    std::printf("shared-memory path (comm::ShmCollectives): not run, the ranks span several hosts\n");
  }
  report.headline = {"ferry_gbps (all cases)", total_bytes / total_ferry / 1e9, "direct_mpi_gbps (all cases)",
                     total_bytes / total_direct / 1e9, 0.95};
  run_host_layouts(*comm, opt.quick, report);
  if (is_root) report_ready();
  // Done: a hang in MPI_Finalize that the communicator's guard ends exits 0, as ferry train's.
  comm->set_exit_status(0);
  return 0;
}

}  // namespace ferry::bench
