// The CUDA devices this process sees, asked of the CUDA runtime the
// package was built with (a build without nvcc says so instead).
#pragma once

#include "nncomm/status.hpp"

namespace nncomm {

// Sets `*count` to the number of CUDA devices visible; fails with the
// runtime's reason when there is none to see (no driver, no device).
Status cuda_device_count(int *count);

} // namespace nncomm
