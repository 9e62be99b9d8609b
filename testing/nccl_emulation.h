// An emulation of the NCCL calls comm/nccl_communicator.cpp makes, for one rank on the
// CPU (tests only, FERRY_CUDA_EMULATION, with testing/cuda_emulation.h): with one rank every
// collective is a copy (or nothing, in place), which lets tests run the communicator's
// setup, ordering and completion code and the trainer's GPU path without a GPU.
// More than one rank is refused: the emulation has no transport.
#pragma once

#include <cstring>

#include "testing/cuda_emulation.h"

struct ncclUniqueId {
  char internal[128];
};
using ncclComm_t = struct ferry_emu_nccl*;
enum ncclResult_t { ncclSuccess = 0, ncclInvalidUsage = 5 };
enum ncclDataType_t { ncclInt32, ncclUint8, ncclFloat16, ncclFloat32, ncclFloat64 };
enum ncclRedOp_t { ncclSum, ncclAvg };

inline size_t ferry_emu_nccl_size(ncclDataType_t t) {
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

inline const char* ncclGetErrorString(ncclResult_t) {
  return "NCCL emulation error";
}
inline const char* ncclGetLastError(ncclComm_t) {
  return "";
}
inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof *id);
  return ncclSuccess;
}
inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int) {
  static int token;
  *comm = reinterpret_cast<ncclComm_t>(&token);
  return nranks == 1 ? ncclSuccess : ncclInvalidUsage;
}
inline ncclResult_t ncclCommDestroy(ncclComm_t) {
  return ncclSuccess;
}
inline ncclResult_t ncclCommAbort(ncclComm_t) {
  return ncclSuccess;
}
inline ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* r) {
  *r = ncclSuccess;
  return ncclSuccess;
}
// One rank: gathers, reductions and broadcasts all leave recv = send.
inline ncclResult_t ferry_emu_nccl_copy(const void* send, void* recv, size_t count,
                                        ncclDataType_t t) {
  if (send != recv && count > 0) std::memmove(recv, send, count * ferry_emu_nccl_size(t));
  return ncclSuccess;
}
inline ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t,
                                  cudaStream_t) {
  return ferry_emu_nccl_copy(s, r, n, t);
}
inline ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t t,
                                      ncclRedOp_t, ncclComm_t, cudaStream_t) {
  return ferry_emu_nccl_copy(s, r, n, t);
}
inline ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t,
                                  ncclComm_t, cudaStream_t) {
  return ferry_emu_nccl_copy(s, r, n, t);
}
inline ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t t, int,
                                  ncclComm_t, cudaStream_t) {
  return ferry_emu_nccl_copy(s, r, n, t);
}
