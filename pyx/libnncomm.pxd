# Declarations of nncomm's C++ core (include/nncomm/) that need MPI. Nothing
# but externs: the logic lives in src/, the Python-facing code in the .pxi
# files. Status and DType are in libcore.pxd.

from libc.stddef cimport size_t
from libc.stdint cimport uint64_t, uintptr_t
from libcpp cimport bool
from libcpp.memory cimport shared_ptr, unique_ptr
from libcpp.string cimport string
from libcpp.vector cimport vector
from mpi4py.libmpi cimport MPI_Comm

from libcore cimport DType, Status


cdef extern from "nncomm/collectives/list_collectives.hpp" namespace "nncomm" nogil:
    struct ArrayRef:
        void* ptr
        size_t count
        DType dtype
        uint64_t tag

    struct Materializer:
        void* (*fn)(void* context, size_t index) noexcept
        void* context


cdef extern from "nncomm/core/bucket_plan.hpp" namespace "nncomm" nogil:
    struct TensorSpec:
        size_t count
        DType dtype

    struct Segment:
        size_t tensor
        size_t tensor_offset
        size_t count

    cdef cppclass Bucket:
        DType dtype
        size_t count
        bool direct
        vector[Segment] segments
        vector[size_t] tensors

    vector[Bucket] plan_buckets(const vector[TensorSpec]& tensors,
                                const vector[size_t]& order, size_t pack_size,
                                bool keep_dtype, DType wire,
                                size_t direct_bytes)
    void prioritize(const vector[double]& priorities, vector[Bucket]* plan)
    void merge_buckets(size_t floor_bytes, vector[Bucket]* plan)
    uint64_t plan_fingerprint(const vector[Bucket]& plan)


cdef extern from "nncomm/core/launch_tuner.hpp" namespace "nncomm" nogil:
    enum class Launch(int):
        kEager
        kDeferred


cdef extern from "nncomm/transports/transport.hpp" namespace "nncomm" nogil:
    cdef cppclass Work:
        pass

    cdef cppclass Transport:
        int rank()
        int size()
        Transport& host()
        Status allreduce(void* buf, size_t count, DType dt, float scale,
                         int divisor, const Polling* polling)
        Status start_allgather(const void* send, void* recv, size_t count,
                               DType dt, unique_ptr[Work]* work)


cdef extern from "nncomm/core/wait.hpp" namespace "nncomm" nogil:
    cdef cppclass Polling:
        pass

    Status wait_for(Work& work, bool warn, const Polling* polling)


cdef extern from "nncomm/core/bucket_hook.hpp" namespace "nncomm" nogil:
    struct HookedBucket:
        size_t index
        size_t buckets
        const Bucket* bucket
        void* buffer
        size_t count
        DType dtype
        int divisor
        void* stream
        int device

    cdef cppclass BucketHook:
        pass


cdef extern from "nncomm/core/owner_reduction.hpp" namespace "nncomm" nogil:
    cdef cppclass OwnerReduction(BucketHook):
        OwnerReduction(vector[size_t] starts, vector[size_t] bounds)


cdef extern from "python_hook.hpp" namespace "nncomm" nogil:
    ctypedef Status (*HookCall "nncomm::PythonHook::Call")(
        void* owner, const HookedBucket& bucket, Transport& transport,
        const Polling& polling) noexcept

    cdef cppclass PythonHook(BucketHook):
        PythonHook(HookCall call, void* owner)


cdef extern from "nncomm/core/engine.hpp" namespace "nncomm" nogil:
    cdef cppclass NonFiniteTensors:
        int rank
        size_t count
        vector[size_t] tensors

    cdef cppclass Engine:
        Status add_plan(vector[Bucket] plan, size_t* id)
        void drop_plan(size_t id)
        Status begin(size_t plan, float scale, int divisor, bool check_finite,
                     BucketHook* hook)
        void mark_ready(size_t tensor, void* ptr, DType dtype)
        void note_nonfinite(size_t tensor)
        void fail(const string& message)
        Status finish()
        vector[NonFiniteTensors] nonfinite()
        Launch launch(size_t plan, bool* decided)
        vector[size_t] launched()
        size_t written_back()


cdef extern from "nncomm/core/readiness.hpp" namespace "nncomm" nogil:
    cdef cppclass ReadinessTable:
        ReadinessTable(const vector[uintptr_t]& keys,
                       vector[vector[size_t]] written,
                       size_t num_gradients) except +
        long find(uintptr_t key) const

    cdef cppclass Readiness:
        # Changed through BackwardCounts (libnnabla.pxd) only.
        bool active() const
        const ReadinessTable& table() const
        bool called(size_t function) const
        int pending(size_t gradient) const
        size_t calls_left() const
        uintptr_t last() const


cdef extern from "nncomm/collectives/group.hpp" namespace "nncomm" nogil:
    ctypedef void* CudaStream
    struct Placement:
        bool on_device
        CudaStream stream

    cdef cppclass Group:
        @staticmethod
        Status Create(MPI_Comm comm, unique_ptr[Group]* out)
        Status create_subgroup(const vector[int]& ranks, const string& name,
                               unique_ptr[Group]* out)
        Status create_engine(const Placement& where,
                             const vector[ArrayRef]& gradients,
                             size_t num_tensors, int poll_us,
                             unique_ptr[Engine]* out)
        Status check_placed(const vector[ArrayRef]& arrays)
        const char* device_transport()
        size_t bucket_floor_bytes()
        string take_advice()
        bool has_advice()
        int rank()
        int size()
        int local_rank()
        void abort(int errorcode)
        Status barrier()
        Status open_join(bool throw_early)
        Status count_training(int* training)
        Status agree(uint64_t value, bool* same, const char* what)
        Status unite(uint64_t* words, size_t count, const char* what)
        Status allgather(const void* send, void* recv, size_t count,
                         DType dt)
        Status all_reduce(const Placement& where, vector[ArrayRef]& arrays,
                          bool division, float scale, bool fuse,
                          Materializer materialize)
        Status reduce(const Placement& where, const vector[ArrayRef]& arrays,
                      int root, bool division, bool fuse)
        Status bcast(const Placement& where, const vector[ArrayRef]& arrays,
                     int root, bool fuse)
        Status all_gather(const Placement& where, const ArrayRef& send,
                          const vector[ArrayRef]& recv)
        Status all_gatherv(const Placement& where, const ArrayRef& send,
                           const vector[size_t]& counts,
                           const vector[ArrayRef]& recv)
        Status alltoall(const Placement& where, const ArrayRef& send,
                        const vector[size_t]& send_counts,
                        const ArrayRef& recv,
                        const vector[size_t]& recv_counts)
        Status reduce_scatter(const Placement& where,
                              const vector[ArrayRef]& send,
                              const ArrayRef& recv, bool division)


cdef extern from "nncomm/collectives/async_queue.hpp" namespace "nncomm" nogil:
    enum class CallKind "nncomm::GroupCall::Kind"(int):
        kAllReduce
        kReduce
        kBcast
        kAllGather
        kReduceScatter

    cdef cppclass GroupCall:
        CallKind kind
        Placement where
        vector[ArrayRef] arrays
        ArrayRef one
        int root
        bool division
        bool fuse
        const char* site

    cdef cppclass PendingCall "nncomm::Pending":
        bool done()
        Status wait(bool interruptible)

    cdef cppclass AsyncQueue:
        @staticmethod
        Status Create(Group& group, int poll_us, unique_ptr[AsyncQueue]* out)
        shared_ptr[PendingCall] start(GroupCall call)
        @staticmethod
        Status DrainAll()


cdef extern from "nncomm/observability/config.hpp" namespace "nncomm::config" nogil:
    Status validate()
    int engine_poll_us()
    size_t direct_bytes()
    size_t chunk_bytes()
    size_t ipc_chunk_bytes()
    size_t ipc_min_bytes()
    size_t ipc_bucket_bytes()
    enum class GpuTransport(int):
        kAuto
        kNccl
        kMpi
        kIpc
    GpuTransport gpu_transport()
    const string& nccl_library()
    const string& timeline_path()
    size_t flight_recorder_entries()
    enum class CallChecks(int):
        kOff
        kNew
        kEvery
    CallChecks check_calls()
    enum class Hierarchical(int):
        kAuto
        kOff
        kOn
    Hierarchical hierarchical()
    bool check_finite_setting "nncomm::config::check_finite"()


cdef extern from "nncomm/transports/nccl_api.hpp" namespace "nncomm" nogil:
    cdef cppclass NcclApi:
        pass
    Status load_nccl(const string& path, const NcclApi** api)
    void add_nccl_candidates(const vector[string]& files)


cdef extern from "nncomm/observability/timeline.hpp" namespace "nncomm" nogil:
    cdef cppclass Timeline:
        @staticmethod
        Status start(const string& path, int rank)
        @staticmethod
        Status stop()


cdef extern from "nncomm/transports/join.hpp" namespace "nncomm" nogil:
    cdef cppclass Join:
        @staticmethod
        Status Leave(uint64_t steps, int* last, bool* terminated)
        @staticmethod
        void Abandon(const string& why)
        @staticmethod
        void Close()


cdef extern from "nncomm/core/wait.hpp" namespace "nncomm" nogil:
    void set_interrupt_check(int (*check)() noexcept nogil)


cdef extern from "nncomm/core/broken_process.hpp" namespace "nncomm" nogil:
    void mark_broken(const string &reason, bool abort_soon)


cdef extern from "nncomm/transports/ended_ranks.hpp" namespace "nncomm" nogil:
    Status listen_for_ended_ranks()
    void leave_job()


cdef extern from "nncomm/observability/flight_recorder.hpp" namespace "nncomm" nogil:
    cdef cppclass FlightRecorder:
        @staticmethod
        void set_process(int world_rank, int world_size)
        @staticmethod
        void set_job(uint64_t id)
        @staticmethod
        void set_call_site(const char* site)
        @staticmethod
        void set_recording(bool on)
        @staticmethod
        Status dump(const string& dir, const string& reason, string* path)
        @staticmethod
        void dump_after(const string& reason)
        @staticmethod
        void install_signal_handlers()
