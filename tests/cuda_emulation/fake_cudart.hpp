// Controls of the CPU-side CUDA runtime (fake_cudart.cpp) for the programs
// that test with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include <cuda_runtime.h>

// Seeds the order in which pending work runs; 1 in `eagerness` runtime
// calls lets some of it run, so larger is later.
void nncomm_fake_configure(uint64_t seed, unsigned eagerness);
// Makes runtime call `call` fail once, after `after` more calls of it
// succeed: cudaMalloc, cudaMallocHost, cudaLaunchKernel,
// cudaStreamCreateWithFlags or cudaEventCreateWithFlags.
void nncomm_fake_fail(const char *call, int after);
// Holds `stream`: its later work runs only once no other work can (as a
// long kernel would hold it on a GPU).
void nncomm_fake_hold(cudaStream_t stream);
// Kernels launched so far.
size_t nncomm_fake_launches();
// cudaMemcpyAsync calls so far.
size_t nncomm_fake_copies();
// Device memory allocated (cudaMalloc) and not freed, in bytes; what
// cudaIpcOpenMemHandle maps is not counted.
size_t nncomm_fake_device_bytes();
// Work enqueued and not yet run.
size_t nncomm_fake_pending();
// Enqueues `work` on `stream` as a kernel would be: it runs when its turn
// comes in the random legal order (the fake NCCL's collectives).
cudaError_t nncomm_fake_enqueue(cudaStream_t stream,
                                std::function<void()> work);
// Enqueues `start` as nncomm_fake_enqueue does, followed on the stream by
// a wait that ends once `finished()` returns true, asked whenever the
// runtime may progress: a collective waiting for other processes, which
// may never come (the host's waits on the stream then wait too, as a GPU's).
cudaError_t nncomm_fake_enqueue_until(cudaStream_t stream,
                                      std::function<void()> start,
                                      std::function<bool()> finished);
