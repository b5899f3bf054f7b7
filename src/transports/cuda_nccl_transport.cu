#include "nncomm/transports/nccl_transport.hpp"

#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_calls.hpp"
#include "nncomm/host/elementwise.hpp"
#include "nncomm/core/fingerprint.hpp"
#include "nncomm/core/wait.hpp"
#include "nncomm/transports/ended_ranks.hpp"

namespace nncomm {

namespace {

nccl::DataType nccl_type(DType dt) {
  switch (dt) {
  case DType::kInt32: return 2;
  case DType::kInt64: return 4;
  case DType::kFloat16: return 6;
  case DType::kFloat32: return 7;
  case DType::kFloat64: return 8;
  case DType::kBFloat16: return 9;
  }
  return -1;
}

// scale / divisor in `dt`, as the pre-multiplied sum takes it: computed in
// double, so that a float64 reduction's factor is as precise as its data.
void premul_scalar(DType dt, float scale, int divisor, char scalar[8]) {
  const double factor = static_cast<double>(scale) / divisor;
  convert_scaled(scalar, dt, &factor, DType::kFloat64, 1, 1.0f, 1);
}

} // namespace

Status NcclTransport::nccl_status(nccl::Result result,
                                  const char *call) const {
  if (result == nccl::kSuccess)
    return Status::Ok();
  return Status::Transport(std::string(call) +
                           " failed: " + api_.GetErrorString(result));
}

// Operation `seq` of the transport, enqueued on its stream, done when the
// event recorded after it has passed.
class NcclTransport::Launched : public Work {
public:
  Launched(const NcclTransport &t, uint64_t seq) : t_(t), seq_(seq) {}

  Status test(bool *done) override {
    *done = false;
    const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(t_.done_));
    if (err == cudaSuccess) {
      *done = true;
      return Status::Ok();
    }
    if (err != cudaErrorNotReady)
      return cuda_status(err, "cudaEventQuery");
    nccl::Result async = nccl::kSuccess;
    NNCOMM_RETURN_IF_ERROR(t_.nccl_status(
        t_.api_.CommGetAsyncError(t_.comm_, &async), "ncclCommGetAsyncError"));
    if (async != nccl::kSuccess && async != nccl::kInProgress)
      return t_.nccl_status(async, "an NCCL operation");
    return Status::Ok();
  }

  Stall inspect() override {
    Stall stall;
    stall.ended = ended_before(t_.host_->world_ranks(), t_.id_, seq_);
    return stall;
  }

  std::string describe() const override {
    return "NCCL operation " + std::to_string(seq_) + " on device " +
           std::to_string(t_.device_) + ", world ranks " +
           rank_list(t_.host_->world_ranks());
  }

private:
  const NcclTransport &t_;
  const uint64_t seq_;
};

NcclTransport::NcclTransport(const NcclApi &api,
                             std::unique_ptr<MpiTransport> host)
    : api_(api), host_(std::move(host)),
      id_(Fingerprint().add(host_->id()).add("nccl").value()) {}

Status NcclTransport::Create(const NcclApi &api,
                             std::unique_ptr<MpiTransport> host,
                             std::unique_ptr<NcclTransport> *out) {
  std::unique_ptr<NcclTransport> t(new NcclTransport(api, std::move(host)));
  // Rank 0 makes the id; the host transport hands it to the others.
  nccl::UniqueId id;
  std::memset(&id, 0, sizeof id);
  // Any of these may fail on one rank alone, which the others would then
  // wait for in the id's broadcast or in ncclCommInitRank (which waits for
  // every rank) until NNCOMM_TIMEOUT: the ranks compare outcomes first.
  NNCOMM_RETURN_IF_ERROR(
      fail_together(*t->host_, t->prepare(&id), "setting up NCCL"));
  static_assert(sizeof id % sizeof(int64_t) == 0, "the id is whole words");
  {
    OperationLabel label("creating an NCCL communicator");
    NNCOMM_RETURN_IF_ERROR(t->host_->bcast(
        &id, sizeof id / sizeof(int64_t), DType::kInt64, 0));
  }
  const Status joined =
      t->nccl_status(api.CommInitRank(&t->comm_, t->size(), id, t->rank()),
                     "ncclCommInitRank");
  // A failure that NCCL reports on every rank needs nothing more. One on
  // some ranks only (a rank's own memory or device failure once the others
  // had connected) would leave the others a communicator with a peer
  // missing, whose first collective waits for it until NNCOMM_TIMEOUT; so
  // the ranks compare again, and those that succeeded abort theirs
  // (destroying it may wait for the missing peer). What no agreement can
  // reach is a rank failing before it connects, which leaves the others
  // inside ncclCommInitRank (NCCL's blocking set-up has no timeout): the
  // comparison above at least sends there only ranks whose own set-up
  // went through.
  const Status all_joined =
      fail_together(*t->host_, joined, "creating the NCCL communicator");
  if (!all_joined.ok()) {
    // A failed ncclCommInitRank leaves no communicator to free.
    if (joined.ok())
      api.CommAbort(t->comm_);
    t->comm_ = nullptr;
    return all_joined;
  }
  count_operations(t->id_, &t->begun_);
  *out = std::move(t);
  return Status::Ok();
}

Status NcclTransport::prepare(nccl::UniqueId *id) {
  NNCOMM_CUDA_CALL(cudaGetDevice, &device_);
  NNCOMM_CUDA_CALL(cudaStreamCreateWithFlags,
                   reinterpret_cast<cudaStream_t *>(&stream_),
                   cudaStreamNonBlocking);
  NNCOMM_CUDA_CALL(cudaEventCreateWithFlags,
                   reinterpret_cast<cudaEvent_t *>(&done_),
                   cudaEventDisableTiming);
  if (rank() == 0)
    return nccl_status(api_.GetUniqueId(id), "ncclGetUniqueId");
  return Status::Ok();
}

NcclTransport::~NcclTransport() {
  stop_counting(id_);
  if (comm_ != nullptr) {
    // A communicator with an operation that never completed cannot be
    // destroyed (that waits for it).
    std::string reason;
    if (broken(&reason))
      api_.CommAbort(comm_);
    else
      api_.CommDestroy(comm_);
  }
  if (done_ != nullptr)
    cudaEventDestroy(static_cast<cudaEvent_t>(done_));
  if (stream_ != nullptr)
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

// The reduction that sums each rank's share times `scale`, divided by
// `divisor`: a plain sum, NCCL's average, or a pre-multiplied sum (whose
// scalar is of the reduced dtype), which `*created` says to destroy.
Status NcclTransport::reduction(DType dt, float scale, int divisor,
                                nccl::RedOp *op, bool *created) {
  *created = false;
  if (scale == 1.0f && divisor == 1) {
    *op = nccl::kSum;
    return Status::Ok();
  }
  if (scale == 1.0f && divisor == size()) {
    *op = nccl::kAvg;
    return Status::Ok();
  }
  char scalar[8];
  premul_scalar(dt, scale, divisor, scalar);
  NNCOMM_RETURN_IF_ERROR(
      nccl_status(api_.RedOpCreatePreMulSum(op, scalar, nccl_type(dt),
                                            nccl::kHostImmediate, comm_),
                  "ncclRedOpCreatePreMulSum"));
  *created = true;
  return Status::Ok();
}

bool NcclTransport::scales_precisely(DType dt, float scale,
                                     int divisor) const {
  if (dt != DType::kFloat16 && dt != DType::kBFloat16)
    return true;
  // The pre-multiplied sum's scalar is of the dtype: precise only where it
  // holds the factor exactly (1/3 or a subnormal 1/(65536*6) it does not).
  char scalar[8];
  premul_scalar(dt, scale, divisor, scalar);
  double back = 0;
  convert_scaled(&back, DType::kFloat64, scalar, dt, 1, 1.0f, 1);
  return back == static_cast<double>(scale) / divisor;
}

template <typename Enqueue>
Status NcclTransport::start(const char *call, DType dt, float scale,
                            int divisor, Enqueue enqueue, WorkPtr *work) {
  NNCOMM_RETURN_IF_ERROR(refuse_if_broken());
  DeviceScope scope;
  NNCOMM_RETURN_IF_ERROR(scope.enter(device_));
  nccl::RedOp op = nccl::kSum;
  bool created = false;
  NNCOMM_RETURN_IF_ERROR(reduction(dt, scale, divisor, &op, &created));
  const nccl::Result result = enqueue(op);
  // An enqueued operation keeps what it needs of its reduction.
  if (created)
    api_.RedOpDestroy(op, comm_);
  NNCOMM_RETURN_IF_ERROR(nccl_status(result, call));
  NNCOMM_CUDA_CALL(cudaEventRecord, static_cast<cudaEvent_t>(done_),
                   static_cast<cudaStream_t>(stream_));
  work->reset(new Launched(*this, ++begun_));
  return Status::Ok();
}

Status NcclTransport::start_allreduce(void *buf, size_t count, DType dt,
                                      float scale, int divisor,
                                      WorkPtr *work) {
  const auto enqueue = [&](nccl::RedOp op) {
    return api_.AllReduce(buf, buf, count, nccl_type(dt), op, comm_, stream_);
  };
  return start("ncclAllReduce", dt, scale, divisor, enqueue, work);
}

Status NcclTransport::start_reduce(void *buf, size_t count, DType dt,
                                   int root, int divisor, WorkPtr *work) {
  // The root receives in place; the others' buffers stay as they are.
  void *recv = rank() == root ? buf : nullptr;
  const auto enqueue = [&](nccl::RedOp op) {
    return api_.Reduce(buf, recv, count, nccl_type(dt), op, root, comm_,
                       stream_);
  };
  return start("ncclReduce", dt, 1.0f, divisor, enqueue, work);
}

Status NcclTransport::start_bcast(void *buf, size_t count, DType dt, int root,
                                  WorkPtr *work) {
  const auto enqueue = [&](nccl::RedOp) {
    return api_.Broadcast(buf, buf, count, nccl_type(dt), root, comm_,
                          stream_);
  };
  return start("ncclBroadcast", dt, 1.0f, 1, enqueue, work);
}

Status NcclTransport::start_allgather(const void *send, void *recv,
                                      size_t count, DType dt, WorkPtr *work) {
  const auto enqueue = [&](nccl::RedOp) {
    return api_.AllGather(send, recv, count, nccl_type(dt), comm_, stream_);
  };
  return start("ncclAllGather", dt, 1.0f, 1, enqueue, work);
}

Status NcclTransport::start_reduce_scatter(const void *send, void *recv,
                                           size_t count, DType dt, int divisor,
                                           WorkPtr *work) {
  const auto enqueue = [&](nccl::RedOp op) {
    return api_.ReduceScatter(send, recv, count, nccl_type(dt), op, comm_,
                              stream_);
  };
  return start("ncclReduceScatter", dt, 1.0f, divisor, enqueue, work);
}

nccl::Result NcclTransport::exchange(const void *send, const Blocks &to,
                                     void *recv, const Blocks &from,
                                     DType dt) const {
  const size_t elem = dtype_size(dt);
  nccl::Result result = api_.GroupStart();
  if (result != nccl::kSuccess)
    return result;
  for (int r = 0; r < size() && result == nccl::kSuccess; ++r) {
    if (to.counts[r] > 0) {
      result = api_.Send(static_cast<const char *>(send) + to.offsets[r] * elem,
                         to.counts[r], nccl_type(dt), r, comm_, stream_);
    }
    if (result == nccl::kSuccess && from.counts[r] > 0) {
      result = api_.Recv(static_cast<char *>(recv) + from.offsets[r] * elem,
                         from.counts[r], nccl_type(dt), r, comm_, stream_);
    }
  }
  // Closed after a failure too: a group left open would take in this
  // thread's next NCCL calls.
  const nccl::Result ended = api_.GroupEnd();
  return result != nccl::kSuccess ? result : ended;
}

Status NcclTransport::start_alltoallv(const void *send,
                                      const Blocks &send_blocks, void *recv,
                                      const Blocks &recv_blocks, DType dt,
                                      WorkPtr *work) {
  const auto enqueue = [&](nccl::RedOp) {
    return exchange(send, send_blocks, recv, recv_blocks, dt);
  };
  return start("ncclSend/ncclRecv", dt, 1.0f, 1, enqueue, work);
}

// NCCL has no all-gather of blocks that differ in size: every rank sends
// its whole `send` to each rank.
Status NcclTransport::start_allgatherv(const void *send, size_t count,
                                       void *recv, const Blocks &blocks,
                                       DType dt, WorkPtr *work) {
  const Blocks whole{std::vector<size_t>(size(), count),
                     std::vector<size_t>(size(), 0)};
  const auto enqueue = [&](nccl::RedOp) {
    return exchange(send, whole, recv, blocks, dt);
  };
  return start("ncclSend/ncclRecv", dt, 1.0f, 1, enqueue, work);
}

} // namespace nncomm
