// The callback engine on GPU memory (src/core/engine.cpp with src/cuda/cuda_runner.cu
// on the host-staged transport, or NCCL's on fake_nccl.cpp, which never
// makes the host wait for a bucket's packing) over real MPI, on the device memory of
// fake_cudart.cpp, whose streams run work late and in random legal orders.
// Each iteration "computes" every gradient on the compute stream (the
// legacy default, as nnabla-ext-cuda does) in a random order of its own,
// marking each ready as soon as its work is enqueued; after finish() the
// gradients are read on the compute stream and compared with the sum over
// ranks. A missing event wait anywhere (gradient to pack, pack to copy,
// unpack to the compute stream) shows up as wrong data. Every other plan
// runs with the NaN/infinity check on (check_finite): in two of its
// iterations one rank's gradients hold a NaN or an infinity (in buckets
// packed and in buckets reduced in place), and finish() must fail on
// every rank naming that rank and those tensors; in the others, the
// gradients must come out as unchecked.
//
// Built and run under mpiexec by tests/test_gpu_path_emulated.py
// (`engine_over_mpi SEED [nccl]`); prints
// "engine_over_mpi: N checks passed on R ranks" on rank 0, or the first
// failure (exit 1 on every rank, through MPI_Abort).
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fake_cudart.hpp"
#include "fake_nccl.hpp"
#include "mpi_program.hpp"
#include "nncomm/core/bucket_plan.hpp"
#include "nncomm/cuda/cuda_runner.hpp"
#include "nncomm/transports/staged_transport.hpp"
#include "nncomm/core/engine.hpp"
#include "nncomm/host/elementwise.hpp"
#include "nncomm/transports/mpi_transport.hpp"
#include "nncomm/transports/nccl_transport.hpp"

using namespace nncomm;
using namespace program;

namespace {

// Element i of tensor t on rank r in iteration k: small integers, so that
// every sum is exact and only the final division rounds.
float input(int r, size_t t, size_t i, int k) {
  return float((r + 1 + k) * (int((i + t) % 5) + 1));
}

// `v` rounded to `dt` and read back as a float.
float in_dtype(float v, DType dt) {
  char bytes[8];
  convert_scaled(bytes, dt, &v, DType::kFloat32, 1, 1.0f, 1);
  float back = 0;
  convert_scaled(&back, DType::kFloat32, bytes, dt, 1, 1.0f, 1);
  return back;
}

// The tensors holding a NaN or an infinity on rank `bad` in iteration `k`
// of a checked plan of `n` tensors (none in even iterations): one, and
// `large` (a float32 tensor reduced in place, if the plan has one) too.
std::vector<size_t> spoiled(int k, size_t n, size_t large, int *bad) {
  *bad = k % ranks;
  if (k % 2 == 0)
    return {};
  std::vector<size_t> tensors{size_t(k * 7) % n};
  if (large < n && large != tensors[0])
    tensors.push_back(large);
  std::sort(tensors.begin(), tensors.end());
  return tensors;
}

// Whether finish()'s outcome in a spoiled iteration is the check's finding
// on every rank: NonFinite, naming rank `bad` and `tensors` only.
void expect_finding(Engine &engine, const Status &outcome, int bad,
                    const std::vector<size_t> &tensors,
                    const std::string &where) {
  if (outcome.code() != StatusCode::kNonFinite)
    fail(where + ": finish() gave " + outcome.message() +
         ", not the NaN/infinity finding");
  const std::vector<NonFiniteTensors> found = engine.nonfinite();
  if (found.size() != 1 || found[0].rank != bad ||
      found[0].count != tensors.size() || found[0].tensors != tensors) {
    std::string got;
    for (const NonFiniteTensors &f : found) {
      got += " rank " + std::to_string(f.rank) + ":";
      for (size_t t : f.tensors)
        got += " " + std::to_string(t);
    }
    fail(where + ": the finding is" + got + ", expected rank " +
         std::to_string(bad) + " with " + std::to_string(tensors.size()) +
         " tensors");
  }
}

struct Gradient {
  size_t count;
  DType dtype;
  char *device = nullptr;
  char *host = nullptr; // pinned: what the compute stream copies from/to
};

bool over_nccl = false; // the transport: NCCL's, else the host-staged one

// The device transport the engine runs on (`*device`: the same).
std::unique_ptr<Transport> device_transport(DeviceTransport **device) {
  std::unique_ptr<MpiTransport> mpi;
  ok(MpiTransport::Create(MPI_COMM_WORLD, &mpi), "MpiTransport::Create");
  if (over_nccl) {
    std::unique_ptr<NcclTransport> transport;
    ok(NcclTransport::Create(fake_nccl(), std::move(mpi), &transport),
       "NcclTransport::Create");
    *device = transport.get();
    return transport;
  }
  std::unique_ptr<StagedTransport> transport;
  ok(StagedTransport::Create(std::move(mpi), &transport), "StagedTransport");
  *device = transport.get();
  return transport;
}

void run(uint64_t seed) {
  std::mt19937_64 rng(seed); // the same on every rank: the same plan
  const size_t n = 3 + rng() % 10;
  std::vector<Gradient> grads(n);
  std::vector<TensorSpec> specs;
  for (Gradient &g : grads) {
    g.count = 1 + rng() % 3000;
    g.dtype = rng() % 3 == 0 ? DType::kFloat16 : DType::kFloat32;
    const size_t bytes = g.count * dtype_size(g.dtype);
    cuda(cudaMalloc(reinterpret_cast<void **>(&g.device), bytes), "cudaMalloc");
    cuda(cudaMallocHost(reinterpret_cast<void **>(&g.host), bytes),
         "cudaMallocHost");
    specs.push_back({g.count, g.dtype});
  }
  std::vector<size_t> order(n);
  for (size_t t = 0; t < n; ++t)
    order[t] = n - 1 - t;
  const size_t pack_size = 64 + rng() % 4000;
  const bool keep_dtype = rng() % 2 == 0;
  // Some float32 gradients large enough to go direct.
  const size_t direct_bytes = 4 * 1500;
  std::vector<Bucket> plan = plan_buckets(specs, order, pack_size, keep_dtype,
                                          DType::kFloat32, direct_bytes);

  DeviceTransport *device = nullptr;
  std::unique_ptr<Transport> transport = device_transport(&device);
  std::unique_ptr<CudaRunner> runner;
  ok(CudaRunner::Create(*device, nullptr, &runner), "CudaRunner::Create");
  Engine engine(std::move(transport), std::move(runner), n, 20);
  size_t planned = 0;
  ok(engine.add_plan(plan, &planned), "add_plan");

  // A float32 tensor of a direct bucket: checked in place, not packed.
  size_t large = n;
  for (const Bucket &b : plan) {
    if (b.direct && b.dtype == DType::kFloat32 &&
        grads[b.segments[0].tensor].dtype == DType::kFloat32)
      large = b.segments[0].tensor;
  }
  const bool check = seed % 2 == 1;
  std::mt19937_64 mine(seed * 977 + rank); // each rank's own order
  const float scale = 0.5f;
  for (int k = 0; k < 4; ++k) {
    ok(engine.begin(0, scale, ranks, check), "begin");
    int bad = 0;
    const std::vector<size_t> tensors =
        check ? spoiled(k, n, large, &bad) : std::vector<size_t>();
    std::vector<size_t> finished(n);
    for (size_t t = 0; t < n; ++t)
      finished[t] = t;
    std::shuffle(finished.begin(), finished.end(), mine);
    for (size_t t : finished) {
      Gradient &g = grads[t];
      std::vector<float> values(g.count);
      for (size_t i = 0; i < g.count; ++i)
        values[i] = input(rank, t, i, k);
      if (rank == bad &&
          std::find(tensors.begin(), tensors.end(), t) != tensors.end()) {
        values[(t * 31 + k) % g.count] =
            k == 1 ? std::numeric_limits<float>::quiet_NaN()
                   : -std::numeric_limits<float>::infinity();
      }
      // The previous read of `host` is done (it was synchronised).
      convert_scaled(g.host, g.dtype, values.data(), DType::kFloat32, g.count,
                     1.0f, 1);
      cuda(cudaMemcpyAsync(g.device, g.host, g.count * dtype_size(g.dtype),
                           cudaMemcpyHostToDevice, nullptr),
           "compute");
      engine.mark_ready(t, g.device, g.dtype);
    }
    const Status outcome = engine.finish();
    const std::string where =
        "seed " + std::to_string(seed) + ", iteration " + std::to_string(k);
    if (!tensors.empty()) {
      expect_finding(engine, outcome, bad, tensors, where);
      ++checks;
      // The gradients were reduced all the same, NaN and all; the next
      // iteration rewrites `host` once the compute stream is done with it.
      cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
      continue;
    }
    ok(outcome, "finish");
    for (size_t t = 0; t < n; ++t) {
      Gradient &g = grads[t];
      cuda(cudaMemcpyAsync(g.host, g.device, g.count * dtype_size(g.dtype),
                           cudaMemcpyDeviceToHost, nullptr),
           "read back");
    }
    cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
    for (size_t t = 0; t < n; ++t) {
      const Gradient &g = grads[t];
      std::vector<float> got(g.count);
      convert_scaled(got.data(), DType::kFloat32, g.host, g.dtype, g.count,
                     1.0f, 1);
      for (size_t i = 0; i < g.count; ++i) {
        float sum = 0;
        for (int r = 0; r < ranks; ++r)
          sum += input(r, t, i, k) * scale;
        float mean = sum;
        convert_scaled(&mean, DType::kFloat32, &sum, DType::kFloat32, 1, 1.0f,
                       ranks);
        if (got[i] != in_dtype(mean, g.dtype)) {
          fail("seed " + std::to_string(seed) + ", iteration " +
               std::to_string(k) + ": gradient " + std::to_string(t) +
               " element " + std::to_string(i) + " is " +
               std::to_string(got[i]) + ", expected " +
               std::to_string(in_dtype(mean, g.dtype)));
        }
      }
      ++checks;
    }
  }
  cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (Gradient &g : grads) {
    cudaFree(g.device);
    cudaFreeHost(g.host);
  }
}

} // namespace

int main(int argc, char **argv) {
  start(&argc, &argv);
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  over_nccl = argc > 2 && std::string(argv[2]) == "nccl";
  nncomm_fake_configure(seed * 131 + rank, 3);
  cuda(cudaSetDevice(rank % 2), "cudaSetDevice");
  for (uint64_t s = 0; s < 5; ++s)
    run(seed * 100 + s);
  if (nncomm_fake_pending() != 0)
    fail("work left pending on the fake device");
  if (rank == 0)
    std::printf("engine_over_mpi: %zu checks passed on %d ranks\n", checks,
                ranks);
  MPI_Finalize();
  return 0;
}
