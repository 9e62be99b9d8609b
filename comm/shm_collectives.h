// Node-local collectives through an MPI-3 shared-memory window (MPI_Win_allocate_shared):
// every rank of a node maps every other rank's segment, so a reduce-scatter is one copy of
// the input into the window, a barrier, each rank summing its own slice over all segments
// (vectorised, in rank order, so every rank computes the same bits), and a barrier. MPICH's
// MPI_Reduce_scatter_block on one node moves the data through its shared-memory transport
// in several rounds instead (about 2 GB/s for 64 MiB on 2 ranks, against ~30 GB/s of
// memory bandwidth).
//
// Contract: every rank of `comm` is on one node (MPI_COMM_TYPE_SHARED); calls are
// collective; f32 only; inputs larger than the window go through it in chunks.
// Threads: one caller at a time; not to be mixed with queued collectives in flight on the
// same communicator (it calls MPI directly on the caller's thread).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

namespace ferry::comm {

class ShmCollectives {
 public:
  // window_bytes: each rank's segment. Throws CommError when the ranks are not all on one
  // node or the window cannot be allocated.
  ShmCollectives(MPI_Comm comm, size_t window_bytes);
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  // recv[count] = sum over ranks r of send_r[rank * count + i]; send holds size * count.
  void reduce_scatter_sum(const float* send, float* recv, size_t count);
  // recv[size * count] = every rank's send[count], in rank order.
  void all_gather(const float* send, float* recv, size_t count);

 private:
  MPI_Comm comm_;
  MPI_Win win_ = MPI_WIN_NULL;
  int rank_ = 0, size_ = 1;
  size_t floats_ = 0;             // per segment
  std::vector<float*> segments_;  // every rank's segment, mapped here
};

}  // namespace ferry::comm
