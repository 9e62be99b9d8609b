// Attention v2 backward: until its mma.sync passes land, the wmma tensor-core passes.
#include "nn/cuda/attention_mma.cuh"

namespace ferry::nn::cuda {
FERRY_CUDA_ABI_BEGIN
namespace detail {

void attention_backward_mma(cudaStream_t st, Arr dqkv, Arr dout, Arr qkv, Arr out, Arr lse, const AttnShape& sh,
                            int64_t B, const int32_t* doc_start, void* rowdot) {
  attention_backward_tc(st, dqkv, dout, qkv, out, lse, sh, B, doc_start, rowdot);
}

}  // namespace detail
FERRY_CUDA_ABI_END
}  // namespace ferry::nn::cuda
