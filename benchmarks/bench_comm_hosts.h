// ferry bench comm at two or more hosts: the bytes each rank sends between hosts in one
// step's collectives under the three ZeRO-3 layouts (plain, hybrid sharding with a shard
// group per host, hpZ with a node copy per host), read from the hosts' own link counters.
#pragma once

#include "benchmarks/bench_report.h"
#include "comm/mpi_communicator.h"

namespace ferry::bench {

// Collective over `world`. Where the ranks sit on one host, or on hosts holding unequal or
// non-contiguous rank ranges, prints why and adds nothing. Else prints a table on rank 0
// and adds one row per layout to report.rows ({"layout", ...}) and
// report.headline.extra["across_hosts"].
void run_host_layouts(comm::MpiCommunicator& world, bool quick, Report& report);

// This host's bytes sent so far on its network links: every interface but loopback in
// /proc/net/dev (the calling process's network namespace), plus InfiniBand ports'
// port_xmit_data where present (in 4-byte words, so times 4). -1 when neither is readable.
long long host_link_tx_bytes();

}  // namespace ferry::bench
