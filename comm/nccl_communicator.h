// The NCCL backend for device buffers: collectives between GPUs, one GPU per rank.
//
// Setup (collective over an MPI communicator): the rank's GPU is chosen by
// comm/gpu_binding.h (its local rank where it sees every GPU of the node, the one GPU it
// sees under a per-rank binding; otherwise an error naming both counts), and two ranks of
// a node on one GPU (same PCI bus id) are refused on every rank; rank 0 makes the
// NCCL unique id and broadcasts it over MPI; every rank joins with ncclCommInitRank under
// the watchdog, so a rank that never arrives ends the job instead of hanging it.
// Ordering: collectives run on the communicator's own stream. Each one first makes that
// stream wait, through an event, for the work already issued on `order_after` (the cuda
// device's compute stream: the gradients it wrote), and order_before(stream) makes a
// consumer stream wait for the collectives issued so far: events both ways, never a host
// synchronization on the hot path. A Work completes when its event has fired (a poller
// thread watches them), so Work::wait() is still available to host code.
// Host buffers (a loss, a gradient norm) are accepted too: they are staged through device
// memory, and a host receive buffer makes the call wait for the collective.
// Consumers that run on the GPU need not wait on the host: orders_on_device() is true
// and order_consumer(work) makes `order_after` wait for that collective's event (recorded
// after it on the NCCL stream; events come from a pool), not for collectives issued later
// (PendingCollective::finish does this).
// Errors: NCCL's asynchronous errors fail every pending Work with NCCL's text and end the
// job (MPI_Abort, after ncclCommAbort): nobody may be waiting on the host to see them; a
// collective older than the timeout makes the watchdog report it (operation, sequence,
// recent collectives), abort the NCCL communicator (its kernels return) and end the job
// with MPI_Abort: the MPI backend's behaviour.
// Thread safety: issue collectives from one thread (the Communicator contract).
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"

// Tests build this backend against an emulation of NCCL (FERRY_CUDA_EMULATION); its
// symbols then live in an inline namespace, beside the real ones or the stub.
#ifdef FERRY_CUDA_EMULATION
#define FERRY_NCCL_ABI_BEGIN inline namespace emulated {
#define FERRY_NCCL_ABI_END }
#else
#define FERRY_NCCL_ABI_BEGIN
#define FERRY_NCCL_ABI_END
#endif

namespace ferry::comm {
FERRY_NCCL_ABI_BEGIN

struct NcclStatus {
  bool built = false;
  std::string reason;  // "" when NCCL can be used here
};
NcclStatus nccl_status();

class NcclCommunicator : public Communicator {
 public:
  // Collective over `world`. `order_after` is a cudaStream_t (may be null).
  static std::unique_ptr<NcclCommunicator> create(MpiCommunicator& world, void* order_after,
                                                  double timeout_s);
  ~NcclCommunicator() override = default;
  std::string name() const override { return "nccl"; }
  virtual int gpu() const = 0;
  // `stream` (a cudaStream_t) waits for every collective issued so far.
  virtual void order_before(void* stream) = 0;
};

FERRY_NCCL_ABI_END
}  // namespace ferry::comm
