// The GPU transports over real MPI, on the device memory of
// fake_cudart.cpp, whose streams run work late and in random legal orders:
// the host-staged transport (src/transports/cuda_staged_transport.cu), the
// CUDA IPC transport (src/transports/cuda_ipc_transport.cu: the ranks'
// processes map each other's fake device memory) or the NCCL transport
// (src/transports/cuda_nccl_transport.cu) on fake_nccl.cpp. Every
// collective, with its inputs written by work still pending on the compute
// stream and its results read by work enqueued there afterwards, against a
// reference computed here. A missing wait between the compute stream and
// the transport's shows up as wrong data.
//
// Built and run under mpiexec by tests/test_gpu_path_emulated.py as
// `transports_over_mpi SEED staged|ipc|nccl|group`, or `transports_over_mpi
// SEED fail WHAT CALL RANK AFTER` (check_setup_failure), or
// `transports_over_mpi SEED ended` (check_ended_rank); prints
// "transports_over_mpi: N checks passed on R ranks" on rank 0, or the first
// failure (exit 1 on every rank, through MPI_Abort).
#include <cuda_runtime.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fake_cudart.hpp"
#include "mpi_program.hpp"
#include "fake_nccl.hpp"
#include "nncomm/collectives/list_collectives.hpp"
#include "nncomm/transports/ipc_transport.hpp"
#include "nncomm/transports/staged_transport.hpp"
#include "nncomm/cuda/device_arrays.hpp"
#include "nncomm/core/bucket_plan.hpp"
#include "nncomm/core/engine.hpp"
#include "nncomm/collectives/group.hpp"
#include "nncomm/transports/ended_ranks.hpp"
#include "nncomm/transports/nccl_transport.hpp"
#include "nncomm/host/elementwise.hpp"
#include "nncomm/observability/config.hpp"
#include "nncomm/transports/mpi_transport.hpp"
#include "nncomm/core/wait.hpp"

using namespace nncomm;
using namespace program;

namespace {

// On the device, ordered with stream `s`.
Placement on(CudaStream s) {
  Placement where;
  where.on_device = true;
  where.stream = s;
  return where;
}

// Element i of rank r's input: small integers, so every sum is exact in
// every dtype and the reference needs no rounding model.
double input(int r, size_t i) { return double((r + 1) * (int(i % 7) + 1)); }

// Writes `values` (as doubles) into memory of `dt`.
void store(char *dst, DType dt, const std::vector<double> &values) {
  std::vector<double> from(values);
  for (size_t i = 0; i < from.size(); ++i) {
    if (dt == DType::kInt32) {
      const int32_t v = int32_t(from[i]);
      std::memcpy(dst + 4 * i, &v, 4);
    } else if (dt == DType::kInt64) {
      const int64_t v = int64_t(from[i]);
      std::memcpy(dst + 8 * i, &v, 8);
    } else {
      convert_scaled(dst + i * dtype_size(dt), dt, &from[i], DType::kFloat64,
                     1, 1.0f, 1);
    }
  }
}

std::vector<double> load(const char *src, DType dt, size_t n) {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (dt == DType::kInt32) {
      int32_t v;
      std::memcpy(&v, src + 4 * i, 4);
      out[i] = v;
    } else if (dt == DType::kInt64) {
      int64_t v;
      std::memcpy(&v, src + 8 * i, 8);
      out[i] = v;
    } else {
      convert_scaled(&out[i], DType::kFloat64, src + i * dtype_size(dt), dt, 1,
                     1.0f, 1);
    }
  }
  return out;
}

// Device memory whose contents come from pinned host memory through the
// compute stream (legacy default), as a framework's kernels would write it.
struct DeviceArray {
  char *device = nullptr;
  char *host = nullptr;
  size_t n;
  DType dt;
  DeviceArray(size_t n, DType dt) : n(n), dt(dt) {
    const size_t bytes = std::max<size_t>(1, n * dtype_size(dt));
    cuda(cudaMalloc(reinterpret_cast<void **>(&device), bytes), "cudaMalloc");
    cuda(cudaMallocHost(reinterpret_cast<void **>(&host), bytes),
         "cudaMallocHost");
  }
  ~DeviceArray() {
    cudaDeviceSynchronize();
    cudaFree(device);
    cudaFreeHost(host);
  }
  void write(const std::vector<double> &values) {
    cudaStreamSynchronize(nullptr); // the previous read is done with `host`
    store(host, dt, values);
    cuda(cudaMemcpyAsync(device, host, n * dtype_size(dt),
                         cudaMemcpyHostToDevice, nullptr),
         "upload");
  }
  std::vector<double> read() {
    cuda(cudaMemcpyAsync(host, device, n * dtype_size(dt),
                         cudaMemcpyDeviceToHost, nullptr),
         "download");
    cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
    return load(host, dt, n);
  }
};

// `values` (exact in float) divided by `divisor` as convert_scaled rounds
// it, in float, then rounded to `dt`.
std::vector<double> divided_by(const std::vector<double> &values, int divisor,
                               DType dt) {
  if (divisor == 1)
    return values;
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    float v = float(values[i]);
    convert_scaled(&v, DType::kFloat32, &v, DType::kFloat32, 1, 1.0f, divisor);
    char rounded[8];
    convert_scaled(rounded, dt, &v, DType::kFloat32, 1, 1.0f, 1);
    out[i] = load(rounded, dt, 1)[0];
  }
  return out;
}

void expect(const std::vector<double> &got, const std::vector<double> &want,
            const std::string &what) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      fail(what + ": element " + std::to_string(i) + " is " +
           std::to_string(got[i]) + ", expected " + std::to_string(want[i]));
    }
  }
  ++checks;
}

// Runs the operation `start` opens, ordered with the compute stream (the
// legacy default) as a framework's collective is.
template <typename Start>
void run(DeviceTransport &t, const char *what, Start start) {
  WorkPtr work;
  ok(t.follow(nullptr), what);
  ok(start(&work), what);
  ok(wait_for(*work, rank == 0, nullptr), what);
  ok(t.lead(nullptr), what);
}

// Blocks of `count(me, r)` elements (sending) or `count(r, me)`
// (receiving) for each rank r, `gap` elements apart.
template <typename Count>
Blocks spaced(Count count, bool sending, int me, size_t gap) {
  Blocks b;
  size_t at = 0;
  for (int r = 0; r < ranks; ++r) {
    const size_t c = sending ? count(me, r) : count(r, me);
    b.counts.push_back(c);
    b.offsets.push_back(at);
    at += c + gap;
  }
  return b;
}

// The operations of blocks that differ in size, with gaps between the
// blocks, which must keep their -1s. alltoallv: rank q sends rank r
// ((q + 2r) % 3) * n elements (none to some), from blocks one element
// apart, into blocks two apart. allgatherv: rank q sends ((q + 1) % 3) * n.
void check_blocks(DeviceTransport &t, DType dt, size_t n,
                  const std::string &name) {
  const auto count = [n](int q, int r) { return size_t((q + 2 * r) % 3) * n; };
  const Blocks to = spaced(count, true, rank, 1);
  const Blocks from = spaced(count, false, rank, 2);
  DeviceArray sent(to.extent(), dt), got(from.extent() + 1, dt);
  std::vector<double> source(sent.n), want(got.n, -1.0);
  for (size_t j = 0; j < sent.n; ++j)
    source[j] = input(rank, j);
  for (int q = 0; q < ranks; ++q) {
    const Blocks theirs = spaced(count, true, q, 1);
    for (size_t i = 0; i < from.counts[q]; ++i)
      want[from.offsets[q] + i] = input(q, theirs.offsets[rank] + i);
  }
  sent.write(source);
  got.write(std::vector<double>(got.n, -1.0));
  run(t, "alltoallv", [&](WorkPtr *w) {
    return t.start_alltoallv(sent.device, to, got.device, from, dt, w);
  });
  expect(got.read(), want, name + "alltoallv");

  const auto share = [n](int q, int) { return size_t((q + 1) % 3) * n; };
  const Blocks all = spaced(share, false, rank, 2);
  DeviceArray mine(share(rank, 0), dt), gathered(all.extent(), dt);
  std::vector<double> values(mine.n), expected(gathered.n, -1.0);
  for (size_t i = 0; i < mine.n; ++i)
    values[i] = input(rank, i);
  for (int q = 0; q < ranks; ++q) {
    for (size_t i = 0; i < all.counts[q]; ++i)
      expected[all.offsets[q] + i] = input(q, i);
  }
  mine.write(values);
  gathered.write(std::vector<double>(gathered.n, -1.0));
  run(t, "allgatherv", [&](WorkPtr *w) {
    return t.start_allgatherv(mine.device, mine.n, gathered.device, all, dt,
                              w);
  });
  expect(gathered.read(), expected, name + "allgatherv");
}

void check_dtype(DeviceTransport &t, DType dt, size_t n) {
  const std::string name = "dtype " + std::to_string(int(dt)) + ", " +
                           std::to_string(n) + " elements: ";
  const bool floating = dtype_is_floating(dt);
  std::vector<double> mine(n), sum(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    mine[i] = input(rank, i);
    for (int r = 0; r < ranks; ++r)
      sum[i] += input(r, i);
  }
  DeviceArray a(n, dt);

  a.write(mine);
  run(t, "allreduce", [&](WorkPtr *w) {
    return t.start_allreduce(a.device, n, dt, 1.0f, 1, w);
  });
  expect(a.read(), sum, name + "allreduce");

  if (floating) {
    // Halved, summed, divided by the number of ranks (a sum of halves of
    // small integers is exact).
    std::vector<double> halves(n);
    for (size_t i = 0; i < n; ++i)
      halves[i] = sum[i] * 0.5;
    const std::vector<double> mean = divided_by(halves, ranks, dt);
    a.write(mine);
    run(t, "allreduce scaled", [&](WorkPtr *w) {
      return t.start_allreduce(a.device, n, dt, 0.5f, ranks, w);
    });
    expect(a.read(), mean, name + "allreduce scaled and divided");
  }

  // Floating reductions are also averaged (divided as convert_scaled
  // rounds); integer ones only summed.
  const int divisor = floating ? ranks : 1;
  const std::vector<double> divided = divided_by(sum, divisor, dt);
  for (int root = 0; root < ranks; ++root) {
    a.write(mine);
    run(t, "reduce", [&](WorkPtr *w) {
      return t.start_reduce(a.device, n, dt, root, divisor, w);
    });
    expect(a.read(), rank == root ? divided : mine, name + "reduce");

    std::vector<double> sent(n);
    for (size_t i = 0; i < n; ++i)
      sent[i] = input(root, i);
    a.write(rank == root ? sent : std::vector<double>(n, -1.0));
    run(t, "bcast", [&](WorkPtr *w) {
      return t.start_bcast(a.device, n, dt, root, w);
    });
    expect(a.read(), sent, name + "bcast");
  }

  DeviceArray all(n * ranks, dt);
  std::vector<double> gathered;
  for (int r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < n; ++i)
      gathered.push_back(input(r, i));
  }
  a.write(mine);
  all.write(std::vector<double>(n * ranks, -1.0));
  run(t, "allgather", [&](WorkPtr *w) {
    return t.start_allgather(a.device, all.device, n, dt, w);
  });
  expect(all.read(), gathered, name + "allgather");

  // Block b of rank r's input is input(r, b * n + i); rank r gets block r.
  std::vector<double> blocks(n * ranks), scattered(n, 0.0);
  for (size_t j = 0; j < n * ranks; ++j)
    blocks[j] = input(rank, j);
  for (size_t i = 0; i < n; ++i) {
    for (int r = 0; r < ranks; ++r)
      scattered[i] += input(r, rank * n + i);
  }
  all.write(blocks);
  a.write(std::vector<double>(n, -1.0));
  run(t, "reduce_scatter", [&](WorkPtr *w) {
    return t.start_reduce_scatter(all.device, a.device, n, dt, divisor, w);
  });
  expect(a.read(), divided_by(scattered, divisor, dt),
         name + "reduce_scatter");

  check_blocks(t, dt, n, name);
}

// Two ranks sum in one order whatever the transport, so the IPC
// transport's all-reduce must equal the staged one's (`reference`) bit for
// bit, with terms whose scaled values round (float16's subnormals, sums
// past its largest value) and divisors folded into the scale (2) or not
// (3): the host's rounding order, not only its results on exact values.
void check_same_as(DeviceTransport &t, DeviceTransport &reference) {
  const size_t n = 5000;
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    std::vector<double> mine(n);
    for (size_t i = 0; i < n; ++i) {
      mine[i] = i % 101 == 0 ? 65000.0 - 1000.0 * rank
                             : ((rank + 1) * double(i % 97) - 48) * 1e-6;
    }
    for (int divisor : {2, 3}) {
      DeviceArray a(n, dt), b(n, dt);
      a.write(mine);
      b.write(mine);
      run(t, "allreduce", [&](WorkPtr *w) {
        return t.start_allreduce(a.device, n, dt, 0.5f, divisor, w);
      });
      run(reference, "allreduce", [&](WorkPtr *w) {
        return reference.start_allreduce(b.device, n, dt, 0.5f, divisor, w);
      });
      expect(a.read(), b.read(),
             "dtype " + std::to_string(int(dt)) + ", divisor " +
                 std::to_string(divisor) + ": IPC against staged");
    }
  }
}

// The list collectives (collectives.hpp) on device memory: fused and direct
// arrays of several dtypes (NNCOMM_DIRECT_BYTES is set to 4096 by the
// test), arrays still zeroing (null) on some ranks or on all, each root.
void check_lists(DeviceTransport &t, ArrayMemory &memory) {
  const std::vector<std::pair<size_t, DType>> shapes = {
      {5, DType::kFloat32},    {300, DType::kFloat32}, {7, DType::kFloat16},
      {3000, DType::kFloat32}, {40, DType::kInt32},    {2000, DType::kFloat16}};
  const size_t n = shapes.size();
  std::vector<std::unique_ptr<DeviceArray>> arrays;
  for (const auto &[count, dt] : shapes)
    arrays.emplace_back(new DeviceArray(count, dt));
  const auto value = [](int r, size_t k, size_t i) { return input(r, i + k); };
  const auto values = [&](int r, size_t k) {
    std::vector<double> v(shapes[k].first);
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = value(r, k, i);
    return v;
  };
  // Array 1 is zeroing everywhere; array k elsewhere where (k + r) % 3 is 0.
  const auto zeroing = [](int r, size_t k) {
    return k == 1 || (k != 0 && (k + r) % 3 == 0);
  };
  struct Materialized {
    std::vector<std::unique_ptr<DeviceArray>> *arrays;
    std::vector<bool> asked;
  } materialized{&arrays, std::vector<bool>(n, false)};
  Materializer materialize{
      [](void *context, size_t index) -> void * {
        auto *m = static_cast<Materialized *>(context);
        m->asked[index] = true;
        return (*m->arrays)[index]->device;
      },
      &materialized};

  std::vector<ArrayRef> refs(n);
  for (size_t k = 0; k < n; ++k) {
    const bool null = zeroing(rank, k);
    // A zeroing array's memory holds what it held: -1s, kept unless reduced.
    arrays[k]->write(null ? std::vector<double>(shapes[k].first, -1.0)
                          : values(rank, k));
    refs[k] = {null ? nullptr : arrays[k]->device, shapes[k].first,
               shapes[k].second};
  }
  ok(t.follow(nullptr), "follow");
  ok(all_reduce_list(t, memory, refs, false, 1.0f, true, materialize),
     "all_reduce_list");
  ok(t.lead(nullptr), "lead");
  for (size_t k = 0; k < n; ++k) {
    std::vector<double> want(shapes[k].first, k == 1 ? -1.0 : 0.0);
    for (int r = 0; r < ranks && k != 1; ++r) {
      if (!zeroing(r, k)) {
        const std::vector<double> v = values(r, k);
        for (size_t i = 0; i < want.size(); ++i)
          want[i] += v[i];
      }
    }
    expect(arrays[k]->read(), want, "all_reduce_list array " + std::to_string(k));
    if (materialized.asked[k] != (zeroing(rank, k) && k != 1))
      fail("all_reduce_list materialized array " + std::to_string(k) +
           (materialized.asked[k] ? " needlessly" : " not"));
  }

  // The floating arrays, averaged into each root; broadcast from each.
  std::vector<size_t> floating;
  for (size_t k = 0; k < n; ++k) {
    if (dtype_is_floating(shapes[k].second))
      floating.push_back(k);
  }
  for (int root = 0; root < ranks; ++root) {
    std::vector<ArrayRef> list;
    for (size_t k : floating) {
      arrays[k]->write(values(rank, k));
      list.push_back({arrays[k]->device, shapes[k].first, shapes[k].second});
    }
    ok(t.follow(nullptr), "follow");
    ok(reduce_list(t, memory, list, root, true, true), "reduce_list");
    ok(t.lead(nullptr), "lead");
    for (size_t k : floating) {
      std::vector<double> sum(shapes[k].first, 0.0);
      for (int r = 0; r < ranks; ++r) {
        const std::vector<double> v = values(r, k);
        for (size_t i = 0; i < sum.size(); ++i)
          sum[i] += v[i];
      }
      expect(arrays[k]->read(),
             rank == root ? divided_by(sum, ranks, shapes[k].second)
                          : values(rank, k),
             "reduce_list array " + std::to_string(k));
    }
    for (size_t k : floating)
      arrays[k]->write(rank == root ? values(rank, k)
                                    : std::vector<double>(shapes[k].first, 0));
    ok(t.follow(nullptr), "follow");
    ok(bcast_list(t, memory, list, root, true), "bcast_list");
    ok(t.lead(nullptr), "lead");
    for (size_t k : floating)
      expect(arrays[k]->read(), values(root, k),
             "bcast_list array " + std::to_string(k));
  }

  // Gathered into one array per rank; scattered from one per rank.
  const size_t block = 9;
  DeviceArray mine(block, DType::kFloat32);
  std::vector<std::unique_ptr<DeviceArray>> blocks;
  std::vector<ArrayRef> block_refs;
  for (int r = 0; r < ranks; ++r) {
    blocks.emplace_back(new DeviceArray(block, DType::kFloat32));
    blocks.back()->write(std::vector<double>(block, -1.0));
    block_refs.push_back({blocks.back()->device, block, DType::kFloat32});
  }
  const auto row = [&](int r, size_t k) {
    std::vector<double> v(block);
    for (size_t i = 0; i < block; ++i)
      v[i] = value(r, k, i);
    return v;
  };
  mine.write(row(rank, 0));
  const ArrayRef send{mine.device, block, DType::kFloat32};
  ok(t.follow(nullptr), "follow");
  ok(all_gather(t, memory, send, block_refs), "all_gather");
  ok(t.lead(nullptr), "lead");
  for (int r = 0; r < ranks; ++r)
    expect(blocks[r]->read(), row(r, 0), "all_gather block " + std::to_string(r));
  for (int r = 0; r < ranks; ++r)
    blocks[r]->write(row(rank, r));
  ok(t.follow(nullptr), "follow");
  ok(reduce_scatter(t, memory, block_refs, send, true), "reduce_scatter");
  ok(t.lead(nullptr), "lead");
  std::vector<double> sum(block, 0.0);
  for (int r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < block; ++i)
      sum[i] += value(r, rank, i);
  }
  expect(mine.read(), divided_by(sum, ranks, DType::kFloat32),
         "reduce_scatter");

  // Rank r's first r + 2 elements of row(r, 1), gathered into one array
  // per rank through the memory's buffer.
  std::vector<size_t> sizes;
  std::vector<std::unique_ptr<DeviceArray>> parts;
  std::vector<ArrayRef> part_refs;
  const auto head = [&](int r) {
    std::vector<double> v = row(r, 1);
    v.resize(r + 2);
    return v;
  };
  for (int r = 0; r < ranks; ++r) {
    sizes.push_back(r + 2);
    parts.emplace_back(new DeviceArray(r + 2, DType::kFloat32));
    parts.back()->write(std::vector<double>(r + 2, -1.0));
    part_refs.push_back({parts.back()->device, sizes[r], DType::kFloat32});
  }
  std::vector<double> padded = head(rank);
  padded.resize(block, 0.0);
  mine.write(padded);
  ok(t.follow(nullptr), "follow");
  ok(all_gatherv(t, memory, {mine.device, sizes[rank], DType::kFloat32},
                 sizes, part_refs),
     "all_gatherv");
  ok(t.lead(nullptr), "lead");
  for (int r = 0; r < ranks; ++r)
    expect(parts[r]->read(), head(r), "all_gatherv block " + std::to_string(r));
}

// The group's engine over `tensors` gradients planned as `plan` (its plan
// 0), computed on the legacy default stream (as nnabla-ext-cuda does), its
// buffer prepared.
std::unique_ptr<Engine> engine_of(Group &group, size_t tensors,
                                  std::vector<Bucket> plan) {
  std::unique_ptr<Engine> engine;
  ok(group.create_engine(on(cudaStreamLegacy), {}, tensors, 20, &engine),
     "Group::create_engine");
  size_t planned = 1;
  ok(engine->add_plan(std::move(plan), &planned), "Engine::add_plan");
  if (planned != 0)
    fail("the engine's first plan is plan 0");
  return engine;
}

// The group's engine (what all_reduce_callback and gradient_reducer run
// on GPU gradients): gradients `a` and `b` written on the legacy default
// stream, as nnabla-ext-cuda computes, and made ready at once; once
// finish() returns, work on that stream reads their mean.
void check_engine(Group &group, DeviceArray &a, DeviceArray &b) {
  std::vector<TensorSpec> specs = {{a.n, a.dt}, {b.n, b.dt}};
  std::vector<Bucket> plan = plan_buckets(specs, {1, 0}, 700, false,
                                          DType::kFloat32, 4 * 2000);
  std::unique_ptr<Engine> engine = engine_of(group, 2, plan);
  for (int k = 0; k < 3; ++k) {
    std::vector<double> va(a.n), vb(b.n), sa(a.n, 0.0), sb(b.n, 0.0);
    for (size_t i = 0; i < a.n; ++i) {
      va[i] = input(rank, i + k);
      for (int r = 0; r < ranks; ++r)
        sa[i] += input(r, i + k);
    }
    for (size_t i = 0; i < b.n; ++i) {
      vb[i] = input(rank, 7 * i + k);
      for (int r = 0; r < ranks; ++r)
        sb[i] += input(r, 7 * i + k);
    }
    ok(engine->begin(0, 1.0f, ranks), "Engine::begin");
    b.write(vb);
    engine->mark_ready(1, b.device, b.dt);
    a.write(va);
    engine->mark_ready(0, a.device, a.dt);
    ok(engine->finish(), "Engine::finish");
    expect(a.read(), divided_by(sa, ranks, a.dt), "engine gradient a");
    expect(b.read(), divided_by(sb, ranks, b.dt), "engine gradient b");
  }
}

// A float16 gradient that goes direct, under the scale_grad of loss
// scaling by 3 * 65536: reduced as packing scales it (x * scale in float,
// rounded; summed; divided by the ranks in float, rounded), whatever the
// transport. NCCL's pre-multiplied sum would take the quotient by the
// ranks as one float16 scalar, a subnormal 0.8 % off for 2 ranks. Each x
// is 3k with k <= 500, so every step but the last is exact.
void check_engine_scaled_half(Group &group) {
  const size_t n = 6000;
  const float scale = 1.0f / (3 * 65536);
  DeviceArray g(n, DType::kFloat16);
  std::vector<TensorSpec> specs = {{n, DType::kFloat16}};
  std::vector<Bucket> plan =
      plan_buckets(specs, {0}, 8000, true, DType::kFloat32, 8000);
  if (plan.size() != 1 || !plan[0].direct)
    fail("the float16 gradient should go direct");
  std::unique_ptr<Engine> engine = engine_of(group, 1, plan);
  const auto k = [](int r, size_t i) { return (i * 7 + r * 13) % 500 + 1; };
  std::vector<double> mine(n), want(n);
  for (size_t i = 0; i < n; ++i) {
    mine[i] = 3.0 * k(rank, i);
    float sum = 0;
    for (int r = 0; r < ranks; ++r)
      sum += float(k(r, i)) / 65536;
    char half[2];
    convert_scaled(half, DType::kFloat16, &sum, DType::kFloat32, 1, 1.0f,
                   ranks);
    want[i] = load(half, DType::kFloat16, 1)[0];
  }
  ok(engine->begin(0, scale, ranks), "Engine::begin");
  g.write(mine);
  engine->mark_ready(0, g.device, g.dt);
  ok(engine->finish(), "Engine::finish");
  expect(g.read(), want, "float16 direct gradient under loss scaling");
}

// `got` within a few units in the last place of `want` (float64 sums and
// quotients, whose rounding the transports may order differently).
void expect_near(const std::vector<double> &got,
                 const std::vector<double> &want, const std::string &what) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::abs(got[i] - want[i]) > 1e-14 * std::abs(want[i])) {
      fail(what + ": element " + std::to_string(i) + " is " +
           std::to_string(got[i]) + ", expected " + std::to_string(want[i]));
    }
  }
  ++checks;
}

// float64, which the CUDA packer does not move: the transport scales and
// divides it while reducing, fused or direct (NNCOMM_DIRECT_BYTES at its
// default), in all_reduce, reduce and the engine (its buckets in float64,
// as keep_dtype plans them).
void check_float64(Group &group) {
  const size_t small = 300, large = (size_t(1) << 20) / 8 + 5;
  DeviceArray x(small, DType::kFloat64), y(large, DType::kFloat64);
  std::vector<double> vx(small), vy(large), sx(small, 0.0), sy(large, 0.0);
  for (size_t i = 0; i < large; ++i) {
    for (int r = 0; r < ranks; ++r) {
      if (i < small)
        sx[i] += input(r, i);
      sy[i] += input(r, 3 * i);
    }
    if (i < small)
      vx[i] = input(rank, i);
    vy[i] = input(rank, 3 * i);
  }
  const auto times = [](std::vector<double> v, double f) {
    for (double &e : v)
      e = e * f;
    return v;
  };
  const auto over = [](std::vector<double> v, double d) {
    for (double &e : v)
      e = e / d;
    return v;
  };
  std::vector<ArrayRef> refs = {{x.device, small, DType::kFloat64},
                                {y.device, large, DType::kFloat64}};
  x.write(vx);
  y.write(vy);
  ok(group.all_reduce(on(nullptr), refs, true, 0.5f, true, Materializer{}),
     "Group::all_reduce of float64");
  expect_near(x.read(), over(times(sx, 0.5), ranks), "float64 fused mean");
  expect_near(y.read(), over(times(sy, 0.5), ranks), "float64 direct mean");
  x.write(vx);
  y.write(vy);
  ok(group.reduce(on(nullptr), refs, 0, true, true),
     "Group::reduce of float64");
  expect_near(x.read(), rank == 0 ? over(sx, ranks) : vx, "float64 reduce");
  expect_near(y.read(), rank == 0 ? over(sy, ranks) : vy, "float64 reduce");

  std::vector<TensorSpec> specs = {{small, DType::kFloat64},
                                   {large, DType::kFloat64}};
  std::unique_ptr<Engine> engine = engine_of(
      group, 2,
      plan_buckets(specs, {1, 0}, 700, true, DType::kFloat32, 4 * 2000));
  for (int k = 0; k < 2; ++k) {
    ok(engine->begin(0, 0.5f, ranks), "Engine::begin");
    y.write(vy);
    engine->mark_ready(1, y.device, y.dt);
    x.write(vx);
    engine->mark_ready(0, x.device, x.dt);
    ok(engine->finish(), "Engine::finish");
    expect_near(x.read(), over(times(sx, 0.5), ranks), "float64 engine");
    expect_near(y.read(), over(times(sy, 0.5), ranks), "float64 engine");
  }
}

// Memory of another device than the group's (the fake has two) is refused
// before anything is enqueued, in every collective, naming the array and
// both devices; the group goes on working afterwards.
void check_other_device_refused(Group &group, DeviceArray &a) {
  int here = 0;
  cuda(cudaGetDevice(&here), "cudaGetDevice");
  cuda(cudaSetDevice(1 - here), "cudaSetDevice");
  DeviceArray elsewhere(a.n, DType::kFloat32);
  cuda(cudaSetDevice(here), "cudaSetDevice");
  const ArrayRef ours{a.device, a.n, DType::kFloat32};
  const ArrayRef theirs{elsewhere.device, a.n, DType::kFloat32};
  std::vector<ArrayRef> mixed = {ours, theirs};
  char address[32];
  std::snprintf(address, sizeof address, "%p",
                static_cast<void *>(elsewhere.device));
  const std::string want = std::string("a GPU array of this call (at ") +
                           address + ") is on CUDA device " +
                           std::to_string(1 - here) +
                           ", but the call communicates on device " +
                           std::to_string(here);
  const auto refused = [&](const Status &s, const char *what) {
    if (s.ok() || s.message().find(want) == std::string::npos)
      fail(std::string(what) + " on another device: " +
           (s.ok() ? "accepted" : s.message()));
    ++checks;
  };
  refused(group.all_reduce(on(nullptr), mixed, false, 1.0f, true,
                           Materializer{}),
          "all_reduce");
  refused(group.bcast(on(nullptr), mixed, 0, true), "bcast");
  refused(group.reduce(on(nullptr), mixed, 0, false, true), "reduce");
  refused(group.all_gather(on(nullptr), ours, {theirs}), "all_gather");
  refused(group.check_placed(mixed), "check_placed");
  std::vector<ArrayRef> just_ours = {ours};
  a.write(std::vector<double>(a.n, 1.0));
  ok(group.all_reduce(on(nullptr), just_ours, false, 1.0f, true,
                      Materializer{}),
     "Group::all_reduce after a refusal");
  expect(a.read(), std::vector<double>(a.n, double(ranks)),
         "Group::all_reduce after a refusal");
}

// The world's device path: the transport every rank chose at the group's
// first device collective (NCCL where it loads, NNCOMM_NCCL_LIBRARY, and no
// two ranks share a device), and the list collectives through it, ordered
// with the compute stream.
std::string check_group() {
  const size_t n = 1000;
  DeviceArray a(n, DType::kFloat32), b(3 * n, DType::kFloat32);
  std::unique_ptr<Group> group;
  ok(Group::Create(MPI_COMM_WORLD, &group), "Group::Create");
  std::string advice;
  std::vector<double> mine(n), sum(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    mine[i] = input(rank, i);
    for (int r = 0; r < ranks; ++r)
      sum[i] += input(r, i);
  }
  for (int repeat = 0; repeat < 3; ++repeat) {
    a.write(mine);
    b.write(std::vector<double>(3 * n, 1.0));
    std::vector<ArrayRef> refs = {{a.device, n, DType::kFloat32},
                                  {b.device, 3 * n, DType::kFloat32}};
    // The first opens the group's device path.
    ok(group->all_reduce(on(nullptr), refs, false, 1.0f, true,
                         Materializer{}),
       "Group::all_reduce on the device");
    if (repeat == 0)
      advice = group->take_advice();
    expect(a.read(), sum, "Group::all_reduce");
    expect(b.read(), std::vector<double>(3 * n, double(ranks)),
           "Group::all_reduce");
    ok(group->bcast(on(cudaStreamLegacy), refs, 0, true), "Group::bcast");
    expect(a.read(), sum, "Group::bcast");
  }
  // Rank q sends each rank r its q + 1 elements input(q, r * (q + 1) + i),
  // through the group, ordered with the compute stream.
  std::vector<size_t> out_counts(ranks, rank + 1), in_counts;
  std::vector<double> expected;
  for (int q = 0; q < ranks; ++q) {
    in_counts.push_back(q + 1);
    for (int i = 0; i <= q; ++i)
      expected.push_back(input(q, rank * (q + 1) + i));
  }
  const size_t mine_total = ranks * (rank + 1);
  std::vector<double> out_values(mine_total);
  for (size_t j = 0; j < mine_total; ++j)
    out_values[j] = input(rank, j);
  DeviceArray out(mine_total, DType::kFloat32);
  DeviceArray in(expected.size(), DType::kFloat32);
  out.write(out_values);
  ok(group->alltoall(on(nullptr), {out.device, out.n, DType::kFloat32},
                     out_counts, {in.device, in.n, DType::kFloat32},
                     in_counts),
     "Group::alltoall");
  expect(in.read(), expected, "Group::alltoall");
  check_engine(*group, a, b);
  check_other_device_refused(*group, a);
  check_float64(*group);
  check_engine_scaled_half(*group);
  if (!group->take_advice().empty())
    fail("the device path's advice is taken once");
  if (!advice.empty())
    std::printf("rank %d: advice: %s\n", rank, advice.c_str());
  return group->device_transport();
}

// A set-up step of `what` failing on rank `failing` alone, `call` failing
// there (after `after` calls of it succeed, for the fake runtime's; set
// in NNCOMM_FAKE_NCCL_FAIL, for the fake NCCL's): "nccl",
// NcclTransport::Create; "group", the opening of the group's device path at
// its first device collective (its transport as NNCOMM_GPU_TRANSPORT says);
// "engine", the group's create_engine on the device. Every
// rank must fail, within 5 s where the test sets NNCOMM_TIMEOUT well above
// that (so a rank left waiting for the failing one fails here); rank 0
// prints each rank's error on a line of its own ("rank R failed after S s:
// ..."), as mpiexec may join lines of two ranks.
void check_setup_failure(const std::string &what, const std::string &call,
                         int failing, int after) {
  DeviceArray a(16, DType::kFloat32);
  std::vector<ArrayRef> refs = {{a.device, a.n, a.dt}};
  std::unique_ptr<Group> group;
  if (what == "group" || what == "engine")
    ok(Group::Create(MPI_COMM_WORLD, &group), "Group::Create");
  if (what == "engine") {
    ok(group->all_reduce(on(nullptr), refs, false, 1.0f, true,
                         Materializer{}),
       "opening the device path");
  }
  if (rank == failing && call.rfind("nccl", 0) == 0)
    setenv("NNCOMM_FAKE_NCCL_FAIL", call.c_str(), 1);
  else if (rank == failing)
    nncomm_fake_fail(call.c_str(), after);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto began = std::chrono::steady_clock::now();
  Status status;
  if (what == "nccl") {
    std::unique_ptr<MpiTransport> mpi;
    ok(MpiTransport::Create(MPI_COMM_WORLD, &mpi), "MpiTransport::Create");
    std::unique_ptr<NcclTransport> nccl;
    status = NcclTransport::Create(fake_nccl(), std::move(mpi), &nccl);
  } else if (what == "group") {
    status = group->all_reduce(on(nullptr), refs, false, 1.0f, true,
                               Materializer{});
  } else {
    std::unique_ptr<Engine> engine;
    status = group->create_engine(on(cudaStreamLegacy), refs, 1, 20, &engine);
  }
  const double seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - began)
                             .count();
  if (status.ok())
    fail(what + " was set up, though " + call + " failed on rank " +
         std::to_string(failing));
  if (seconds > 5)
    fail(what + " failed after " + std::to_string(seconds) +
         " s: " + status.message());
  char mine[512] = {0};
  std::snprintf(mine, sizeof mine, "failed after %.2f s: %s", seconds,
                status.message().c_str());
  std::vector<char> all(sizeof mine * ranks);
  MPI_Gather(mine, sizeof mine, MPI_CHAR, all.data(), sizeof mine, MPI_CHAR,
             0, MPI_COMM_WORLD);
  for (int r = 0; r < ranks && rank == 0; ++r)
    std::printf("rank %d %s\n", r, &all[r * sizeof mine]);
  ++checks;
}

// Rank 1's script ends (leave_job and MPI_Finalize, as nncomm's exit
// does) after one NCCL all-reduce of the two that rank 0 makes: NCCL tells
// nothing of it, and the end notices make rank 0's wait fail within
// seconds, naming rank 1, rather than at NNCOMM_TIMEOUT. Rank 0 prints
// "rank 0 failed after S s: ..." and ends the job as a failed wait does
// (MPI_Abort, exit 1).
[[noreturn]] void check_ended_rank() {
  ok(listen_for_ended_ranks(), "listen_for_ended_ranks");
  std::unique_ptr<MpiTransport> mpi;
  ok(MpiTransport::Create(MPI_COMM_WORLD, &mpi), "MpiTransport::Create");
  std::unique_ptr<NcclTransport> nccl;
  ok(NcclTransport::Create(fake_nccl(), std::move(mpi), &nccl),
     "NcclTransport::Create");
  DeviceArray a(16, DType::kFloat32);
  ok(nccl->allreduce(a.device, a.n, a.dt), "the all-reduce both make");
  if (rank == 1) {
    leave_job();
    MPI_Finalize();
    std::exit(0);
  }
  const auto began = std::chrono::steady_clock::now();
  const Status status = nccl->allreduce(a.device, a.n, a.dt);
  const double seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - began)
                             .count();
  if (status.ok())
    fail("an all-reduce completed without rank 1");
  std::printf("rank %d failed after %.2f s: %s\n", rank, seconds,
              status.message().c_str());
  std::fflush(stdout);
  leave_job();
  std::exit(1); // not reached: leave_job() aborts after a failed wait
}

} // namespace

// IPC transports made and dropped again and again (a callback per step)
// take the slots the dropped ones left: the device memory stays what the
// first took, and each one still sums right; two alive take two.
void check_recycled_slots() {
  auto make = [] {
    std::unique_ptr<MpiTransport> mpi;
    ok(MpiTransport::Create(MPI_COMM_WORLD, &mpi), "MpiTransport::Create");
    std::unique_ptr<StagedTransport> staged;
    ok(StagedTransport::Create(std::move(mpi), &staged),
       "StagedTransport::Create");
    std::unique_ptr<IpcTransport> ipc;
    ok(IpcTransport::Create(&staged, &ipc), "IpcTransport::Create");
    return ipc;
  };
  const size_t before = nncomm_fake_device_bytes();
  make().reset();
  const size_t one = nncomm_fake_device_bytes();
  if (one <= before)
    fail("an IPC transport took no device memory");
  for (int i = 0; i < 3; ++i) {
    std::unique_ptr<IpcTransport> again = make();
    check_dtype(*again, DType::kFloat32, 70000);
    if (nncomm_fake_device_bytes() != one)
      fail("a transport made after another was dropped took new slots");
    ++checks;
  }
  std::unique_ptr<IpcTransport> a = make(), b = make();
  check_dtype(*b, DType::kFloat16, 70000);
  if (nncomm_fake_device_bytes() <= one)
    fail("two transports alive share one rank's slots");
  ++checks;
}

int main(int argc, char **argv) {
  start(&argc, &argv);
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  const std::string kind = argc > 2 ? argv[2] : "staged";
  nncomm_fake_configure(seed * 131 + rank, 3);
  // A setting the test gives must not fall back to its default unseen.
  ok(config::validate(), "the NNCOMM_* settings");
  // Two ranks share each fake device (as ranks share a GPU for the staged
  // transport, where NCCL would refuse them: the fake does not), or, with
  // TRANSPORTS_ONE_DEVICE set, every rank device 0. TRANSPORTS_FAIL_CALL:
  // that fake runtime call fails on rank 1 (group mode: a set-up that
  // falls back).
  cuda(cudaSetDevice(std::getenv("TRANSPORTS_ONE_DEVICE") ? 0 : rank % 2),
       "cudaSetDevice");
  if (const char *call = std::getenv("TRANSPORTS_FAIL_CALL")) {
    if (rank == 1)
      nncomm_fake_fail(call, 0);
  }
  std::string chosen = kind;
  if (kind == "group") {
    chosen = check_group();
  } else if (kind == "ended") {
    check_ended_rank();
  } else if (kind == "fail") {
    chosen = argv[3];
    check_setup_failure(argv[3], argv[4], std::atoi(argv[5]),
                        std::atoi(argv[6]));
  } else {
    std::unique_ptr<MpiTransport> mpi;
    ok(MpiTransport::Create(MPI_COMM_WORLD, &mpi), "MpiTransport::Create");
    std::unique_ptr<DeviceTransport> t;
    if (kind == "nccl") {
      std::unique_ptr<NcclTransport> nccl;
      ok(NcclTransport::Create(fake_nccl(), std::move(mpi), &nccl),
         "NcclTransport::Create");
      t = std::move(nccl);
    } else {
      std::unique_ptr<StagedTransport> staged;
      ok(StagedTransport::Create(std::move(mpi), &staged),
         "StagedTransport::Create");
      if (kind == "ipc") {
        std::unique_ptr<IpcTransport> ipc;
        ok(IpcTransport::Create(&staged, &ipc),
           "IpcTransport::Create");
        t = std::move(ipc);
        check_recycled_slots();
        if (ranks == 2) {
          std::unique_ptr<MpiTransport> other;
          ok(MpiTransport::Create(MPI_COMM_WORLD, &other),
             "MpiTransport::Create");
          std::unique_ptr<StagedTransport> reference;
          ok(StagedTransport::Create(std::move(other), &reference),
             "StagedTransport::Create");
          check_same_as(*t, *reference);
        }
      } else {
        t = std::move(staged);
      }
    }
    // Sizes from one element to several MPI pieces (NNCOMM_CHUNK_BYTES is
    // set small by the test), growing the pinned buffer on the way.
    for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(70000)}) {
      for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                       DType::kFloat64, DType::kInt32, DType::kInt64}) {
        check_dtype(*t, dt, n);
      }
    }
    run(*t, "barrier", [&](WorkPtr *w) {
      return t->start_barrier(w);
    });
    ++checks;
    std::unique_ptr<DeviceArrays> memory;
    ok(DeviceArrays::Create(*t, &memory), "DeviceArrays::Create");
    check_lists(*t, *memory);
  }
  cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (nncomm_fake_pending() != 0)
    fail("work left pending on the fake device");
  if (rank == 0)
    std::printf("transports_over_mpi: %zu checks passed on %d ranks (%s: "
                "%s)\n",
                checks, ranks, kind.c_str(), chosen.c_str());
  MPI_Finalize();
  return 0;
}
