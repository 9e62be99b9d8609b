// An emulation of the NCCL calls comm/nccl_communicator.cpp makes (tests only,
// FERRY_CUDA_EMULATION, with testing/cuda_emulation.h): collectives between the ranks of
// an MPI job, so `mpiexec -n 2..4` runs the real communicator. Each collective is queued
// on its stream like any GPU work (testing/emu_device.h) and, when it runs, copies its
// device buffers to host memory, moves them over MPI with the emulator's lock released
// (other threads and ranks progress meanwhile), and copies the result back. Strict where
// NCCL is: buffers must be device memory inside one allocation (host buffers are an
// invalid argument), reductions only on numeric types, counts in elements. Sums follow
// MPI's order, which is fixed for a given world size.
// ncclCommInitRank splits MPI_COMM_WORLD by the unique id, so every rank of the world
// must call it together (ferry's trainer does).
#pragma once

#include <mpi.h>

#include <cstring>
#include <random>

#include "testing/cuda_emulation.h"

struct ncclUniqueId {
  char internal[128];
};
struct ferry_emu_nccl {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 1;
  bool aborted = false;
};
using ncclComm_t = ferry_emu_nccl*;
enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5
};
enum ncclDataType_t { ncclInt32, ncclUint8, ncclFloat16, ncclFloat32, ncclFloat64 };
enum ncclRedOp_t { ncclSum, ncclAvg };

namespace ferry_emu {

inline size_t nccl_size(ncclDataType_t t) {
  switch (t) {
    case ncclUint8:
      return 1;
    case ncclFloat16:
      return 2;
    case ncclInt32:
    case ncclFloat32:
      return 4;
    case ncclFloat64:
      return 8;
  }
  return 1;
}

inline MPI_Datatype nccl_mpi_type(ncclDataType_t t) {
  switch (t) {
    case ncclInt32: return MPI_INT32_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;  // not reducible here
  }
}

inline thread_local std::string nccl_last_error;

inline ncclResult_t nccl_invalid(const std::string& why) {
  nccl_last_error = why;
  return ncclInvalidArgument;
}

// Queues a collective: `send_bytes` from `send` are staged out, `transport` maps the staged
// input to the staged output (`recv_bytes`), which lands in `recv`.
inline ncclResult_t nccl_enqueue(const char* what, const void* send, size_t send_bytes, void* recv,
                                 size_t recv_bytes, cudaStream_t s,
                                 std::function<void(const std::vector<char>&, std::vector<char>&)> transport) {
  auto& e = emu();
  std::unique_lock<std::mutex> lock(e.mu);
  if ((send_bytes && !e.device_range(send, send_bytes)) || (recv_bytes && !e.device_range(recv, recv_bytes)))
    return nccl_invalid(std::string(what) + ": a buffer is not device memory (or overruns its allocation)");
  auto in = std::make_shared<std::vector<char>>();
  auto out = std::make_shared<std::vector<char>>(recv_bytes);
  Op op;
  op.what = what;
  op.run = [=] { in->assign(static_cast<const char*>(send), static_cast<const char*>(send) + send_bytes); };
  op.transport = [=] { transport(*in, *out); };
  op.finish = [=] {
    if (recv_bytes) std::memcpy(recv, out->data(), recv_bytes);
  };
  e.enqueue(lock, stream_of(s), std::move(op));
  return ncclSuccess;
}

inline void mpi_check(int rc, const char* call) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string("nccl emulation: ") + call + " failed");
}

// Sum or average `count` elements of `t` in place (avg divides after the sum, as NCCL's
// ncclAvg on floating types does to within rounding).
inline void nccl_reduce(ferry_emu_nccl* c, ncclDataType_t t, ncclRedOp_t op, const std::vector<char>& in,
                        std::vector<char>& out, bool scatter) {
  const MPI_Datatype mt = nccl_mpi_type(t);
  if (scatter) {
    mpi_check(MPI_Reduce_scatter_block(in.data(), out.data(), static_cast<int>(out.size() / nccl_size(t)), mt,
                                       MPI_SUM, c->mpi),
              "MPI_Reduce_scatter_block");
  } else {
    mpi_check(MPI_Allreduce(in.data(), out.data(), static_cast<int>(out.size() / nccl_size(t)), mt, MPI_SUM, c->mpi),
              "MPI_Allreduce");
  }
  if (op != ncclAvg) return;
  const size_t n = out.size() / nccl_size(t);
  if (t == ncclFloat32) {
    auto* p = reinterpret_cast<float*>(out.data());
    for (size_t i = 0; i < n; ++i) p[i] /= static_cast<float>(c->size);
  } else if (t == ncclFloat64) {
    auto* p = reinterpret_cast<double*>(out.data());
    for (size_t i = 0; i < n; ++i) p[i] /= c->size;
  }
}

}  // namespace ferry_emu

inline const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
  }
  return "unknown result";
}
inline const char* ncclGetLastError(ncclComm_t) {
  return ferry_emu::nccl_last_error.c_str();
}
inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::random_device rd;
  for (char& c : id->internal) c = static_cast<char>(rd());
  return ncclSuccess;
}
inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  int world = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (nranks < 1 || rank < 0 || rank >= nranks) return ferry_emu::nccl_invalid("ncclCommInitRank: rank outside the communicator");
  uint32_t color = 0;
  for (char c : id.internal) color = color * 131u + static_cast<unsigned char>(c);
  auto* c = new ferry_emu_nccl();
  ferry_emu::mpi_check(MPI_Comm_split(MPI_COMM_WORLD, static_cast<int>(color & 0x3fffffff), rank, &c->mpi),
                       "MPI_Comm_split");
  MPI_Comm_size(c->mpi, &c->size);
  MPI_Comm_rank(c->mpi, &c->rank);
  if (c->size != nranks || c->rank != rank) {
    MPI_Comm_free(&c->mpi);
    delete c;
    return ferry_emu::nccl_invalid("ncclCommInitRank: the ranks joining do not match nranks");
  }
  (void)world;
  (void)me;
  *comm = c;
  return ncclSuccess;
}
inline ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  cudaDeviceSynchronize();
  if (!c->aborted) MPI_Comm_free(&c->mpi);
  delete c;
  return ncclSuccess;
}
inline ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (c) c->aborted = true;  // MPI_Abort follows in ferry; the MPI communicator is left as is
  return ncclSuccess;
}
inline ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* r) {
  *r = ncclSuccess;
  return ncclSuccess;
}
inline ncclResult_t ncclGroupStart() {
  return ncclSuccess;
}
inline ncclResult_t ncclGroupEnd() {
  return ncclSuccess;
}
inline ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c,
                                  cudaStream_t st) {
  if (!c) return ncclInvalidArgument;
  const size_t b = n * ferry_emu::nccl_size(t);
  return ferry_emu::nccl_enqueue("ncclAllGather", s, b, r, b * static_cast<size_t>(c->size), st,
                                 [c, b](const std::vector<char>& in, std::vector<char>& out) {
                                   if (c->size == 1) return std::memcpy(out.data(), in.data(), b), void();
                                   ferry_emu::mpi_check(MPI_Allgather(in.data(), static_cast<int>(b), MPI_BYTE, out.data(),
                                                                      static_cast<int>(b), MPI_BYTE, c->mpi),
                                                        "MPI_Allgather");
                                 });
}
inline ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                      ncclComm_t c, cudaStream_t st) {
  if (!c) return ncclInvalidArgument;
  if (ferry_emu::nccl_mpi_type(t) == MPI_DATATYPE_NULL) return ferry_emu::nccl_invalid("ncclReduceScatter: type not reducible here");
  const size_t b = n * ferry_emu::nccl_size(t);
  return ferry_emu::nccl_enqueue("ncclReduceScatter", s, b * static_cast<size_t>(c->size), r, b, st,
                                 [c, t, op](const std::vector<char>& in, std::vector<char>& out) {
                                   ferry_emu::nccl_reduce(c, t, op, in, out, true);
                                 });
}
inline ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                  ncclComm_t c, cudaStream_t st) {
  if (!c) return ncclInvalidArgument;
  if (ferry_emu::nccl_mpi_type(t) == MPI_DATATYPE_NULL) return ferry_emu::nccl_invalid("ncclAllReduce: type not reducible here");
  const size_t b = n * ferry_emu::nccl_size(t);
  return ferry_emu::nccl_enqueue("ncclAllReduce", s, b, r, b, st,
                                 [c, t, op](const std::vector<char>& in, std::vector<char>& out) {
                                   ferry_emu::nccl_reduce(c, t, op, in, out, false);
                                 });
}
inline ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                                  cudaStream_t st) {
  if (!c) return ncclInvalidArgument;
  if (root < 0 || root >= c->size) return ferry_emu::nccl_invalid("ncclBroadcast: root outside the communicator");
  const size_t b = n * ferry_emu::nccl_size(t);
  return ferry_emu::nccl_enqueue("ncclBroadcast", s, c->rank == root ? b : 0, r, b, st,
                                 [c, b, root](const std::vector<char>& in, std::vector<char>& out) {
                                   if (c->rank == root) std::memcpy(out.data(), in.data(), b);
                                   ferry_emu::mpi_check(MPI_Bcast(out.data(), static_cast<int>(b), MPI_BYTE, root, c->mpi),
                                                        "MPI_Bcast");
                                 });
}
