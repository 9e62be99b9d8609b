// The layouts' collectives for one unit of S bytes of fp32 weights, as ShardedUnits issues
// them in a step (forward gather, backward gather, gradient reduce-scatter):
//   plain:  all_gather(world) x 2, reduce_scatter(world)
//   hybrid: all_gather(host) x 2, reduce_scatter(host), all_reduce(replicas) of the shard
//   hpZ:    all_gather(world), all_gather(host) from the node copy, reduce_scatter(world)
// Bytes are what the links counted, not a model of the algorithms MPI picks: that is what
// a user pays for, and it catches a transport that does not go where it was meant to (over
// TCP between hosts; shared memory within one). Other traffic on the same links counts
// too: run it on an idle allocation.
#include "benchmarks/bench_comm_hosts.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

namespace ferry::bench {

long long host_link_tx_bytes() {
  long long total = -1;
  std::ifstream dev("/proc/net/dev");
  std::string line;
  for (int n = 0; std::getline(dev, line); ++n) {
    const size_t colon = line.find(':');
    if (n < 2 || colon == std::string::npos) continue;  // two header lines
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name == "lo") continue;
    std::istringstream fields(line.substr(colon + 1));
    long long v = 0, tx = -1;
    for (int i = 0; i < 9 && fields >> v; ++i) tx = (i == 8) ? v : tx;  // 9th field: bytes sent
    if (tx >= 0) total = std::max(total, 0LL) + tx;
  }
  std::error_code ec;
  for (const auto& hca : std::filesystem::directory_iterator("/sys/class/infiniband", ec)) {
    for (const auto& port : std::filesystem::directory_iterator(hca.path() / "ports", ec)) {
      std::ifstream in(port.path() / "counters" / "port_xmit_data");
      long long words = 0;
      if (in >> words) total = std::max(total, 0LL) + 4 * words;
    }
  }
  return total;
}

namespace {

struct Layout {
  const char* name;
  const char* what;
};

}  // namespace

void run_host_layouts(comm::MpiCommunicator& world, bool quick, Report& report) {
  const int W = world.size(), rank = world.rank();
  const bool root = rank == 0;
  // Node of every rank, in order of first rank: hybrid groups must be whole hosts.
  std::map<std::string, int> node_of;
  std::vector<int> node(static_cast<size_t>(W)), count;
  for (int r = 0; r < W; ++r) {
    auto [it, fresh] = node_of.emplace(world.ranks()[static_cast<size_t>(r)].host, static_cast<int>(node_of.size()));
    if (fresh) count.push_back(0);
    node[static_cast<size_t>(r)] = it->second;
    ++count[static_cast<size_t>(it->second)];
  }
  const int N = static_cast<int>(count.size()), G = count[0];
  bool even = true;
  for (int r = 0; r < W; ++r) even = even && node[static_cast<size_t>(r)] == r / G;
  if (N < 2 || !even) {
    if (root)
      std::printf("across hosts: %s; run at 2 or more hosts with as many ranks on each (contiguous) to see what "
                  "each layout sends between them\n",
                  N < 2 ? "every rank is on one host" : "the hosts hold unequal or interleaved rank ranges");
    return;
  }
  auto host = world.split(rank / G, rank);
  auto replicas = world.split(rank % G, rank);
  const bool counts_link = rank % G == 0;  // one reader per host
  const size_t S = quick ? (4u << 20) : (64u << 20);
  const size_t floats = S / 4, per_world = floats / static_cast<size_t>(W), per_host = floats / static_cast<size_t>(G);
  std::vector<float> full(floats), shard(per_host), grad(floats);
  for (size_t i = 0; i < floats; ++i) grad[i] = static_cast<float>((i + static_cast<size_t>(rank)) % 89);
  std::fill(shard.begin(), shard.end(), 1.0f);
  const auto f32 = comm::DataType::f32;
  const auto sum = comm::ReduceOp::sum;
  auto step = [&](int layout) {
    if (layout == 0) {
      world.all_gather(shard.data(), full.data(), per_world, f32)->wait();
      world.all_gather(shard.data(), full.data(), per_world, f32)->wait();
      world.reduce_scatter(grad.data(), shard.data(), per_world, f32, sum)->wait();
    } else if (layout == 1) {
      host->all_gather(shard.data(), full.data(), per_host, f32)->wait();
      host->all_gather(shard.data(), full.data(), per_host, f32)->wait();
      host->reduce_scatter(grad.data(), shard.data(), per_host, f32, sum)->wait();
      replicas->all_reduce(shard.data(), per_host, f32, sum)->wait();
    } else {
      world.all_gather(shard.data(), full.data(), per_world, f32)->wait();
      host->all_gather(shard.data(), full.data(), per_host, f32)->wait();
      world.reduce_scatter(grad.data(), shard.data(), per_world, f32, sum)->wait();
    }
  };
  const Layout layouts[3] = {{"plain", "ZeRO-3 over every rank"},
                             {"hybrid", "shard group = host, replicas all-reduce shards"},
                             {"hpZ", "backward gathers from the host's node copy"}};
  const int reps = quick ? 3 : 5;
  MPI_Comm raw = world.handle();
  double plain_bytes = 0;
  nlohmann::json summary = nlohmann::json::object();
  std::vector<std::vector<std::string>> table;
  for (int l = 0; l < 3; ++l) {
    step(l);  // warms connections
    std::vector<double> seconds, bytes;
    for (int r = 0; r < reps; ++r) {
      MPI_Barrier(raw);
      const long long before = counts_link ? host_link_tx_bytes() : 0;
      const double t0 = MPI_Wtime();
      step(l);
      double t = MPI_Wtime() - t0;
      MPI_Barrier(raw);
      const long long after = counts_link ? host_link_tx_bytes() : 0;
      // Sum of the hosts' deltas; -1 anywhere means a host could not read its counters.
      double sent[2] = {before < 0 || after < 0 ? 1.0 : 0.0, static_cast<double>(after - before)};
      MPI_Allreduce(MPI_IN_PLACE, sent, 2, MPI_DOUBLE, MPI_SUM, raw);
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, raw);
      seconds.push_back(t);
      bytes.push_back(sent[0] > 0 ? -1 : sent[1] / W);
    }
    std::sort(seconds.begin(), seconds.end());
    std::sort(bytes.begin(), bytes.end());
    const double t = seconds[seconds.size() / 2], b = bytes[bytes.size() / 2];
    if (l == 0) plain_bytes = b;
    const bool known = b >= 0 && plain_bytes > 0;
    table.push_back({layouts[l].name, layouts[l].what, b < 0 ? "n/a" : fixed(b / 1e6, 2),
                     known ? fixed(b / plain_bytes, 2) : "n/a", fixed(t * 1e3, 1)});
    report.rows.push_back({{"layout", layouts[l].name},
                           {"unit_bytes", S},
                           {"hosts", N},
                           {"ranks_per_host", G},
                           {"bytes_across_hosts_per_rank", b},
                           {"of_plain", known ? b / plain_bytes : -1},
                           {"seconds", t}});
    summary[layouts[l].name] = b;
  }
  report.headline.extra["across_hosts"] = summary;
  if (!root) return;
  std::printf("\nacross hosts: one step's collectives for a unit of %zu MiB fp32 weights at %d hosts x %d ranks "
              "(median of %d; bytes from the hosts' link counters, per rank)\n",
              S >> 20, N, G, reps);
  std::printf("%-7s %-48s %12s %9s %8s\n", "layout", "what", "MB sent", "of plain", "ms");
  for (const auto& row : table)
    std::printf("%-7s %-48s %12s %9s %8s\n", row[0].c_str(), row[1].c_str(), row[2].c_str(), row[3].c_str(),
                row[4].c_str());
}

}  // namespace ferry::bench
