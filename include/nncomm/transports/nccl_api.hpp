// NCCL, loaded at run time: the functions nncomm calls, as a table, and the
// ABI values it passes (stable across NCCL 2.x), so the package needs no
// NCCL at build time and runs where none is installed. load_nccl() fills the
// table from libnccl.so.2 (the nvidia-nccl-cu12/-cu13 wheels' or a system
// one); tests fill it with a fake.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "nncomm/cuda/cuda_pack.hpp"
#include "nncomm/core/status.hpp"

namespace nncomm {

namespace nccl {
using Result = int; // ncclResult_t; 0 is ncclSuccess
constexpr Result kSuccess = 0;
constexpr Result kInProgress = 7;
using Comm = void *;     // ncclComm_t
using DataType = int;    // ncclDataType_t
using RedOp = int;       // ncclRedOp_t
constexpr RedOp kSum = 0;
constexpr RedOp kAvg = 4;
constexpr int kHostImmediate = 1; // ncclScalarResidence_t: a host scalar
struct UniqueId {
  char internal[128];
};
} // namespace nccl

struct NcclApi {
  nccl::Result (*GetVersion)(int *version);
  const char *(*GetErrorString)(nccl::Result result);
  nccl::Result (*GetUniqueId)(nccl::UniqueId *id);
  nccl::Result (*CommInitRank)(nccl::Comm *comm, int nranks,
                               nccl::UniqueId id, int rank);
  nccl::Result (*CommDestroy)(nccl::Comm comm);
  nccl::Result (*CommAbort)(nccl::Comm comm);
  nccl::Result (*CommGetAsyncError)(nccl::Comm comm, nccl::Result *error);
  nccl::Result (*RedOpCreatePreMulSum)(nccl::RedOp *op, void *scalar,
                                       nccl::DataType dt, int residence,
                                       nccl::Comm comm);
  nccl::Result (*RedOpDestroy)(nccl::RedOp op, nccl::Comm comm);
  nccl::Result (*AllReduce)(const void *send, void *recv, size_t count,
                            nccl::DataType dt, nccl::RedOp op,
                            nccl::Comm comm, CudaStream stream);
  nccl::Result (*Reduce)(const void *send, void *recv, size_t count,
                         nccl::DataType dt, nccl::RedOp op, int root,
                         nccl::Comm comm, CudaStream stream);
  nccl::Result (*Broadcast)(const void *send, void *recv, size_t count,
                            nccl::DataType dt, int root, nccl::Comm comm,
                            CudaStream stream);
  nccl::Result (*AllGather)(const void *send, void *recv, size_t count,
                            nccl::DataType dt, nccl::Comm comm,
                            CudaStream stream);
  nccl::Result (*ReduceScatter)(const void *send, void *recv, size_t count,
                                nccl::DataType dt, nccl::RedOp op,
                                nccl::Comm comm, CudaStream stream);
  // Sends and receives between GroupStart and GroupEnd run as one
  // operation (NCCL 2.7 and newer).
  nccl::Result (*GroupStart)();
  nccl::Result (*GroupEnd)();
  nccl::Result (*Send)(const void *send, size_t count, nccl::DataType dt,
                       int peer, nccl::Comm comm, CudaStream stream);
  nccl::Result (*Recv)(void *recv, size_t count, nccl::DataType dt, int peer,
                       nccl::Comm comm, CudaStream stream);
};

// The NCCL at `path` (empty: "libnccl.so.2" as the dynamic loader finds
// it, else the first candidate that opens), loaded once per process; fails
// naming what was missing (the library, a symbol, or a version older than
// 2.11, which lacks the pre-multiplied sum that scales while reducing).
Status load_nccl(const std::string &path, const NcclApi **api);

// More files for load_nccl("") to try, in order, after "libnccl.so.2": the
// nvidia-nccl-cu12/-cu13 wheels put NCCL in site-packages, where the
// dynamic loader does not look (nncomm's Python side names their copies).
void add_nccl_candidates(const std::vector<std::string> &files);

} // namespace nncomm
