#include "comm/shm_collectives.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "comm/work.h"

namespace ferry::comm {

namespace {

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw CommError(std::string(what) + " failed: " + std::string(msg, static_cast<size_t>(len)));
  }
}

}  // namespace

ShmCollectives::ShmCollectives(MPI_Comm comm, size_t window_bytes) {
  check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  MPI_Comm node;
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  if (node_size != size_) {
    MPI_Comm_free(&comm_);
    throw CommError("shared-memory collectives need every rank on one node (" + std::to_string(node_size) + " of " +
                    std::to_string(size_) + " here)");
  }
  floats_ = std::max<size_t>(window_bytes / 4 / 16 * 16, 16);
  float* mine = nullptr;
  check(MPI_Win_allocate_shared(static_cast<MPI_Aint>(floats_ * 4), 4, MPI_INFO_NULL, comm_, &mine, &win_),
        "MPI_Win_allocate_shared");
  segments_.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    MPI_Aint bytes = 0;
    int disp = 0;
    check(MPI_Win_shared_query(win_, r, &bytes, &disp, &segments_[static_cast<size_t>(r)]), "MPI_Win_shared_query");
  }
  check(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), "MPI_Win_lock_all");
}

ShmCollectives::~ShmCollectives() {
  if (win_ != MPI_WIN_NULL) {
    MPI_Win_unlock_all(win_);
    MPI_Win_free(&win_);
  }
  MPI_Comm_free(&comm_);
}

// Makes this rank's stores visible to the others and theirs to this one (the MPI-3
// shared-memory synchronisation idiom: sync, barrier, sync).
#define FERRY_SHM_FENCE()                         \
  do {                                            \
    MPI_Win_sync(win_);                           \
    check(MPI_Barrier(comm_), "MPI_Barrier");     \
    MPI_Win_sync(win_);                           \
  } while (0)

void ShmCollectives::reduce_scatter_sum(const float* send, float* recv, size_t count) {
  // Each chunk moves `c` elements of every rank's slice: the window holds size * c.
  const size_t per = floats_ / static_cast<size_t>(size_);
  float* mine = segments_[static_cast<size_t>(rank_)];
  for (size_t c0 = 0; c0 < count; c0 += per) {
    const size_t c = std::min(per, count - c0);
    for (int r = 0; r < size_; ++r) {
      std::memcpy(mine + static_cast<size_t>(r) * c, send + static_cast<size_t>(r) * count + c0, c * 4);
    }
    FERRY_SHM_FENCE();
    float* out = recv + c0;
    const size_t at = static_cast<size_t>(rank_) * c;
    std::memcpy(out, segments_[0] + at, c * 4);
    for (int r = 1; r < size_; ++r) {
      const float* in = segments_[static_cast<size_t>(r)] + at;
#pragma omp simd
      for (size_t i = 0; i < c; ++i) out[i] += in[i];
    }
    FERRY_SHM_FENCE();  // nobody overwrites a segment another rank is still reading
  }
}

void ShmCollectives::all_gather(const float* send, float* recv, size_t count) {
  float* mine = segments_[static_cast<size_t>(rank_)];
  for (size_t c0 = 0; c0 < count; c0 += floats_) {
    const size_t c = std::min(floats_, count - c0);
    std::memcpy(mine, send + c0, c * 4);
    FERRY_SHM_FENCE();
    for (int r = 0; r < size_; ++r) {
      std::memcpy(recv + static_cast<size_t>(r) * count + c0, segments_[static_cast<size_t>(r)], c * 4);
    }
    FERRY_SHM_FENCE();
  }
}

}  // namespace ferry::comm
