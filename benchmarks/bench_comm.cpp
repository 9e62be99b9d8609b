// ferry-bench comm: all_gather and reduce_scatter through ferry's communicator (funnel,
// worker thread, polling) against the same MPI collective called directly (blocking
// MPI_Allgather / MPI_Reduce_scatter_block), same buffers, same run, interleaved so that
// drift hits both alike. Size is the full buffer (gathered, or reduced before scattering);
// GB/s is size / time (the algorithm bandwidth of nccl-tests). Each case keeps the best of
// its repetitions.
#include "benchmarks/bench_comm.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "comm/mpi_communicator.h"

namespace ferry::bench {

namespace {

double now() { return MPI_Wtime(); }

}  // namespace

int run_comm_bench(const CommBenchOptions& opt, Report& report, bool& is_root) {
  auto comm = comm::MpiCommunicator::world(/*timeout_s=*/600);
  const int W = comm->size(), rank = comm->rank();
  is_root = rank == 0;
  MPI_Comm raw = comm->handle();
  report.bench = "comm";
  report.threads = W;
  report.columns = {"op", "size", "ranks", "direct MPI GB/s", "ferry GB/s", "ratio"};
  std::vector<size_t> sizes = {4u << 20, 16u << 20, 64u << 20, 256u << 20};
  if (opt.quick) sizes = {1u << 20, 4u << 20};
  const int reps = opt.quick ? 2 : 5;
  double total_bytes = 0, total_direct = 0, total_ferry = 0;
  for (const char* op : {"all_gather", "reduce_scatter"}) {
    for (size_t size : sizes) {
      const size_t count = size / 4 / static_cast<size_t>(W);  // floats per rank
      std::vector<float> full(count * static_cast<size_t>(W)), part(count);
      for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>((i + static_cast<size_t>(rank)) % 97);
      std::fill(part.begin(), part.end(), 1.0f + static_cast<float>(rank));
      const bool gather = std::strcmp(op, "all_gather") == 0;
      double best_direct = 1e30, best_ferry = 1e30;
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
        if (r > 0) best_direct = std::min(best_direct, direct), best_ferry = std::min(best_ferry, ferry);
      }
      // The slowest rank's time is the collective's time.
      double times[2] = {best_direct, best_ferry};
      MPI_Allreduce(MPI_IN_PLACE, times, 2, MPI_DOUBLE, MPI_MAX, raw);
      const double bytes = static_cast<double>(count * static_cast<size_t>(W) * 4);
      total_bytes += bytes;
      total_direct += times[0];
      total_ferry += times[1];
      const double gd = bytes / times[0] / 1e9, gf = bytes / times[1] / 1e9;
      report.table.push_back({op, std::to_string(size >> 20) + " MiB", std::to_string(W), fixed(gd, 2), fixed(gf, 2),
                              fixed(gf / gd, 3)});
      report.rows.push_back({{"op", op},
                             {"bytes", bytes},
                             {"ranks", W},
                             {"direct_mpi_seconds", times[0]},
                             {"ferry_seconds", times[1]},
                             {"direct_mpi_gbps", gd},
                             {"ferry_gbps", gf},
                             {"ratio", gf / gd}});
    }
  }
  report.headline = {"ferry_gbps (all cases)", total_bytes / total_ferry / 1e9, "direct_mpi_gbps (all cases)",
                     total_bytes / total_direct / 1e9, 0.95};
  return 0;
}

}  // namespace ferry::bench
