#include "nncomm/transports/ipc_transport.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_calls.hpp"
#include "cuda/sum_tile.cuh"
#include "nncomm/core/broken_process.hpp"
#include "nncomm/core/scaling.hpp"
#include "nncomm/observability/config.hpp"
#include "nncomm/transports/join.hpp"

namespace nncomm {

namespace {

constexpr int kSumThreads = 256;
static_assert(IpcTransport::kMaxRanks == kSumMaxSources,
              "one sum reads every rank's slot");

__global__ void __launch_bounds__(kSumThreads)
    sum_kernel(SumSources sources, void *out, size_t count, DType dt,
               float scale, Scaling after) {
  sum_tile(sources, out, count, dt, scale, after, blockIdx.x,
           Lane{threadIdx.x, blockDim.x});
}

} // namespace

// Each rank's two slots, this rank's own and the others' mapped here.
struct IpcTransport::Slots {
  // Bytes of one slot: a chunk's (config::ipc_chunk_bytes()). Large
  // enough that a chunk's host round (an event's completion seen, a
  // barrier) is a small part of its time.
  size_t bytes = 0;
  int rank = 0;
  char *own = nullptr;       // bytes * 2
  std::vector<char *> bases; // by rank; bases[rank] == own
  cudaEvent_t filled = nullptr;
  uint64_t chunks = 0; // gone through the slots: the next one's slot

  bool exported = false; // another process may have mapped `own`
  bool in_use = false;   // by a transport (Pool's, under its lock)

  // The caller has made this rank's reads of the others' slots complete.
  // CUDA leaves freeing memory that another process still maps undefined,
  // and no rank can tell, without a round the others may not be there
  // for, when the others' last reads of this rank's slots completed: an
  // exported allocation is kept until the process ends.
  ~Slots() {
    for (size_t r = 0; r < bases.size(); ++r) {
      if (bases[r] != nullptr && bases[r] != own)
        cudaIpcCloseMemHandle(bases[r]);
    }
    if (!exported)
      cudaFree(own);
    if (filled != nullptr)
      cudaEventDestroy(filled);
  }

  char *slot(int r, uint64_t chunk) const {
    return bases[r] + (chunk % 2) * bytes;
  }
  // Every rank's slot of `chunk`, `offset` bytes in.
  SumSources sources(uint64_t chunk, size_t offset) const {
    SumSources s{};
    s.count = static_cast<int>(bases.size());
    for (int r = 0; r < s.count; ++r)
      s.at[r] = slot(r, chunk) + offset;
    return s;
  }
};

// One operation in chunks. Chunk i: fill(i, slot) enqueues this rank's
// copies into its slot; once they have completed (seen on the host) the
// ranks meet in a barrier on the host transport; then use(i, slot)
// enqueues the reads of every rank's slot into this rank's result.
class IpcTransport::Chunked : public Work {
public:
  Chunked(IpcTransport &t, const char *name, size_t chunks, Step fill,
          Step use)
      : t_(t), name_(name), chunks_(chunks), fill_(std::move(fill)),
        use_(std::move(use)) {}

  Status begin() { return broken_if(chunks_ == 0 ? Status::Ok() : fill()); }

  Status test(bool *done) override { return broken_if(step(done)); }

  Stall inspect() override { return meeting_ ? meeting_->inspect() : Stall(); }

  std::string describe() const override {
    std::string what = std::string("the CUDA IPC ") + name_ + ", chunk " +
                       std::to_string(next_ + 1) + " of " +
                       std::to_string(chunks_);
    if (meeting_)
      return what + " (" + meeting_->describe() + ")";
    return what + " (its copy into device memory)";
  }

private:
  // A rank whose operation failed half-way has advanced its slots, and the
  // others may be in its chunk's barrier: no later operation may pair with
  // theirs.
  Status broken_if(Status s) const {
    if (!s.ok())
      mark_broken(std::string("the CUDA IPC ") + name_ + " failed: " +
                      s.message(),
                  false);
    return s;
  }

  Status step(bool *done) {
    *done = false;
    while (next_ < chunks_) {
      if (!meeting_) {
        const cudaError_t err = cudaEventQuery(t_.slots_->filled);
        if (err == cudaErrorNotReady)
          return Status::Ok();
        NNCOMM_RETURN_IF_ERROR(cuda_status(err, "cudaEventQuery"));
        NNCOMM_RETURN_IF_ERROR(t_.host().start_barrier(&meeting_));
      }
      bool met = false;
      NNCOMM_RETURN_IF_ERROR(meeting_->test(&met));
      if (!met)
        return Status::Ok();
      meeting_.reset();
      DeviceScope scope;
      NNCOMM_RETURN_IF_ERROR(scope.enter(t_.device()));
      NNCOMM_RETURN_IF_ERROR(use_(next_, t_.slots_->chunks++));
      if (++next_ < chunks_)
        NNCOMM_RETURN_IF_ERROR(fill());
    }
    *done = true;
    return Status::Ok();
  }

  Status fill() {
    DeviceScope scope;
    NNCOMM_RETURN_IF_ERROR(scope.enter(t_.device()));
    NNCOMM_RETURN_IF_ERROR(fill_(next_, t_.slots_->chunks));
    NNCOMM_CUDA_CALL(cudaEventRecord, t_.slots_->filled,
                     static_cast<cudaStream_t>(t_.stream()));
    return Status::Ok();
  }

  IpcTransport &t_;
  const char *const name_; // a literal
  const size_t chunks_;
  const Step fill_, use_;
  size_t next_ = 0;
  WorkPtr meeting_; // the barrier of chunk next_, once its fill completed
};

// Every rank's slots of every transport made, by the processes they serve
// (their ids in rank order), their device and their size: a transport
// gone leaves its slots, still mapped by the other processes, to the next
// transport over the same processes that all of them can give them to.
// Never freed (see Slots).
class IpcTransport::Pool {
public:
  struct Key {
    std::vector<int64_t> processes;
    int device;
    size_t bytes;
    bool operator<(const Key &o) const {
      return std::tie(processes, device, bytes) <
             std::tie(o.processes, o.device, o.bytes);
    }
  };
  // The most slots per key whose reuse can be agreed (one bit each).
  static constexpr size_t kMaxReusable = 64;

  static Pool &get() {
    static Pool *pool = new Pool; // outlives the CUDA runtime's teardown
    return *pool;
  }
  // Bit i: slots i of `key` exist and no transport uses them.
  uint64_t free_mask(const Key &key) {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t mask = 0;
    const auto &all = slots_[key];
    for (size_t i = 0; i < all.size() && i < kMaxReusable; ++i) {
      if (!all[i]->in_use)
        mask |= uint64_t(1) << i;
    }
    return mask;
  }
  Slots *take(const Key &key, size_t i) {
    std::lock_guard<std::mutex> lock(mutex_);
    Slots *slots = slots_[key][i].get();
    slots->in_use = true;
    slots->chunks = 0; // every rank's starts at the first slot
    return slots;
  }
  // New slots of `key`, mapped by every rank: the key's next index on
  // every rank, as every rank adds them in the same collective step.
  Slots *add(const Key &key, std::unique_ptr<Slots> slots) {
    std::lock_guard<std::mutex> lock(mutex_);
    slots->in_use = true;
    slots_[key].push_back(std::move(slots));
    return slots_[key].back().get();
  }
  void give_back(Slots *slots) {
    std::lock_guard<std::mutex> lock(mutex_);
    slots->in_use = false;
  }

private:
  std::mutex mutex_;
  std::map<Key, std::vector<std::unique_ptr<Slots>>> slots_;
};

IpcTransport::IpcTransport(std::unique_ptr<StagedTransport> staged,
                           Slots *slots)
    : staged_(std::move(staged)), slots_(slots) {}

IpcTransport::~IpcTransport() {
  // This rank's reads of the others' slots, and its copies into its own,
  // end before another transport may take them.
  if (staged_ != nullptr)
    cudaStreamSynchronize(static_cast<cudaStream_t>(staged_->stream()));
  Pool::get().give_back(slots_);
}

Status IpcTransport::Create(std::unique_ptr<StagedTransport> *over,
                            std::unique_ptr<IpcTransport> *out) {
  StagedTransport *staged = over->get();
  const int ranks = staged->size();
  if (ranks > kMaxRanks) {
    return Status::InvalidArgument(
        "CUDA IPC serves groups of at most " + std::to_string(kMaxRanks) +
        " ranks, not " + std::to_string(ranks));
  }
  // 256-byte aligned slots, so every dtype's chunks are aligned.
  const size_t bytes = config::ipc_chunk_bytes() / 256 * 256;
  Pool::Key key{std::vector<int64_t>(ranks), staged->device(), bytes};
  const int64_t process = getpid();
  NNCOMM_RETURN_IF_ERROR(staged->host().allgather(
      &process, key.processes.data(), 1, DType::kInt64));
  // Slots that no rank's transport uses any more, if any: every rank's
  // slots of one index were made together, and the others keep theirs
  // mapped. (Transports over the same processes are made one at a time:
  // nothing takes slots between this look and the take.)
  const int64_t mine_free = static_cast<int64_t>(Pool::get().free_mask(key));
  std::vector<int64_t> free(ranks);
  NNCOMM_RETURN_IF_ERROR(staged->host().allgather(&mine_free, free.data(), 1,
                                                  DType::kInt64));
  uint64_t common = ~uint64_t(0);
  for (int64_t f : free)
    common &= static_cast<uint64_t>(f);
  if (common != 0) {
    size_t i = 0;
    while ((common >> i & 1) == 0)
      ++i;
    out->reset(new IpcTransport(std::move(*over), Pool::get().take(key, i)));
    return Status::Ok();
  }
  std::unique_ptr<Slots> slots(new Slots);
  slots->rank = staged->rank();
  slots->bytes = bytes;
  cudaIpcMemHandle_t mine;
  std::memset(&mine, 0, sizeof mine);
  const Status made = [&] {
    NNCOMM_CUDA_CALL(cudaMalloc, reinterpret_cast<void **>(&slots->own),
                     2 * slots->bytes);
    NNCOMM_CUDA_CALL(cudaIpcGetMemHandle, &mine, slots->own);
    slots->exported = true;
    NNCOMM_CUDA_CALL(cudaEventCreateWithFlags, &slots->filled,
                     cudaEventDisableTiming);
    return Status::Ok();
  }();
  NNCOMM_RETURN_IF_ERROR(fail_together(
      *staged, made, "allocating device memory to share (CUDA IPC)"));
  static_assert(sizeof mine % sizeof(int64_t) == 0, "whole words");
  std::vector<cudaIpcMemHandle_t> all(ranks);
  NNCOMM_RETURN_IF_ERROR(staged->host().allgather(
      &mine, all.data(), sizeof mine / sizeof(int64_t), DType::kInt64));
  slots->bases.assign(ranks, nullptr);
  const Status opened = [&] {
    for (int r = 0; r < ranks; ++r) {
      if (r == slots->rank) {
        slots->bases[r] = slots->own;
        continue;
      }
      void *p = nullptr;
      NNCOMM_CUDA_CALL(cudaIpcOpenMemHandle, &p, all[r],
                       cudaIpcMemLazyEnablePeerAccess);
      slots->bases[r] = static_cast<char *>(p);
    }
    return Status::Ok();
  }();
  NNCOMM_RETURN_IF_ERROR(fail_together(
      *staged, opened,
      "mapping the other ranks' device memory (CUDA IPC; ranks on one "
      "host whose GPUs can reach each other's memory)"));
  out->reset(new IpcTransport(std::move(*over),
                              Pool::get().add(key, std::move(slots))));
  return Status::Ok();
}

namespace {

// An operation's chunks of at most `per_chunk` elements.
size_t chunks_of(size_t count, size_t per_chunk) {
  return (count + per_chunk - 1) / per_chunk;
}

// The elements of chunk `i`.
size_t chunk_count(size_t i, size_t per_chunk, size_t count) {
  return std::min(per_chunk, count - i * per_chunk);
}

Status copy(void *dst, const void *src, size_t bytes, CudaStream stream) {
  NNCOMM_CUDA_CALL(cudaMemcpyAsync, dst, src, bytes, cudaMemcpyDeviceToDevice,
                   static_cast<cudaStream_t>(stream));
  return Status::Ok();
}

// out = (sum over ranks of sources * scale) / divisor, as the host's.
Status sum(const SumSources &sources, void *out, size_t count, DType dt,
           float scale, int divisor, CudaStream stream) {
  const unsigned blocks =
      static_cast<unsigned>(chunks_of(count, kSumTileElements));
  SumSources in = sources;
  Scaling after = make_scaling(1.0f, divisor);
  void *args[] = {&in, &out, &count, &dt, &scale, &after};
  NNCOMM_CUDA_CALL(cudaLaunchKernel, reinterpret_cast<const void *>(&sum_kernel),
                   dim3(blocks), dim3(kSumThreads), args, 0,
                   static_cast<cudaStream_t>(stream));
  return Status::Ok();
}

} // namespace

Status IpcTransport::start(const char *name, size_t chunks, Step fill,
                           Step use, WorkPtr *work) {
  std::unique_ptr<Chunked> chunked(
      new Chunked(*this, name, chunks, std::move(fill), std::move(use)));
  NNCOMM_RETURN_IF_ERROR(chunked->begin());
  *work = std::move(chunked);
  return Status::Ok();
}

bool IpcTransport::staged(size_t bytes) const {
  // Inside comm.join() the ranks that left take part in each operation by
  // its MPI calls (join.hpp), which an IPC operation does not describe.
  return Join::open() || bytes < config::ipc_min_bytes();
}

Status IpcTransport::start_allreduce(void *buf, size_t count, DType dt,
                                     float scale, int divisor,
                                     WorkPtr *work) {
  if (staged(count * dtype_size(dt)))
    return staged_->start_allreduce(buf, count, dt, scale, divisor, work);
  return start_sum("all_reduce", buf, count, dt, scale, divisor, true, work);
}

Status IpcTransport::start_reduce(void *buf, size_t count, DType dt, int root,
                                  int divisor, WorkPtr *work) {
  if (staged(count * dtype_size(dt)))
    return staged_->start_reduce(buf, count, dt, root, divisor, work);
  return start_sum("reduce", buf, count, dt, 1.0f, divisor, rank() == root,
                   work);
}

Status IpcTransport::start_sum(const char *name, void *buf, size_t count,
                               DType dt, float scale, int divisor,
                               bool receives, WorkPtr *work) {
  const size_t size = dtype_size(dt);
  const size_t per = slots_->bytes / size;
  char *data = static_cast<char *>(buf);
  const Slots &slots = *slots_;
  const CudaStream s = stream();
  return start(
      name, chunks_of(count, per),
      [=, &slots](size_t i, uint64_t k) {
        return copy(slots.slot(slots.rank, k), data + i * per * size,
                    chunk_count(i, per, count) * size, s);
      },
      [=, &slots](size_t i, uint64_t k) {
        if (!receives)
          return Status::Ok();
        return sum(slots.sources(k, 0), data + i * per * size,
                   chunk_count(i, per, count), dt, scale, divisor, s);
      },
      work);
}

Status IpcTransport::start_bcast(void *buf, size_t count, DType dt, int root,
                                 WorkPtr *work) {
  const size_t size = dtype_size(dt);
  if (staged(count * size))
    return staged_->start_bcast(buf, count, dt, root, work);
  const size_t per = slots_->bytes / size;
  char *data = static_cast<char *>(buf);
  const Slots &slots = *slots_;
  const CudaStream s = stream();
  const bool is_root = rank() == root;
  return start(
      "bcast", chunks_of(count, per),
      [=, &slots](size_t i, uint64_t k) {
        if (!is_root)
          return Status::Ok();
        return copy(slots.slot(slots.rank, k), data + i * per * size,
                    chunk_count(i, per, count) * size, s);
      },
      [=, &slots](size_t i, uint64_t k) {
        if (is_root)
          return Status::Ok();
        return copy(data + i * per * size, slots.slot(root, k),
                    chunk_count(i, per, count) * size, s);
      },
      work);
}

// Chunk i is elements [i * per, ...) of every rank's block.
Status IpcTransport::start_allgather(const void *send, void *recv,
                                     size_t count, DType dt, WorkPtr *work) {
  const size_t size = dtype_size(dt);
  if (staged(count * size * this->size()))
    return staged_->start_allgather(send, recv, count, dt, work);
  const size_t per = slots_->bytes / size;
  const char *from = static_cast<const char *>(send);
  char *to = static_cast<char *>(recv);
  const Slots &slots = *slots_;
  const CudaStream s = stream();
  const int ranks = this->size();
  return start(
      "all_gather", chunks_of(count, per),
      [=, &slots](size_t i, uint64_t k) {
        return copy(slots.slot(slots.rank, k), from + i * per * size,
                    chunk_count(i, per, count) * size, s);
      },
      [=, &slots](size_t i, uint64_t k) {
        for (int r = 0; r < ranks; ++r) {
          NNCOMM_RETURN_IF_ERROR(
              copy(to + (r * count + i * per) * size, slots.slot(r, k),
                   chunk_count(i, per, count) * size, s));
        }
        return Status::Ok();
      },
      work);
}

// Chunk i is elements [i * per, ...) of every block; a rank's slot holds
// its part of each block, block after block.
Status IpcTransport::start_reduce_scatter(const void *send, void *recv,
                                          size_t count, DType dt, int divisor,
                                          WorkPtr *work) {
  const size_t size = dtype_size(dt);
  const int ranks = this->size();
  if (staged(count * size * ranks)) {
    return staged_->start_reduce_scatter(send, recv, count, dt, divisor,
                                         work);
  }
  const size_t per = slots_->bytes / size / ranks;
  const char *from = static_cast<const char *>(send);
  char *to = static_cast<char *>(recv);
  const Slots &slots = *slots_;
  const CudaStream s = stream();
  const int me = rank();
  return start(
      "reduce_scatter", chunks_of(count, per),
      [=, &slots](size_t i, uint64_t k) {
        const size_t n = chunk_count(i, per, count);
        for (int b = 0; b < ranks; ++b) {
          NNCOMM_RETURN_IF_ERROR(copy(slots.slot(slots.rank, k) + b * n * size,
                                      from + (b * count + i * per) * size,
                                      n * size, s));
        }
        return Status::Ok();
      },
      [=, &slots](size_t i, uint64_t k) {
        const size_t n = chunk_count(i, per, count);
        return sum(slots.sources(k, me * n * size), to + i * per * size, n,
                   dt, 1.0f, divisor, s);
      },
      work);
}

} // namespace nncomm
