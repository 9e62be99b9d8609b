// NCCL in a build without it: unavailable, and saying why.
#include "comm/nccl_communicator.h"

namespace ferry::comm {
FERRY_NCCL_ABI_BEGIN

NcclStatus nccl_status() {
  return {false, "this build of ferry has no NCCL (the CUDA toolkit or NCCL was not found when it was configured)"};
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(MpiCommunicator&, void*, double) {
  throw CommError(nccl_status().reason);
}

FERRY_NCCL_ABI_END
}  // namespace ferry::comm
