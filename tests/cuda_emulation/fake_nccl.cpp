#include "fake_nccl.hpp"

#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "fake_cudart.hpp"
#include "nncomm/host/bfloat16.hpp"
#include "nncomm/host/elementwise.hpp"

using namespace nncomm;

namespace {

constexpr nccl::Result kSystemError = 2;
constexpr nccl::Result kInvalidArgument = 4;

// Whether this process is to fail `call` (fake_nccl.hpp).
bool injected(const char *call) {
  const char *failing = std::getenv("NNCOMM_FAKE_NCCL_FAIL");
  return failing != nullptr && std::strcmp(failing, call) == 0;
}

struct FakeComm {
  MPI_Comm comm;
  int rank;
  int size;
};

// What a pre-multiplied sum multiplies each rank's share by, per RedOp
// handle (handles start above NCCL's built-in operations).
std::vector<double> premul_scalars;
constexpr nccl::RedOp kFirstCreated = 16;

DType dtype_of(nccl::DataType dt) {
  switch (dt) {
  case 2: return DType::kInt32;
  case 4: return DType::kInt64;
  case 6: return DType::kFloat16;
  case 7: return DType::kFloat32;
  case 8: return DType::kFloat64;
  default: return DType::kBFloat16;
  }
}

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
  case DType::kInt32: return MPI_INT32_T;
  case DType::kInt64: return MPI_INT64_T;
  case DType::kFloat32: return MPI_FLOAT;
  case DType::kFloat64: return MPI_DOUBLE;
  default: return MPI_UINT16_T;
  }
}

template <typename T> void narrow_sum(void *in, void *inout, int *n, MPI_Datatype *) {
  const T *a = static_cast<const T *>(in);
  T *b = static_cast<T *>(inout);
  for (int i = 0; i < *n; ++i)
    b[i] = static_cast<T>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

MPI_Op sum_op(DType dt) {
  static MPI_Op half = MPI_OP_NULL, bf16 = MPI_OP_NULL;
  if (half == MPI_OP_NULL) {
    MPI_Op_create(&narrow_sum<_Float16>, 1, &half);
    MPI_Op_create(&narrow_sum<BFloat16>, 1, &bf16);
  }
  return dt == DType::kFloat16 ? half : dt == DType::kBFloat16 ? bf16 : MPI_SUM;
}

nccl::Result enqueue(CudaStream stream, std::function<void()> work) {
  return cudaSuccess ==
                 nncomm_fake_enqueue(static_cast<cudaStream_t>(stream),
                                     std::move(work))
             ? nccl::kSuccess
             : kInvalidArgument;
}

// Enqueues the reduction `op` of `count` elements of `send`: when its turn
// comes, each rank's share multiplied (a pre-multiplied sum) and summed by
// a nonblocking MPI call, which the stream then waits for (a rank that
// never comes leaves it pending, as on a GPU, while the host polls);
// then, where the sum arrives (`root`, or every rank for -1), divided
// (average) and handed to `deliver`.
nccl::Result enqueue_reduction(CudaStream stream, const FakeComm &c,
                               const void *send, size_t count, DType dt,
                               nccl::RedOp op, int root,
                               std::function<void(const char *)> deliver) {
  struct Round {
    std::vector<char> share, sum;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  const size_t bytes = count * dtype_size(dt);
  auto round = std::make_shared<Round>();
  const auto start = [=] {
    round->share.assign(static_cast<const char *>(send),
                        static_cast<const char *>(send) + bytes);
    round->sum.resize(bytes);
    if (op >= kFirstCreated) {
      const float factor = float(premul_scalars[op - kFirstCreated]);
      convert_scaled(round->share.data(), dt, round->share.data(), dt, count,
                     factor, 1);
    }
    if (root < 0)
      MPI_Iallreduce(round->share.data(), round->sum.data(), int(count),
                     mpi_type(dt), sum_op(dt), c.comm, &round->request);
    else
      MPI_Ireduce(round->share.data(), round->sum.data(), int(count),
                  mpi_type(dt), sum_op(dt), root, c.comm, &round->request);
  };
  const auto finished = [round] {
    int complete = 0;
    MPI_Test(&round->request, &complete, MPI_STATUS_IGNORE);
    return complete != 0;
  };
  if (cudaSuccess != nncomm_fake_enqueue_until(
                         static_cast<cudaStream_t>(stream), start, finished))
    return kInvalidArgument;
  return enqueue(stream, [=] {
    if (root >= 0 && c.rank != root)
      return;
    if (op == nccl::kAvg)
      convert_scaled(round->sum.data(), dt, round->sum.data(), dt, count,
                     1.0f, c.size);
    deliver(round->sum.data());
  });
}

const char *error_string(nccl::Result r) {
  if (r == kSystemError)
    return "unhandled system error (injected)";
  return r == nccl::kSuccess ? "no error" : "fake NCCL error";
}

nccl::Result get_version(int *v) {
  *v = 22300;
  return nccl::kSuccess;
}

// The one id every communicator is made from.
void the_id(nccl::UniqueId *id) {
  for (size_t i = 0; i < sizeof id->internal; ++i)
    id->internal[i] = char(i * 7 + 3);
}

nccl::Result get_unique_id(nccl::UniqueId *id) {
  if (injected("ncclGetUniqueId"))
    return kSystemError;
  the_id(id);
  return nccl::kSuccess;
}

nccl::Result comm_init_rank(nccl::Comm *comm, int nranks, nccl::UniqueId id,
                            int rank) {
  // Every rank must hold rank 0's id: the transport broadcast it.
  nccl::UniqueId expected;
  the_id(&expected);
  if (std::memcmp(&id, &expected, sizeof id) != 0)
    return kInvalidArgument;
  // Waits for every rank, as NCCL's does.
  FakeComm *c = new FakeComm{MPI_COMM_NULL, rank, nranks};
  MPI_Comm_dup(MPI_COMM_WORLD, &c->comm);
  if (injected("ncclCommInitRank")) {
    MPI_Comm_free(&c->comm);
    delete c;
    return kSystemError;
  }
  *comm = c;
  return nccl::kSuccess;
}

nccl::Result comm_destroy(nccl::Comm comm) {
  FakeComm *c = static_cast<FakeComm *>(comm);
  MPI_Comm_free(&c->comm);
  delete c;
  return nccl::kSuccess;
}

nccl::Result comm_get_async_error(nccl::Comm, nccl::Result *error) {
  *error = nccl::kSuccess;
  return nccl::kSuccess;
}

nccl::Result premul_create(nccl::RedOp *op, void *scalar, nccl::DataType dt,
                           int residence, nccl::Comm) {
  if (residence != nccl::kHostImmediate)
    return kInvalidArgument;
  double value = 0;
  convert_scaled(&value, DType::kFloat64, scalar, dtype_of(dt), 1, 1.0f, 1);
  premul_scalars.push_back(value);
  *op = kFirstCreated + nccl::RedOp(premul_scalars.size() - 1);
  return nccl::kSuccess;
}

nccl::Result redop_destroy(nccl::RedOp, nccl::Comm) {
  return nccl::kSuccess; // enqueued operations keep their scalar
}

nccl::Result all_reduce(const void *send, void *recv, size_t count,
                        nccl::DataType dt, nccl::RedOp op, nccl::Comm comm,
                        CudaStream stream) {
  const size_t bytes = count * dtype_size(dtype_of(dt));
  return enqueue_reduction(
      stream, *static_cast<FakeComm *>(comm), send, count, dtype_of(dt), op,
      -1, [=](const char *sum) { std::memcpy(recv, sum, bytes); });
}

nccl::Result reduce_to(const void *send, void *recv, size_t count,
                       nccl::DataType dt, nccl::RedOp op, int root,
                       nccl::Comm comm, CudaStream stream) {
  const size_t bytes = count * dtype_size(dtype_of(dt));
  return enqueue_reduction(
      stream, *static_cast<FakeComm *>(comm), send, count, dtype_of(dt), op,
      root, [=](const char *sum) { std::memcpy(recv, sum, bytes); });
}

nccl::Result broadcast(const void *send, void *recv, size_t count,
                       nccl::DataType dt, int root, nccl::Comm comm,
                       CudaStream stream) {
  const FakeComm c = *static_cast<FakeComm *>(comm);
  return enqueue(stream, [=] {
    const size_t bytes = count * dtype_size(dtype_of(dt));
    if (c.rank == root && send != recv)
      std::memmove(recv, send, bytes);
    MPI_Bcast(recv, int(bytes), MPI_BYTE, root, c.comm);
  });
}

nccl::Result all_gather(const void *send, void *recv, size_t count,
                        nccl::DataType dt, nccl::Comm comm,
                        CudaStream stream) {
  const FakeComm c = *static_cast<FakeComm *>(comm);
  return enqueue(stream, [=] {
    const int bytes = int(count * dtype_size(dtype_of(dt)));
    MPI_Allgather(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, c.comm);
  });
}

nccl::Result reduce_scatter(const void *send, void *recv, size_t count,
                            nccl::DataType dt, nccl::RedOp op,
                            nccl::Comm comm, CudaStream stream) {
  const FakeComm &c = *static_cast<FakeComm *>(comm);
  const size_t bytes = count * dtype_size(dtype_of(dt));
  const size_t mine = c.rank * bytes;
  return enqueue_reduction(
      stream, c, send, count * c.size, dtype_of(dt), op, -1,
      [=](const char *sum) { std::memcpy(recv, sum + mine, bytes); });
}

// The sends and receives of the NCCL group this thread has open, run
// together, each as a nonblocking MPI call, when it closes (NCCL's group
// state is per thread). All of one group's are on one communicator and
// stream.
struct PointToPoint {
  bool send;
  void *buffer;
  int bytes;
  int peer;
};
struct OpenGroup {
  int depth = 0;
  FakeComm comm;
  CudaStream stream;
  std::vector<PointToPoint> calls;
};
thread_local OpenGroup open_group;

nccl::Result group_start() {
  ++open_group.depth;
  return nccl::kSuccess;
}

nccl::Result group_end() {
  if (open_group.depth == 0)
    return kInvalidArgument;
  if (--open_group.depth > 0 || open_group.calls.empty())
    return nccl::kSuccess;
  const FakeComm c = open_group.comm;
  std::vector<PointToPoint> calls = std::move(open_group.calls);
  open_group.calls.clear();
  return enqueue(open_group.stream, [c, calls] {
    std::vector<MPI_Request> requests(calls.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      const PointToPoint &p = calls[i];
      if (p.send)
        MPI_Isend(p.buffer, p.bytes, MPI_BYTE, p.peer, 0, c.comm, &requests[i]);
      else
        MPI_Irecv(p.buffer, p.bytes, MPI_BYTE, p.peer, 0, c.comm, &requests[i]);
    }
    MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  });
}

// A send or receive outside a group is a group of its own.
nccl::Result point_to_point(bool send, const void *buffer, size_t count,
                            nccl::DataType dt, int peer, nccl::Comm comm,
                            CudaStream stream) {
  group_start();
  open_group.comm = *static_cast<FakeComm *>(comm);
  open_group.stream = stream;
  open_group.calls.push_back({send, const_cast<void *>(buffer),
                              int(count * dtype_size(dtype_of(dt))), peer});
  return group_end();
}

nccl::Result send_to(const void *send, size_t count, nccl::DataType dt,
                     int peer, nccl::Comm comm, CudaStream stream) {
  return point_to_point(true, send, count, dt, peer, comm, stream);
}

nccl::Result recv_from(void *recv, size_t count, nccl::DataType dt, int peer,
                       nccl::Comm comm, CudaStream stream) {
  return point_to_point(false, recv, count, dt, peer, comm, stream);
}

} // namespace

const NcclApi &fake_nccl() {
  static const NcclApi api = {
      get_version,   error_string,        get_unique_id, comm_init_rank,
      comm_destroy,  comm_destroy,        comm_get_async_error,
      premul_create, redop_destroy,       all_reduce,    reduce_to,
      broadcast,     all_gather,          reduce_scatter,
      group_start,   group_end,           send_to,       recv_from,
  };
  return api;
}

// The same functions under NCCL's names, for a build of this file as a
// shared library that nncomm's loader opens (NNCOMM_NCCL_LIBRARY).
extern "C" {
nccl::Result ncclGetVersion(int *v) { return get_version(v); }
const char *ncclGetErrorString(nccl::Result r) { return error_string(r); }
nccl::Result ncclGetUniqueId(nccl::UniqueId *id) { return get_unique_id(id); }
nccl::Result ncclCommInitRank(nccl::Comm *comm, int nranks, nccl::UniqueId id,
                              int rank) {
  return comm_init_rank(comm, nranks, id, rank);
}
nccl::Result ncclCommDestroy(nccl::Comm comm) { return comm_destroy(comm); }
nccl::Result ncclCommAbort(nccl::Comm comm) { return comm_destroy(comm); }
nccl::Result ncclCommGetAsyncError(nccl::Comm comm, nccl::Result *error) {
  return comm_get_async_error(comm, error);
}
nccl::Result ncclRedOpCreatePreMulSum(nccl::RedOp *op, void *scalar,
                                      nccl::DataType dt, int residence,
                                      nccl::Comm comm) {
  return premul_create(op, scalar, dt, residence, comm);
}
nccl::Result ncclRedOpDestroy(nccl::RedOp op, nccl::Comm comm) {
  return redop_destroy(op, comm);
}
nccl::Result ncclAllReduce(const void *send, void *recv, size_t count,
                           nccl::DataType dt, nccl::RedOp op, nccl::Comm comm,
                           CudaStream stream) {
  return all_reduce(send, recv, count, dt, op, comm, stream);
}
nccl::Result ncclReduce(const void *send, void *recv, size_t count,
                        nccl::DataType dt, nccl::RedOp op, int root,
                        nccl::Comm comm, CudaStream stream) {
  return reduce_to(send, recv, count, dt, op, root, comm, stream);
}
nccl::Result ncclBroadcast(const void *send, void *recv, size_t count,
                           nccl::DataType dt, int root, nccl::Comm comm,
                           CudaStream stream) {
  return broadcast(send, recv, count, dt, root, comm, stream);
}
nccl::Result ncclAllGather(const void *send, void *recv, size_t count,
                           nccl::DataType dt, nccl::Comm comm,
                           CudaStream stream) {
  return all_gather(send, recv, count, dt, comm, stream);
}
nccl::Result ncclReduceScatter(const void *send, void *recv, size_t count,
                               nccl::DataType dt, nccl::RedOp op,
                               nccl::Comm comm, CudaStream stream) {
  return reduce_scatter(send, recv, count, dt, op, comm, stream);
}
nccl::Result ncclGroupStart() { return group_start(); }
nccl::Result ncclGroupEnd() { return group_end(); }
nccl::Result ncclSend(const void *send, size_t count, nccl::DataType dt,
                      int peer, nccl::Comm comm, CudaStream stream) {
  return send_to(send, count, dt, peer, comm, stream);
}
nccl::Result ncclRecv(void *recv, size_t count, nccl::DataType dt, int peer,
                      nccl::Comm comm, CudaStream stream) {
  return recv_from(recv, count, dt, peer, comm, stream);
}
}
