// Runs the CUDA packer (src/cuda/cuda_pack.cu: its table slots, uploads, event
// waits, launch ordering and arguments, device switching, error paths) on
// the CPU, against the runtime of fake_cudart.cpp, whose streams run work
// late and in a random order that keeps only CUDA's promises; every bucket
// and tensor is checked against the host twin byte for byte. Complements
// emulate_pack.cu, which tests the kernel's tile code; neither replaces a
// run on a GPU (tests/test_packing_cuda.py).
//
// Built and run by tests/test_packing_kernel_on_cpu.py:
//   nvcc -std=c++17 -cudart none -arch=sm_80 -Iinclude -Isrc
//        emulate_packer.cu fake_cudart.cpp src/cuda/cuda_pack.cu src/core/pack.cpp
//        src/host/elementwise.cpp -o emulate_packer && ./emulate_packer SEED
// Prints "emulate_packer: all scenarios passed" or the first failure
// (exit 1); the fake runtime stops with exit 3 on misuse it can see.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fake_cudart.hpp"
#include "nncomm/cuda/cuda_pack.hpp"
#include "random_values.hpp"

using namespace nncomm;

namespace {

constexpr DType kDevice[] = {DType::kFloat32, DType::kFloat16,
                             DType::kBFloat16};
// Tables a packer keeps, where a scenario needs them evicted.
constexpr size_t kTables = 8;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::printf("%s:%d: %s failed\n", __FILE__, __LINE__, #cond);            \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)
#define CUDA_OK(call) CHECK((call) == cudaSuccess)
#define STATUS_OK(call)                                                        \
  do {                                                                         \
    const Status _s = (call);                                                  \
    if (!_s.ok()) {                                                            \
      std::printf("%s:%d: %s\n", __FILE__, __LINE__, _s.message().c_str());    \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

template <typename T> T *device_alloc(size_t bytes) {
  void *p = nullptr;
  CUDA_OK(cudaMalloc(&p, bytes));
  return static_cast<T *>(p);
}

template <typename T> T *pinned_alloc(size_t bytes) {
  void *p = nullptr;
  CUDA_OK(cudaMallocHost(&p, bytes));
  return static_cast<T *>(p);
}

// A tensor on the device and its twin in host memory; `shift` elements
// before element 0 misalign it.
struct Tensor {
  DType dtype;
  size_t shift, count;
  char *device;
  std::vector<char> twin;
  size_t bytes() const { return (shift + count) * dtype_size(dtype); }
  size_t head() const { return shift * dtype_size(dtype); }
};

// A bucket: its tensors, cut into segments, and both tables.
struct Bucket {
  DType wire;
  float scale;
  int divisor;
  size_t shift; // misaligns the bucket inside its allocation
  std::vector<Tensor> tensors;
  PackTable device_table, twin_table;
  char *device_memory;
  std::vector<char> twin_memory;
  cudaEvent_t produced, reduced;

  size_t bytes() const { return device_table.count * dtype_size(wire); }
  char *device() const { return device_memory + shift * dtype_size(wire); }
  char *twin() { return twin_memory.data() + shift * dtype_size(wire); }
};

// How a bucket's tensors are cut into segments.
enum class Rows {
  kFew,  // a few tensors of assorted sizes, each cut into a few segments
  kMany, // ~1,000 segments: a table larger than the others
  kTwo,  // two whole tensors: tables of one size, so slots never grow
};

Bucket make_bucket(std::mt19937_64 &rng, Rows rows) {
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const float scales[] = {1.0f, 0.5f, 3.0f, -1.25f};
  const int divisors[] = {1, 2, 3, 8};
  Bucket b;
  b.wire = kDevice[pick(3)];
  b.scale = scales[pick(4)];
  b.divisor = divisors[pick(4)];
  b.shift = pick(9);
  b.tensors.resize(rows == Rows::kTwo ? 2 : 1 + pick(4));
  std::vector<PackSegment> device_segments, twin_segments;
  for (Tensor &t : b.tensors) {
    const size_t sizes[] = {1, 7, 8, 4095, 4097, 9000};
    t.dtype = kDevice[pick(3)];
    t.shift = pick(9);
    t.count = rows == Rows::kMany ? 1500 : sizes[pick(6)];
    t.device = device_alloc<char>(t.bytes());
    t.twin.assign(t.bytes(), 0);
    const bool zeros = rows == Rows::kFew && pick(10) == 0;
    const size_t most = rows == Rows::kMany ? 2 : t.count;
    for (size_t done = 0; done < t.count;) {
      const size_t take = rows == Rows::kTwo
                              ? t.count
                              : std::min(t.count - done, 1 + pick(most));
      device_segments.push_back(
          {zeros ? nullptr : t.device + t.head(), t.dtype, done, take});
      twin_segments.push_back(
          {zeros ? nullptr : t.twin.data() + t.head(), t.dtype, done, take});
      done += take;
    }
  }
  STATUS_OK(build_pack_table(device_segments.data(), device_segments.size(),
                             b.wire, &b.device_table));
  STATUS_OK(build_pack_table(twin_segments.data(), twin_segments.size(), b.wire,
                             &b.twin_table));
  const size_t w = dtype_size(b.wire);
  b.device_memory = device_alloc<char>((b.shift + b.device_table.count) * w);
  b.twin_memory.assign((b.shift + b.device_table.count) * w, 0);
  CUDA_OK(cudaEventCreateWithFlags(&b.produced, cudaEventDisableTiming));
  CUDA_OK(cudaEventCreateWithFlags(&b.reduced, cudaEventDisableTiming));
  return b;
}

void free_bucket(Bucket &b) {
  for (Tensor &t : b.tensors)
    CUDA_OK(cudaFree(t.device));
  CUDA_OK(cudaFree(b.device_memory));
  CUDA_OK(cudaEventDestroy(b.produced));
  CUDA_OK(cudaEventDestroy(b.reduced));
}

// What a step read back from the device, and what the twin has there.
struct Readback {
  std::vector<char> twin;
  const char *got;
  std::string what;
};

// A round of steps: the host buffers their copies read or write (freed
// once the device is idle), and what they read back, to compare with the
// twin once the device has finished.
struct Round {
  std::vector<char *> buffers;
  std::vector<Readback> readbacks;

  char *take(size_t bytes) {
    buffers.push_back(pinned_alloc<char>(bytes));
    return buffers.back();
  }
  bool matches(const std::string &when) const {
    for (const Readback &r : readbacks) {
      if (!same_bytes(r.twin.data(), r.got, r.twin.size(),
                      when + ": " + r.what))
        return false;
    }
    return true;
  }
  ~Round() {
    for (char *p : buffers)
      CUDA_OK(cudaFreeHost(p));
  }
};

// Calls the packer, now and then from another current device (the packer
// must switch to its own and back).
Status on_some_device(std::mt19937_64 &rng, const std::function<Status()> &f) {
  const bool elsewhere = rng() % 3 == 0;
  if (elsewhere)
    CUDA_OK(cudaSetDevice(1));
  const Status s = f();
  int device = -1;
  CUDA_OK(cudaGetDevice(&device));
  CHECK(device == (elsewhere ? 1 : 0));
  CUDA_OK(cudaSetDevice(0));
  return s;
}

// One step of a training loop for bucket `b`: new gradients written on
// `producer`, packed on `s1` after them, the bucket read back and replaced
// by a "reduced" payload on `s1`, unpacked on `s2` after that, and the
// tensors read back on `s2`. The twin does the same on the host.
void step(CudaPacker &packer, Bucket &b, cudaStream_t producer, cudaStream_t s1,
          cudaStream_t s2, std::mt19937_64 &rng, Round &round) {
  for (Tensor &t : b.tensors) {
    char *values = round.take(t.bytes());
    fill_random(values, t.bytes(), t.dtype, rng);
    std::memcpy(t.twin.data(), values, t.bytes());
    CUDA_OK(cudaMemcpyAsync(t.device, values, t.bytes(), cudaMemcpyHostToDevice,
                            producer));
  }
  CUDA_OK(cudaEventRecord(b.produced, producer));
  STATUS_OK(on_some_device(rng, [&] {
    return packer.pack(b.device_table, b.device(), b.wire, b.scale, s1,
                       b.produced);
  }));
  STATUS_OK(pack_host(b.twin_table, b.twin(), b.wire, b.scale));
  char *packed = round.take(b.bytes());
  CUDA_OK(cudaMemcpyAsync(packed, b.device(), b.bytes(), cudaMemcpyDeviceToHost,
                          s1));
  round.readbacks.push_back(
      {{b.twin(), b.twin() + b.bytes()}, packed, "packed bucket"});

  char *payload = round.take(b.bytes());
  fill_random(payload, b.bytes(), b.wire, rng);
  std::memcpy(b.twin(), payload, b.bytes());
  CUDA_OK(cudaMemcpyAsync(b.device(), payload, b.bytes(),
                          cudaMemcpyHostToDevice, s1));
  CUDA_OK(cudaEventRecord(b.reduced, s1));
  STATUS_OK(on_some_device(rng, [&] {
    return packer.unpack(b.device_table, b.device(), b.wire, b.scale, b.divisor,
                         s2, b.reduced);
  }));
  STATUS_OK(unpack_host(b.twin_table, b.twin(), b.wire, b.scale, b.divisor));
  for (size_t i = 0; i < b.tensors.size(); ++i) {
    Tensor &t = b.tensors[i];
    char *unpacked = round.take(t.bytes());
    CUDA_OK(cudaMemcpyAsync(unpacked, t.device, t.bytes(),
                            cudaMemcpyDeviceToHost, s2));
    round.readbacks.push_back(
        {t.twin, unpacked, "unpacked tensor " + std::to_string(i)});
  }
}

cudaStream_t new_stream(unsigned flags) {
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, flags));
  return s;
}

// A training loop: buckets packed and unpacked for several steps on
// streams picked at random (the legacy default stream, blocking and
// non-blocking ones), with up to 12 buckets for the packer's 8 tables,
// so tables are evicted, uploaded again and grown while work that reads
// them is pending.
bool training(uint64_t seed) {
  std::mt19937_64 rng(seed);
  nncomm_fake_configure(seed, 2 + rng() % 8);
  std::unique_ptr<CudaPacker> packer;
  STATUS_OK(CudaPacker::Create(&packer, kTables));
  const cudaStream_t producer = new_stream(cudaStreamNonBlocking);
  const cudaStream_t streams[] = {nullptr, new_stream(cudaStreamDefault),
                                  new_stream(cudaStreamDefault),
                                  new_stream(cudaStreamNonBlocking)};
  std::vector<Bucket> buckets;
  const size_t n = 1 + rng() % 12;
  for (size_t i = 0; i < n; ++i)
    buckets.push_back(
        make_bucket(rng, rng() % 6 == 0 ? Rows::kMany : Rows::kFew));
  for (int k = 0; k < 6; ++k) {
    Round round;
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i)
      order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    const size_t copies = nncomm_fake_copies();
    size_t own = 0; // the copies step() makes: 2 per tensor, 2 per bucket
    for (size_t i : order) {
      step(*packer, buckets[i], producer, streams[rng() % 4],
           streams[rng() % 4], rng, round);
      own += 2 * buckets[i].tensors.size() + 2;
    }
    CUDA_OK(cudaDeviceSynchronize());
    if (!round.matches("training, step " + std::to_string(k)))
      return false;
    // Each table is uploaded once, when the packer keeps them all.
    const size_t uploads = nncomm_fake_copies() - copies - own;
    CHECK(n > kTables || uploads == (k == 0 ? n : 0));
  }
  packer.reset();
  for (Bucket &b : buckets)
    free_bucket(b);
  for (cudaStream_t s : {producer, streams[1], streams[2], streams[3]})
    CUDA_OK(cudaStreamDestroy(s));
  return true;
}

// Three host threads sharing one packer, each on its own stream with its
// own three buckets: nine tables for eight slots.
bool threads(uint64_t seed) {
  nncomm_fake_configure(seed, 4);
  std::unique_ptr<CudaPacker> packer;
  STATUS_OK(CudaPacker::Create(&packer, kTables));
  bool ok[3] = {false, false, false};
  std::vector<std::thread> workers;
  for (int w = 0; w < 3; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937_64 rng(seed * 31 + w);
      const cudaStream_t s = new_stream(cudaStreamNonBlocking);
      std::vector<Bucket> buckets;
      for (int i = 0; i < 3; ++i)
        buckets.push_back(make_bucket(rng, Rows::kFew));
      for (int k = 0; k < 4; ++k) {
        Round round;
        for (Bucket &b : buckets)
          step(*packer, b, s, s, s, rng, round);
        CUDA_OK(cudaStreamSynchronize(s));
        if (!round.matches("thread " + std::to_string(w)))
          return;
      }
      for (Bucket &b : buckets)
        free_bucket(b);
      CUDA_OK(cudaStreamDestroy(s));
      ok[w] = true;
    });
  }
  for (std::thread &t : workers)
    t.join();
  return ok[0] && ok[1] && ok[2];
}

// One step of `b` on `s` with `packer`, checked.
bool checked_step(CudaPacker &packer, Bucket &b, cudaStream_t s,
                  std::mt19937_64 &rng, const std::string &when) {
  Round round;
  step(packer, b, s, s, s, rng, round);
  CUDA_OK(cudaDeviceSynchronize());
  return round.matches(when);
}

// Tables evicted while the kernels that read them are pending on another
// stream: eight buckets fill the slots on `a`, eight more evict them on
// `b`, then, in a second pass, the first eight come back on `b` and the
// others on `a`. The
// tables are all of one size, so no slot grows (growing waits for the
// device), and work runs only when the host waits for it.
bool cross_stream_reuse(uint64_t seed) {
  std::mt19937_64 rng(seed);
  nncomm_fake_configure(seed, 1u << 30);
  std::unique_ptr<CudaPacker> packer;
  STATUS_OK(CudaPacker::Create(&packer, kTables));
  const cudaStream_t a = new_stream(cudaStreamNonBlocking);
  const cudaStream_t b = new_stream(cudaStreamNonBlocking);
  std::vector<Bucket> buckets;
  for (int i = 0; i < 16; ++i)
    buckets.push_back(make_bucket(rng, Rows::kTwo));
  for (int pass = 0; pass < 2; ++pass) {
    Round round;
    for (int i = 0; i < 16; ++i) {
      const cudaStream_t s = (i < 8) == (pass == 0) ? a : b;
      step(*packer, buckets[i], s, s, s, rng, round);
    }
    CUDA_OK(cudaDeviceSynchronize());
    if (!round.matches("cross-stream reuse, pass " + std::to_string(pass)))
      return false;
  }
  packer.reset();
  for (Bucket &each : buckets)
    free_bucket(each);
  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
  return true;
}

// The least recently used table is the one replaced: with room for eight,
// nine tables packed in turn leave the last eight on the device, and
// packing the first again replaces the second.
bool eviction_order(uint64_t seed) {
  std::mt19937_64 rng(seed);
  nncomm_fake_configure(seed, 4);
  std::unique_ptr<CudaPacker> packer;
  STATUS_OK(CudaPacker::Create(&packer, kTables));
  const cudaStream_t s = new_stream(cudaStreamNonBlocking);
  std::vector<Bucket> buckets;
  for (int i = 0; i < 9; ++i)
    buckets.push_back(make_bucket(rng, Rows::kTwo));
  auto uploads = [&](std::initializer_list<int> order) {
    const size_t before = nncomm_fake_copies();
    for (int i : order) {
      const Bucket &b = buckets[i];
      STATUS_OK(packer->pack(b.device_table, b.device(), b.wire, b.scale, s,
                             nullptr));
    }
    return nncomm_fake_copies() - before;
  };
  CHECK(uploads({0, 1, 2, 3, 4, 5, 6, 7, 8}) == 9);
  CHECK(uploads({1, 2, 3, 4, 5, 6, 7, 8}) == 0);
  CHECK(uploads({0}) == 1);
  CHECK(uploads({2, 3, 4, 5, 6, 7, 8, 0}) == 0);
  CHECK(uploads({1}) == 1);
  CUDA_OK(cudaDeviceSynchronize());
  packer.reset();
  for (Bucket &b : buckets)
    free_bucket(b);
  CUDA_OK(cudaStreamDestroy(s));
  return true;
}

// Failing runtime calls, graph capture, a packer destroyed with its work
// pending and a table outgrowing a slot that pending kernels read; here
// work runs only when the host waits for it.
bool failures(uint64_t seed) {
  std::mt19937_64 rng(seed);
  nncomm_fake_configure(seed, 1u << 30);
  const cudaStream_t s = new_stream(cudaStreamDefault);
  const cudaStream_t t = new_stream(cudaStreamNonBlocking);
  Bucket b = make_bucket(rng, Rows::kFew);
  const struct {
    const char *call, *message;
  } failing[] = {
      {"cudaMalloc", "cudaMalloc failed: out of memory"},
      {"cudaMallocHost", "cudaMallocHost failed: out of memory"},
      {"cudaLaunchKernel",
       "cudaLaunchKernel failed: unspecified launch failure"},
  };
  for (const auto &f : failing) {
    std::unique_ptr<CudaPacker> packer;
    STATUS_OK(CudaPacker::Create(&packer));
    nncomm_fake_fail(f.call, 0);
    nncomm_fake_hold(s); // what the failed call enqueued on `s` runs last
    const Status st =
        packer->pack(b.device_table, b.device(), b.wire, b.scale, s, nullptr);
    if (st.ok() || st.message() != f.message) {
      std::printf("failing %s: got \"%s\"\n", f.call, st.message().c_str());
      return false;
    }
    // The packer is still usable, also on another stream than the one
    // its failed call may have left an upload pending on.
    if (!checked_step(*packer, b, t, rng,
                      std::string("after failing ") + f.call))
      return false;
  }

  // A table that fails to grow its slot: the packer stays usable, and the
  // slot too.
  for (const char *call : {"cudaMalloc", "cudaMallocHost"}) {
    std::unique_ptr<CudaPacker> packer;
    STATUS_OK(CudaPacker::Create(&packer, 1));
    Bucket small = make_bucket(rng, Rows::kTwo);
    Bucket large = make_bucket(rng, Rows::kMany);
    if (!checked_step(*packer, small, t, rng, "before growing"))
      return false;
    nncomm_fake_fail(call, 0);
    CHECK(!packer
               ->pack(large.device_table, large.device(), large.wire,
                      large.scale, t, nullptr)
               .ok());
    // The table the slot held, then the one that failed to fit.
    if (!checked_step(*packer, small, t, rng,
                      std::string("after failing ") + call) ||
        !checked_step(*packer, large, t, rng, "grown"))
      return false;
    packer.reset();
    free_bucket(small);
    free_bucket(large);
  }

  std::unique_ptr<CudaPacker> packer;
  STATUS_OK(CudaPacker::Create(&packer));
  const size_t launches = nncomm_fake_launches();
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const Status captured =
      packer->pack(b.device_table, b.device(), b.wire, b.scale, s, nullptr);
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CHECK(!captured.ok() &&
        captured.message().find("CUDA graph") != std::string::npos);
  CHECK(nncomm_fake_launches() == launches);

  {
    Round round;
    step(*packer, b, s, s, s, rng, round);
    CHECK(nncomm_fake_pending() > 0);
    packer.reset(); // must wait for its kernels before freeing their tables
    CUDA_OK(cudaDeviceSynchronize());
    if (!round.matches("packer destroyed with work pending"))
      return false;
  }

  // Eight small tables fill the slots; a large one then grows the least
  // recently used slot while the kernels that read it are still pending.
  STATUS_OK(CudaPacker::Create(&packer, kTables));
  std::vector<Bucket> buckets;
  for (int i = 0; i < 8; ++i)
    buckets.push_back(make_bucket(rng, Rows::kFew));
  buckets.push_back(make_bucket(rng, Rows::kMany));
  {
    Round round;
    for (Bucket &small : buckets)
      step(*packer, small, s, s, s, rng, round);
    CUDA_OK(cudaDeviceSynchronize());
    if (!round.matches("slot grown under pending kernels"))
      return false;
  }
  packer.reset();
  buckets.push_back(std::move(b));
  for (Bucket &each : buckets)
    free_bucket(each);
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaStreamDestroy(t));
  return true;
}

} // namespace

int main(int argc, char **argv) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  if (!training(seed) || !threads(seed) || !cross_stream_reuse(seed) ||
      !eviction_order(seed) || !failures(seed))
    return 1;
  std::printf("emulate_packer: all scenarios passed\n");
  return 0;
}
