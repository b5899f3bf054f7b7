// Tunables of the core, with their defaults. Each can be overridden by the
// environment variable of the same name, read once per process; a value
// that does not parse makes validate() fail instead of falling back.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "nncomm/core/launch_tuner.hpp"
#include "nncomm/core/status.hpp"

namespace nncomm {
namespace config {

// Fails naming every NNCOMM_* variable whose value does not parse.
Status validate();

// Largest piece one MPI reduction is given. MPICH allocates a temporary of
// the message size for every reduction; above glibc's 32 MiB mmap threshold
// that temporary is mapped and unmapped on every call, so one 64 MiB
// all-reduce pays page faults on all of it. Pieces below the threshold reuse
// heap memory. NNCOMM_CHUNK_BYTES.
size_t chunk_bytes();

// What the CUDA IPC transport moves per chunk (ipc_transport.hpp): each
// rank's two slots of it are device memory, and every chunk costs a round
// on the host. NNCOMM_IPC_CHUNK_BYTES, default 32 MiB, at least 4 KiB.
size_t ipc_chunk_bytes();
// Operations of the CUDA IPC transport smaller than this go through host
// memory: an IPC operation costs a fixed round between the ranks'
// processes on their shared GPU (0.65 ms on an H200 from 1 to 16 MiB),
// a staged one grows with its size from less (0.41 ms at 1 MiB, 0.61 ms at
// 2). NNCOMM_IPC_MIN_BYTES, default 2 MiB; 0: every operation over IPC.
size_t ipc_min_bytes();
// The engine's buckets on the CUDA IPC transport are at least this large,
// consecutive ones merged (merge_buckets in bucket_plan.hpp): each costs
// that fixed round, and on ranks sharing a GPU without MPS the rounds
// stretch their backward (ResNet-50 under PyTorch on an H200: 33 buckets
// 1.22 x compute, 4 buckets 1.04). NNCOMM_IPC_BUCKET_BYTES, default 32 MiB;
// 0: the plan as drafted.
size_t ipc_bucket_bytes();

// Arrays at least this large are reduced where they lie instead of being
// copied into the fusion buffer: for them the two copies cost more than the
// extra MPI call saves. NNCOMM_DIRECT_BYTES.
size_t direct_bytes();

// Arrays at least this large are moved onto huge pages before their first
// direct reduction (see host_memory.hpp). NNCOMM_HUGE_PAGE_BYTES.
size_t huge_page_bytes();

// Whether collectives check that all ranks of the group make the same call
// (collective, root, options, array count, sizes and dtypes), so that a
// mismatch raises ValueError on every rank instead of MPI failing, hanging
// or mixing data: kNew (the default) compares each call signature the first
// time it comes (MpiTransport::check_call), kEvery every call
// (NNCOMM_CHECK_CALLS=1), kOff none (NNCOMM_CHECK_CALLS=0).
enum class CallChecks { kOff = 0, kNew = 1, kEvery = 2 };
CallChecks check_calls();

// Whether the callback engine checks each gradient for NaN and infinity
// before it leaves the rank, by default (all_reduce_callback's and
// DistributedSolver's check_finite=None): NNCOMM_CHECK_FINITE=1; 0, the
// default, checks nothing and costs nothing.
bool check_finite();

// When the callback engine launches buckets: "eager" (as each is ready),
// "deferred" (all at the end of backward) or "auto" (the default: timed on
// the first iterations, see launch_tuner.hpp; empty). NNCOMM_LAUNCH.
std::optional<Launch> engine_launch();

// How often, in microseconds, the callback engine's thread tests a
// reduction in flight (0: it spins). NNCOMM_ENGINE_POLL_US.
int engine_poll_us();

// Seconds any wait for other ranks may last before every waiting rank
// raises CommunicatorError and the job is aborted; 0: never.
// NNCOMM_TIMEOUT, default 1800.
double timeout_seconds();

// Seconds after which a wait is reported as stalled (group rank 0 logs
// which ranks have not arrived, again every as many seconds); 0: never.
// NNCOMM_STALL_WARNING, default 60.
double stall_warning_seconds();

// Which transport carries collectives on CUDA device memory: NCCL, CUDA
// IPC among the ranks of one host, MPI through pinned host memory, or
// (kAuto, the default) NCCL where it loads on every rank and every rank has
// a device of its own, else IPC where every rank is on one GPU, else MPI.
// NNCOMM_GPU_TRANSPORT=auto|nccl|ipc|mpi.
enum class GpuTransport { kAuto = 0, kNccl = 1, kMpi = 2, kIpc = 3 };
GpuTransport gpu_transport();

// Whether MpiTransport all-reduces in two levels across hosts
// (hierarchical_allreduce.hpp): kAuto (the default) where its ranks span
// several hosts with the same number (> 1) of them on each, not in blocks
// of consecutive ranks (host_layout.hpp says why), kOn wherever
// they span several hosts and can (else flat, with a note on stderr: see
// host_layout.hpp), kOff never.
// NNCOMM_HIERARCHICAL=auto|1|0.
enum class Hierarchical { kAuto = 0, kOff = 1, kOn = 2 };
Hierarchical hierarchical();

// The NCCL library to load (a path or a file name), default
// "libnccl.so.2" as the dynamic loader finds it. NNCOMM_NCCL_LIBRARY.
const std::string &nccl_library();

// Where the timeline is written from the communicator's init() on (the
// binding starts it: timeline.hpp); "" (the default): no timeline.
// NNCOMM_TIMELINE.
const std::string &timeline_path();

// Operations each transport's flight recorder keeps (flight_recorder.hpp);
// 0: none recorded, no dump. NNCOMM_FLIGHT_RECORDER, default 2000.
size_t flight_recorder_entries();

// The directory flight records are written to; "" (unset): the
// recorder's default. NNCOMM_FLIGHT_RECORDER_DIR.
const std::string &flight_recorder_dir();

// For tests of local failures: staging and fusion buffers of this many
// bytes or more fail to allocate; 0 (the default): never.
// NNCOMM_TEST_FAIL_ALLOCATION.
size_t test_fail_allocation_bytes();

} // namespace config
} // namespace nncomm
