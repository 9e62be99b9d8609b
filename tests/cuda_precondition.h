// The precondition of the tests that need a GPU: skipped, with cuda_status()'s reason,
// where the cuda device is unavailable (no GPU, no driver, or a build without CUDA).
#pragma once

#include <boost/test/unit_test.hpp>

#include "nn/cuda_device.h"

namespace ferry::test {

struct CudaPresent {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    const nn::CudaStatus s = nn::cuda_status();
    boost::test_tools::assertion_result r(s.available());
    if (!s.available()) r.message() << "the cuda device is unavailable: " << s.reason;
    return r;
  }
};

}  // namespace ferry::test
