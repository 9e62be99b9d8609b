// DeviceOps' fused ops by default: the sequence of plain ops they stand for
// (nn/device_ops.h). A device with a faster fused path overrides them.
#include <stdexcept>
#include <string>

#include "nn/device_ops.h"

namespace ferry::nn {

void DeviceOps::linear_forward(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& bias,
                               const Tensor& pre) {
  if (pre.defined() && (pre.shape() != out.shape() || pre.dtype() != out.dtype())) {
    throw std::invalid_argument("linear_forward: pre " + pre.describe() + " is not shaped as out " + out.describe());
  }
  const Tensor& y = pre.defined() ? pre : out;
  gemm(y, x, false, w, true, 1.0, 0.0);
  if (bias.defined()) add_bias(y, bias);
  if (pre.defined()) gelu_forward(out, pre);
}

}  // namespace ferry::nn
