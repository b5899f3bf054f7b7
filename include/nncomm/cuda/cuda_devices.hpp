// The CUDA devices this process sees, asked of the CUDA runtime the
// package was built with (a build without nvcc says so instead).
#pragma once

#include "nncomm/core/status.hpp"

namespace nncomm {

// Sets `*count` to the number of CUDA devices visible; fails with the
// runtime's reason when there is none to see (no driver, no device).
Status cuda_device_count(int *count);

// The device holding `ptr`, which must be device memory.
Status cuda_device_of(const void *ptr, int *device);

// Makes the device holding `ptr` (device memory) current for the calling
// thread, in this module's CUDA runtime (linked statically, so not the
// framework's: each keeps its own current device).
Status cuda_use_device_of(const void *ptr);

// The error of every CUDA entry point in a build without nvcc.
Status built_without_cuda();

} // namespace nncomm
