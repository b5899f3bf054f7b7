// A CUDA runtime on the CPU, for testing the packer's host code
// (src/cuda/cuda_pack.cu) where there is no GPU: the runtime calls it makes,
// linked in place of cudart (nvcc -cudart none).
//
// It is meant to be adversarial, not merely permissive. Device memory is
// host memory with bounds recorded; there are two devices. Work enqueued on
// a stream (copies, event records, event waits, the packing kernel) does
// not run when enqueued: it runs later, in a random order that respects
// only what CUDA promises (stream order, legacy default stream, event
// waits), or when the host synchronises on it. So a missing event wait, a
// staging buffer rewritten too soon or a table reused under a pending
// kernel shows up as wrong data, and freeing memory that pending work uses
// (cudaFree's synchronisation is not promised) stops the program.
//
// Device memory is shared memory (memfd), so that CUDA IPC works between
// processes: cudaIpcGetMemHandle names an allocation by process and file
// descriptor, cudaIpcOpenMemHandle maps it in another process as memory of
// that process's current device.
//
// The only kernels it runs are the packing kernel, the NaN/infinity
// check's and the IPC transport's sum, decoded from their argument arrays
// after checking the mangled name each was registered under; their bodies
// are pack_tile.cuh's and sum_tile.cuh's tile
// functions, run block by block and thread by thread (as
// tests/cuda_emulation/emulate_pack.cu does), a block's vote
// (__syncthreads_or) being the OR of its threads' findings.
#include "fake_cudart.hpp"
#include "cuda/pack_tile.cuh"
#include "cuda/sum_tile.cuh"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include <cxxabi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr int kDevices = 2;
// The packer's kernels: the general one and the word copy, each with and
// without the NaN/infinity check.
std::string pack_kernel_name(bool words, bool check) {
  return std::string("void nncomm::(anonymous namespace)::pack_kernel<") +
         (words ? "true" : "false") + ", " + (check ? "true" : "false") +
         ">(nncomm::PackEntry const*, unsigned long, char*, nncomm::DType, "
         "bool, nncomm::Scaling, bool, unsigned int*)";
}

const char kSumKernel[] =
    "nncomm::(anonymous namespace)::sum_kernel(nncomm::SumSources, void*, "
    "unsigned long, nncomm::DType, float, nncomm::Scaling)";

const char kFiniteKernel[] =
    "nncomm::(anonymous namespace)::finite_kernel(void const*, unsigned "
    "long, nncomm::DType, unsigned int*)";

struct Op {
  std::vector<std::shared_ptr<Op>> after;
  std::function<void()> work;
  std::vector<const void *> uses; // allocations it reads or writes
  bool held = false;              // runs only when nothing else can
  // Runs only once it returns true (other processes' part is done).
  std::function<bool()> finished;
  bool done = false;
  std::chrono::steady_clock::time_point ran; // once done: an event's time
  bool ready() const {
    for (const auto &op : after) {
      if (!op->done)
        return false;
    }
    return !finished || finished();
  }
};
using OpPtr = std::shared_ptr<Op>;

struct Allocation {
  size_t bytes;
  int device;      // -1: pinned host memory
  int fd = -1;     // device memory's memfd, -1 where mapped from another
  size_t mapped = 0; // bytes mapped (device memory)
  bool imported = false; // cudaIpcOpenMemHandle's
};

// What the fake's cudaIpcMemHandle_t holds.
struct IpcName {
  pid_t pid;
  int fd;
  size_t bytes;  // asked for: what the importer may touch
  size_t mapped; // the whole mapping
};
static_assert(sizeof(IpcName) <= sizeof(cudaIpcMemHandle_t), "fits");

[[noreturn]] void violation(const std::string &what) {
  std::fprintf(stderr, "fake_cudart: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(3);
}

} // namespace

struct CUstream_st {
  int device;
  bool blocking; // synchronises with the legacy default stream
  bool capturing = false;
  OpPtr last;
};

struct CUevent_st {
  int device;
  OpPtr recorded;
};

namespace {

struct Runtime {
  std::mutex mutex;
  std::mt19937_64 rng{1};
  unsigned eagerness = 4; // 1 in `eagerness` calls runs a ready op
  std::vector<OpPtr> pending;
  std::set<CUstream_st *> streams;
  CUstream_st legacy[kDevices] = {{0, true}, {1, true}};
  std::map<const char *, Allocation> allocations; // by address
  std::map<const void *, std::string> kernels;    // host stub -> name
  std::map<std::string, int> failures;            // call -> calls to pass
  size_t launches = 0;
  size_t copies = 0;

  // A device allocation of `device` (or pinned memory for -1) holding
  // [p, p + bytes), if any.
  const char *find(const void *p, size_t bytes, int device) const {
    const char *c = static_cast<const char *>(p);
    auto it = allocations.upper_bound(c);
    if (it == allocations.begin())
      return nullptr;
    --it;
    if (it->second.device != device || c + bytes > it->first + it->second.bytes)
      return nullptr;
    return it->first;
  }

  bool run_one() {
    std::vector<size_t> ready, held;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (pending[i]->ready())
        (pending[i]->held ? held : ready).push_back(i);
    }
    if (ready.empty())
      ready = held;
    if (ready.empty())
      return false;
    const size_t i = ready[rng() % ready.size()];
    OpPtr op = pending[i];
    pending.erase(pending.begin() + i);
    op->work();
    op->ran = std::chrono::steady_clock::now();
    op->done = true;
    op->after.clear(); // what it waited for need not live on

    return true;
  }

  // Lets the "device" get on with some work: the host never knows how far
  // it is.
  void progress() {
    while (rng() % eagerness == 0 && run_one()) {
    }
  }

  // Whether pending work waits for other processes, which may yet come.
  bool awaiting_others() const {
    for (const OpPtr &op : pending) {
      if (op->finished)
        return true;
    }
    return false;
  }

  void wait(const OpPtr &op) {
    while (op != nullptr && !op->done) {
      if (!run_one() && !awaiting_others())
        violation("deadlock: waited for work that can never run");
    }
  }

  void drain() {
    while (run_one() || awaiting_others()) {
    }
    if (!pending.empty())
      violation("deadlock: work left that can never run");
  }

  // CUDA's handles for the default stream: 0, cudaStreamLegacy (what
  // __cuda_array_interface__ names it by) and cudaStreamPerThread (the
  // same here: each rank computes on one thread).
  CUstream_st *stream(cudaStream_t s, int device) {
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread)
      return &legacy[device];
    return s;
  }

  // Appends `op` to stream `s` with CUDA's ordering: after the stream's
  // last work and, between the legacy default stream and blocking streams,
  // after each other's.
  void enqueue(CUstream_st *s, OpPtr op) {
    if (s->last)
      op->after.push_back(s->last);
    if (s == &legacy[s->device]) {
      for (CUstream_st *other : streams) {
        if (other->device == s->device && other->blocking && other->last)
          op->after.push_back(other->last);
      }
    } else if (s->blocking && legacy[s->device].last) {
      op->after.push_back(legacy[s->device].last);
    }
    s->last = op;
    pending.push_back(op);
  }

  void check_unused(const void *p, const char *call) {
    for (const OpPtr &op : pending) {
      for (const void *used : op->uses) {
        if (used == p) {
          violation(std::string(call) +
                    " of memory that work pending on a stream still uses");
        }
      }
    }
  }

  bool fail(const char *call) {
    auto it = failures.find(call);
    if (it == failures.end())
      return false;
    if (it->second-- > 0)
      return false;
    failures.erase(it);
    return true;
  }
};

Runtime &rt() {
  static Runtime runtime;
  return runtime;
}

thread_local int current_device = 0;

// Every entry point: one call at a time, then the device may progress.
struct Call {
  std::lock_guard<std::mutex> lock{rt().mutex};
  ~Call() { rt().progress(); }
};

std::string demangle(const std::string &name) {
  int status = 0;
  char *out = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (out == nullptr)
    return name;
  std::string readable(out);
  std::free(out);
  return readable;
}

// What one launch of the packing kernel does, run when its turn comes:
// every block, every thread, after checking that each row's tensor and the
// bucket are device memory of the launching device.
void run_pack_kernel(int device, bool words, dim3 grid, dim3 block,
                     const nncomm::PackEntry *table, size_t rows, char *bucket,
                     nncomm::DType wire, bool packing, nncomm::Scaling s,
                     bool copy, unsigned *flags) {
  Runtime &r = rt();
  if (flags != nullptr && !packing)
    violation("the checking pack_kernel launched to unpack");
  if (words && !nncomm::moves_words(table, rows, wire, copy))
    violation("the word-copy pack_kernel launched for rows that convert");
  const nncomm::PackEntry &last = table[rows - 1];
  const uint64_t tiles = last.first_tile + nncomm::row_tiles(last, wire);
  if (grid.x != tiles) {
    violation("pack_kernel launched with " + std::to_string(grid.x) +
              " blocks for a table of " + std::to_string(tiles) + " tiles");
  }
  uint64_t bucket_count = 0;
  for (size_t i = 0; i < rows; ++i) {
    const nncomm::PackEntry &e = table[i];
    const size_t size = nncomm::dtype_size(static_cast<nncomm::DType>(e.dtype));
    if (e.address != 0 && r.find(reinterpret_cast<const void *>(e.address),
                                 e.count * size, device) == nullptr) {
      violation("pack_kernel row " + std::to_string(i) +
                " is not device memory of the launching device");
    }
    bucket_count = e.bucket_offset + e.count;
  }
  if (r.find(bucket, bucket_count * nncomm::dtype_size(wire), device) ==
      nullptr) {
    violation("pack_kernel's bucket is not device memory of the launching "
              "device");
  }
  for (unsigned b = 0; b < grid.x; ++b) {
    nncomm::Finding block_found;
    for (unsigned t = 0; t < block.x; ++t) {
      const nncomm::Lane lane{t, block.x};
      nncomm::Finding found;
      if (flags == nullptr && words)
        nncomm::copy_bucket_tile(table, rows, bucket, wire, packing, b, lane);
      else if (flags == nullptr)
        nncomm::move_bucket_tile(table, rows, bucket, wire, packing, s, copy,
                                 b, lane);
      else if (words)
        nncomm::copy_bucket_tile<true>(table, rows, bucket, wire, packing, b,
                                       lane, &found);
      else
        nncomm::move_bucket_tile<true>(table, rows, bucket, wire, packing, s,
                                       copy, b, lane, &found);
      block_found.row = found.row;
      block_found.nonfinite |= found.nonfinite;
    }
    if (block_found.nonfinite)
      flags[block_found.row] = 1;
  }
}

void run_finite_kernel(dim3 grid, dim3 block, const void *p, size_t count,
                       nncomm::DType dt, unsigned *flag) {
  const uint64_t per_tile = nncomm::check_tile_elements(dt);
  if (grid.x != (count + per_tile - 1) / per_tile) {
    violation("finite_kernel launched with " + std::to_string(grid.x) +
              " blocks for " + std::to_string(count) + " elements");
  }
  for (unsigned b = 0; b < grid.x; ++b) {
    bool found = false;
    for (unsigned t = 0; t < block.x; ++t)
      found |= nncomm::check_tile(p, count, dt, b, nncomm::Lane{t, block.x});
    if (found)
      *flag = 1;
  }
}

} // namespace

void nncomm_fake_configure(uint64_t seed, unsigned eagerness) {
  Call call;
  rt().rng.seed(seed);
  rt().eagerness = eagerness;
}

void nncomm_fake_fail(const char *call, int after) {
  Call c;
  rt().failures[call] = after;
}

void nncomm_fake_hold(cudaStream_t stream) {
  Call call;
  OpPtr op = std::make_shared<Op>();
  op->work = [] {};
  op->held = true;
  rt().enqueue(rt().stream(stream, current_device), op);
}

cudaError_t nncomm_fake_enqueue(cudaStream_t stream,
                                std::function<void()> work) {
  return nncomm_fake_enqueue_until(stream, std::move(work), nullptr);
}

cudaError_t nncomm_fake_enqueue_until(cudaStream_t stream,
                                      std::function<void()> start,
                                      std::function<bool()> finished) {
  Call call;
  CUstream_st *s = rt().stream(stream, current_device);
  if (s->device != current_device)
    return cudaErrorInvalidResourceHandle;
  OpPtr op = std::make_shared<Op>();
  op->work = std::move(start);
  rt().enqueue(s, op);
  if (finished) {
    OpPtr wait = std::make_shared<Op>();
    wait->work = [] {};
    wait->finished = std::move(finished);
    rt().enqueue(s, wait);
  }
  return cudaSuccess;
}

size_t nncomm_fake_launches() {
  Call call;
  return rt().launches;
}

size_t nncomm_fake_copies() {
  Call call;
  return rt().copies;
}

size_t nncomm_fake_device_bytes() {
  Call call;
  size_t bytes = 0;
  for (const auto &a : rt().allocations) {
    if (a.second.device >= 0 && !a.second.imported)
      bytes += a.second.bytes;
  }
  return bytes;
}

size_t nncomm_fake_pending() {
  std::lock_guard<std::mutex> lock(rt().mutex);
  return rt().pending.size();
}

extern "C" {

const char *cudaGetErrorString(cudaError_t err) {
  switch (err) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorLaunchFailure: return "unspecified launch failure";
  case cudaErrorNotReady: return "device not ready";
  default: return "unknown error";
  }
}

cudaError_t cudaGetDeviceCount(int *count) {
  *count = kDevices;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *bus, int length, int device) {
  if (device < 0 || device >= kDevices || length < 13)
    return cudaErrorInvalidValue;
  std::snprintf(bus, length, "0000:%02x:00.0", 0x10 + device);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attributes,
                                     const void *p) {
  Call call;
  *attributes = cudaPointerAttributes{};
  attributes->type = cudaMemoryTypeUnregistered;
  for (int device = -1; device < kDevices; ++device) {
    if (rt().find(p, 1, device) != nullptr) {
      attributes->type =
          device < 0 ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
      attributes->device = device < 0 ? 0 : device;
    }
  }
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= kDevices)
    return cudaErrorInvalidDevice;
  current_device = device;
  return cudaSuccess;
}

// Device memory of the current device, or pinned memory (`pinned`);
// fresh memory holds garbage.
static cudaError_t allocate(void **p, size_t bytes, bool pinned,
                            const char *call) {
  if (rt().fail(call))
    return cudaErrorMemoryAllocation;
  const size_t rounded = (bytes + 255) / 256 * 256 + 256;
  char *mem = nullptr;
  Allocation a{bytes, pinned ? -1 : current_device};
  if (pinned) {
    mem = static_cast<char *>(std::aligned_alloc(256, rounded));
  } else {
    a.fd = memfd_create("fake_cudart", MFD_CLOEXEC);
    if (a.fd < 0 || ftruncate(a.fd, rounded) != 0)
      violation("memfd_create for device memory failed");
    void *m = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd,
                   0);
    if (m == MAP_FAILED)
      violation("mmap of device memory failed");
    mem = static_cast<char *>(m);
    a.mapped = rounded;
  }
  std::memset(mem, 0xCD, bytes);
  rt().allocations[mem] = a;
  *p = mem;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
  Call call;
  return allocate(p, bytes, false, "cudaMalloc");
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
  Call call;
  return allocate(p, bytes, true, "cudaMallocHost");
}

// Frees what allocate() gave, unless work still pending uses it.
static cudaError_t release(void *p, bool pinned, const char *call) {
  if (p == nullptr)
    return cudaSuccess;
  auto it = rt().allocations.find(static_cast<char *>(p));
  if (it == rt().allocations.end() || (it->second.device == -1) != pinned)
    return cudaErrorInvalidValue;
  if (it->second.imported)
    return cudaErrorInvalidValue; // cudaIpcCloseMemHandle's to unmap
  rt().check_unused(p, call);
  const Allocation a = it->second;
  rt().allocations.erase(it);
  if (pinned) {
    std::free(p);
  } else {
    munmap(p, a.mapped);
    close(a.fd);
  }
  return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
  Call call;
  return release(p, false, "cudaFree");
}

cudaError_t cudaFreeHost(void *p) {
  Call call;
  return release(p, true, "cudaFreeHost");
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *p) {
  Call call;
  auto it = rt().allocations.find(static_cast<char *>(p));
  if (it == rt().allocations.end() || it->second.device < 0 ||
      it->second.imported)
    return cudaErrorInvalidValue;
  std::memset(handle, 0, sizeof *handle);
  const IpcName name{getpid(), it->second.fd, it->second.bytes,
                     it->second.mapped};
  std::memcpy(handle, &name, sizeof name);
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t handle,
                                 unsigned) {
  Call call;
  if (rt().fail("cudaIpcOpenMemHandle"))
    return cudaErrorMemoryAllocation;
  IpcName name;
  std::memcpy(&name, &handle, sizeof name);
  if (name.pid == getpid())
    return cudaErrorInvalidValue; // CUDA maps another process's only
  const std::string path = "/proc/" + std::to_string(name.pid) + "/fd/" +
                           std::to_string(name.fd);
  const int fd = open(path.c_str(), O_RDWR);
  if (fd < 0)
    return cudaErrorInvalidValue;
  void *m = mmap(nullptr, name.mapped, PROT_READ | PROT_WRITE, MAP_SHARED,
                 fd, 0);
  close(fd);
  if (m == MAP_FAILED)
    return cudaErrorMemoryAllocation;
  Allocation a{name.bytes, current_device};
  a.mapped = name.mapped;
  a.imported = true;
  rt().allocations[static_cast<char *>(m)] = a;
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *p) {
  Call call;
  auto it = rt().allocations.find(static_cast<char *>(p));
  if (it == rt().allocations.end() || !it->second.imported)
    return cudaErrorInvalidValue;
  rt().check_unused(p, "cudaIpcCloseMemHandle");
  munmap(p, it->second.mapped);
  rt().allocations.erase(it);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  Call call;
  if (rt().fail("cudaStreamCreateWithFlags"))
    return cudaErrorMemoryAllocation;
  *s = new CUstream_st{current_device, (flags & cudaStreamNonBlocking) == 0};
  rt().streams.insert(*s);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Call call;
  rt().streams.erase(s);
  delete s; // its work stays pending; ops hold each other, not the stream
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Call call;
  rt().wait(rt().stream(s, current_device)->last);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  Call call;
  rt().drain();
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s,
                                  cudaStreamCaptureStatus *status) {
  Call call;
  *status = rt().stream(s, current_device)->capturing
                ? cudaStreamCaptureStatusActive
                : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  Call call;
  if (s == nullptr)
    return cudaErrorInvalidValue; // the legacy stream cannot be captured
  s->capturing = true;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
  Call call;
  s->capturing = false;
  *graph = nullptr;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
  Call call;
  if (rt().fail("cudaEventCreateWithFlags"))
    return cudaErrorMemoryAllocation;
  *e = new CUevent_st{current_device, nullptr};
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  Call call;
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  Call call;
  CUstream_st *s = rt().stream(stream, current_device);
  if (s->device != current_device || e->device != s->device)
    return cudaErrorInvalidResourceHandle;
  OpPtr op = std::make_shared<Op>();
  op->work = [] {};
  rt().enqueue(s, op);
  e->recorded = op;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  Call call;
  rt().wait(e->recorded); // never recorded: complete
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  Call call;
  if (e->recorded == nullptr || e->recorded->done)
    return cudaSuccess;
  return cudaErrorNotReady;
}

// The time between the host's running the two records' work.
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start,
                                 cudaEvent_t end) {
  Call call;
  if (start->recorded == nullptr || end->recorded == nullptr)
    return cudaErrorInvalidResourceHandle;
  if (!start->recorded->done || !end->recorded->done)
    return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->recorded->ran -
                                                 start->recorded->ran)
            .count();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned) {
  Call call;
  CUstream_st *s = rt().stream(stream, current_device);
  OpPtr op = std::make_shared<Op>();
  op->work = [] {};
  if (e->recorded) // the record made before this call, not a later one
    op->after.push_back(e->recorded);
  rt().enqueue(s, op);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                            cudaMemcpyKind kind, cudaStream_t stream) {
  Call call;
  Runtime &r = rt();
  CUstream_st *s = r.stream(stream, current_device);
  if (s->device != current_device)
    return cudaErrorInvalidResourceHandle;
  const int dst_device = kind == cudaMemcpyDeviceToHost ? -1 : s->device;
  const int src_device = kind == cudaMemcpyHostToDevice ? -1 : s->device;
  const char *d = r.find(dst, bytes, dst_device);
  const char *from = r.find(src, bytes, src_device);
  if (d == nullptr || from == nullptr)
    return cudaErrorInvalidValue; // the fake copies device or pinned memory
  OpPtr op = std::make_shared<Op>();
  op->work = [=] { std::memcpy(dst, src, bytes); };
  op->uses = {d, from};
  r.enqueue(s, op);
  ++r.copies;
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes,
                            cudaStream_t stream) {
  Call call;
  Runtime &r = rt();
  CUstream_st *s = r.stream(stream, current_device);
  if (s->device != current_device)
    return cudaErrorInvalidResourceHandle;
  const char *d = r.find(dst, bytes, s->device);
  if (d == nullptr)
    return cudaErrorInvalidValue;
  OpPtr op = std::make_shared<Op>();
  op->work = [=] { std::memset(dst, value, bytes); };
  op->uses = {d};
  r.enqueue(s, op);
  return cudaSuccess;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block,
                             void **args, size_t shared, cudaStream_t stream) {
  Call call;
  Runtime &r = rt();
  if (r.fail("cudaLaunchKernel"))
    return cudaErrorLaunchFailure;
  auto it = r.kernels.find(func);
  if (it == r.kernels.end())
    violation("cudaLaunchKernel of a function never registered");
  const std::string name = demangle(it->second);
  if (grid.x == 0 || grid.y != 1 || grid.z != 1 || block.x == 0 ||
      block.x > 1024 || block.y != 1 || block.z != 1 || shared != 0)
    return cudaErrorInvalidValue;
  CUstream_st *s = r.stream(stream, current_device);
  if (s->device != current_device)
    return cudaErrorInvalidResourceHandle;
  // Arguments are copied at launch, as CUDA does.
  if (name == kSumKernel) {
    auto sources = *static_cast<const nncomm::SumSources *>(args[0]);
    auto out = *static_cast<void *const *>(args[1]);
    auto count = *static_cast<const size_t *>(args[2]);
    auto dt = *static_cast<const nncomm::DType *>(args[3]);
    auto scale = *static_cast<const float *>(args[4]);
    auto after = *static_cast<const nncomm::Scaling *>(args[5]);
    const size_t bytes = count * nncomm::dtype_size(dt);
    OpPtr op = std::make_shared<Op>();
    for (int k = 0; k < sources.count; ++k) {
      const char *from = r.find(sources.at[k], bytes, s->device);
      if (from == nullptr)
        violation("sum_kernel's source " + std::to_string(k) +
                  " is not device memory of its device");
      op->uses.push_back(from);
    }
    const char *to = r.find(out, bytes, s->device);
    if (to == nullptr)
      violation("sum_kernel's output is not device memory of its device");
    op->uses.push_back(to);
    if (grid.x != (count + nncomm::kSumTileElements - 1) /
                      nncomm::kSumTileElements)
      violation("sum_kernel launched with " + std::to_string(grid.x) +
                " blocks for " + std::to_string(count) + " elements");
    op->work = [=] {
      for (unsigned b = 0; b < grid.x; ++b) {
        for (unsigned t = 0; t < block.x; ++t)
          nncomm::sum_tile(sources, out, count, dt, scale, after, b,
                           nncomm::Lane{t, block.x});
      }
    };
    r.enqueue(s, op);
    ++r.launches;
    return cudaSuccess;
  }
  if (name == kFiniteKernel) {
    auto p = *static_cast<const void *const *>(args[0]);
    auto count = *static_cast<const size_t *>(args[1]);
    auto dt = *static_cast<const nncomm::DType *>(args[2]);
    auto flag = *static_cast<unsigned *const *>(args[3]);
    const char *array = r.find(p, count * nncomm::dtype_size(dt), s->device);
    const char *flag_allocation = r.find(flag, sizeof *flag, s->device);
    if (array == nullptr || flag_allocation == nullptr)
      violation("finite_kernel's array or flag is not device memory of its "
                "device");
    OpPtr op = std::make_shared<Op>();
    op->work = [=] { run_finite_kernel(grid, block, p, count, dt, flag); };
    op->uses = {array, flag_allocation};
    r.enqueue(s, op);
    ++r.launches;
    return cudaSuccess;
  }
  bool words = false, check = false;
  for (int k = 0; k < 4; ++k) {
    if (name == pack_kernel_name(k & 1, k & 2))
      words = k & 1, check = k & 2;
  }
  if (name != pack_kernel_name(words, check))
    violation("the fake runs nncomm's pack_kernel, finite_kernel and "
              "sum_kernel only, not " + name);
  auto table = *static_cast<const nncomm::PackEntry *const *>(args[0]);
  auto rows = *static_cast<const size_t *>(args[1]);
  auto bucket = *static_cast<char *const *>(args[2]);
  auto wire = *static_cast<const nncomm::DType *>(args[3]);
  auto packing = *static_cast<const bool *>(args[4]);
  auto scaling = *static_cast<const nncomm::Scaling *>(args[5]);
  auto copy = *static_cast<const bool *>(args[6]);
  auto flags = *static_cast<unsigned *const *>(args[7]);
  if ((flags != nullptr) != check)
    violation("pack_kernel's flags do not match its check");
  const char *table_allocation =
      r.find(table, rows * sizeof(nncomm::PackEntry), s->device);
  if (rows == 0 || table_allocation == nullptr)
    violation("pack_kernel's table is not device memory of its device");
  const char *flags_allocation =
      check ? r.find(flags, rows * sizeof *flags, s->device) : nullptr;
  if (check && flags_allocation == nullptr)
    violation("pack_kernel's flags are not device memory of its device");
  const int device = s->device;
  OpPtr op = std::make_shared<Op>();
  op->work = [=] {
    run_pack_kernel(device, words, grid, block, table, rows, bucket, wire,
                    packing, scaling, copy, flags);
  };
  op->uses = {table_allocation};
  if (check)
    op->uses.push_back(flags_allocation);
  r.enqueue(s, op);
  ++r.launches;
  return cudaSuccess;
}

// Registration of the fat binary's kernels, which nvcc's generated code
// calls at start-up: the fake keeps each kernel's name.
void **__cudaRegisterFatBinary(void *) {
  static void *handle = nullptr;
  return &handle;
}

void __cudaRegisterFatBinaryEnd(void **) {}

void __cudaUnregisterFatBinary(void **) {}

char __cudaInitModule(void **) { return 1; }

void __cudaRegisterFunction(void **, const char *host, char *, const char *name,
                            int, uint3 *, uint3 *, dim3 *, dim3 *, int *) {
  rt().kernels[host] = name;
}

// The <<<>>> launch path, which the packer does not use.
cudaError_t __cudaGetKernel(cudaKernel_t *, const void *) {
  return cudaErrorNotSupported;
}

cudaError_t __cudaPopCallConfiguration(dim3 *, dim3 *, size_t *, void *) {
  violation("<<<>>> launches are not emulated");
}

cudaError_t __cudaLaunchKernel(cudaKernel_t, dim3, dim3, void **, size_t,
                               cudaStream_t) {
  violation("<<<>>> launches are not emulated");
}

} // extern "C"
