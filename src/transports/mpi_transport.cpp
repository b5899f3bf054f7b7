#include "nncomm/transports/mpi_transport.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <unordered_map>

#include "nncomm/host/bfloat16.hpp"
#include "nncomm/observability/config.hpp"
#include "nncomm/core/fingerprint.hpp"
#include "nncomm/host/huge_pages.hpp"
#include "nncomm/host/elementwise.hpp"
#include "nncomm/core/wait.hpp"
#include "nncomm/transports/ended_ranks.hpp"
#include "nncomm/transports/mpi_failure.hpp"

namespace nncomm {

namespace {

#define NNCOMM_MPI_CALL(fn, ...)                                               \
  do {                                                                         \
    int _nncomm_err = fn(__VA_ARGS__);                                         \
    if (_nncomm_err != MPI_SUCCESS)                                            \
      return mpi_failure(_nncomm_err, #fn);                                    \
  } while (0)

// MPI has no 16-bit float sums (host_ops.hpp: add_narrow).
template <DType dt>
void narrow_sum(void *in, void *inout, int *len, MPI_Datatype *) {
  add_narrow(in, inout, dt, static_cast<size_t>(*len));
}

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
  case DType::kFloat32: return MPI_FLOAT;
  case DType::kFloat64: return MPI_DOUBLE;
  case DType::kFloat16: return MPI_UINT16_T;
  case DType::kBFloat16: return MPI_UINT16_T;
  case DType::kInt32: return MPI_INT32_T;
  case DType::kInt64: return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

// The op of a 16-bit float sum, created on first use; it lives until
// MPI_Finalize frees it.
template <DType dt> Status narrow_sum_op(MPI_Op *op) {
  static MPI_Op created_op = MPI_OP_NULL;
  static int created = MPI_Op_create(&narrow_sum<dt>, 1, &created_op);
  if (created != MPI_SUCCESS)
    return mpi_failure(created, "MPI_Op_create");
  *op = created_op;
  return Status::Ok();
}

// The sum for `dt`.
Status sum_op(DType dt, MPI_Op *op) {
  if (dt == DType::kFloat16)
    return narrow_sum_op<DType::kFloat16>(op);
  if (dt == DType::kBFloat16)
    return narrow_sum_op<DType::kBFloat16>(op);
  *op = MPI_SUM;
  return Status::Ok();
}

// Elements per reduction call: the configured chunk, capped so that the
// count always fits MPI's int.
size_t chunk_elements(DType dt) {
  size_t elems = config::chunk_bytes() / dtype_size(dt);
  return std::max<size_t>(1, std::min<size_t>(elems, INT_MAX));
}

// An operation as the stall reports (its fingerprint: the same on every
// rank making the same MPI call) and Join's leavers (the rest) see it.
ShadowOp described(ShadowOp::Kind kind, const char *name, size_t count,
                   DType dt, int root = 0) {
  ShadowOp op;
  op.kind = kind;
  op.name = name;
  op.dt = dt;
  op.count = count;
  op.root = root;
  op.fingerprint = Fingerprint()
                       .add(name)
                       .add(count)
                       .add(static_cast<uint64_t>(dt))
                       .add(static_cast<uint64_t>(root))
                       .value();
  return op;
}

// Root transports (of a Group made from an MPI communicator) are made in
// the same order on every rank: their ordinal names them.
std::atomic<uint64_t> roots_made{0};

void abort_world(const char *reason) {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "nncomm: world rank %d is aborting the job: %s\n",
               rank, reason);
  std::fflush(stderr);
  // Time for the launcher to forward the line: the abort tears the job
  // down, its output pipes included.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// One operation: a nonblocking MPI call per piece of its buffer, each
// started once the one before has completed; the subclass (Calls) makes
// the calls.
class Pieces : public Work {
public:
  // `inspector`: the transport's (null while it is being created); `at`:
  // the operation, as begin() opened it, in `flight`, on transport `id`.
  Pieces(StallInspector *inspector, const StallInspector::Position &at,
         uint64_t id, FlightRecorder &flight, const char *call, size_t pieces)
      : inspector_(inspector), at_(at), id_(id), flight_(flight), call_(call),
        pieces_(pieces) {}

  Status begin() {
    NNCOMM_RETURN_IF_ERROR(start_piece());
    flight_.started(at_.seq);
    return Status::Ok();
  }

  Status test(bool *done) override {
    *done = false;
    int complete = 0;
    const int err = MPI_Test(&request_, &complete, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS)
      return failed(err, "MPI_Test");
    if (!complete)
      return Join::open() ? Join::poll() : Status::Ok();
    finish(piece_);
    if (++piece_ < pieces_)
      return start_piece();
    flight_.completed(at_.seq);
    *done = true;
    return Status::Ok();
  }

  Stall inspect() override {
    Stall stall;
    if (inspector_ == nullptr)
      return stall;
    inspector_->arrived(at_);
    stall.known = true;
    stall.missing = inspector_->missing(at_);
    stall.differing = inspector_->differing(at_);
    stall.ended = ended_before(stall.missing, id_, at_.seq);
    return stall;
  }

  std::string describe() const override {
    std::string text = "operation " + std::to_string(at_.seq);
    if (inspector_ != nullptr) {
      text += " on the group of world ranks " +
              rank_list(inspector_->world_ranks());
      if (inspector_->role() != nullptr)
        text += std::string(", ") + inspector_->role();
    }
    return text;
  }

private:
  // Starts piece `i`'s call, returning MPI's error code.
  virtual int start(size_t i, MPI_Request *request) = 0;
  // Runs on piece `i` once its call has completed.
  virtual void finish(size_t i) = 0;

  Status start_piece() {
    const int err = start(piece_, &request_);
    if (err != MPI_SUCCESS)
      return failed(err, call_);
    return Status::Ok();
  }

  // MPI failed the operation (a rank of it died, say): the record is
  // written now, before the error reaches a caller that may end the job.
  Status failed(int err, const char *call) {
    const Status failure = mpi_failure(err, call);
    flight_.failed(at_.seq);
    FlightRecorder::dump_after(failure.message());
    return failure;
  }

  StallInspector *const inspector_;
  const StallInspector::Position at_;
  const uint64_t id_;
  FlightRecorder &flight_;
  const char *call_;
  const size_t pieces_;
  size_t piece_ = 0;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

// The wait that completes a new communicator: it has no stall reports
// (its ranks do not know it yet), but a rank of `makers` (world ranks)
// that ended without making it is found from the end notices.
class Creation final : public Work {
public:
  Creation(Work &idup, std::vector<int> makers, uint64_t id, uint64_t seq)
      : idup_(idup), makers_(std::move(makers)), id_(id), seq_(seq) {}
  Status test(bool *done) override { return idup_.test(done); }
  Stall inspect() override {
    Stall stall;
    stall.ended = ended_before(makers_, id_, seq_);
    return stall;
  }
  std::string describe() const override { return idup_.describe(); }

private:
  Work &idup_;
  const std::vector<int> makers_;
  const uint64_t id_;
  const uint64_t seq_;
};

// Sets `*out` to the world rank of each rank of `comm`; returns MPI's
// error code.
int world_ranks_of(MPI_Comm comm, std::vector<int> *out) {
  int size = 0;
  int err = MPI_Comm_size(comm, &size);
  if (err != MPI_SUCCESS)
    return err;
  std::vector<int> ranks(size);
  out->assign(size, MPI_UNDEFINED);
  for (int r = 0; r < size; ++r)
    ranks[r] = r;
  MPI_Group own = MPI_GROUP_NULL;
  MPI_Group world = MPI_GROUP_NULL;
  err = MPI_Comm_group(comm, &own);
  if (err == MPI_SUCCESS)
    err = MPI_Comm_group(MPI_COMM_WORLD, &world);
  if (err == MPI_SUCCESS)
    err = MPI_Group_translate_ranks(own, size, ranks.data(), world,
                                    out->data());
  if (own != MPI_GROUP_NULL)
    MPI_Group_free(&own);
  if (world != MPI_GROUP_NULL)
    MPI_Group_free(&world);
  return err;
}

// The `finish` of pieces that leave their results as MPI put them.
constexpr auto no_finish = [](size_t) {};

// Pieces whose calls are `start` and `finish`, kept as they are: in a
// std::function, an operation's arguments cost an allocation of their own
// at every call.
template <typename Start, typename Finish>
class Calls final : public Pieces {
public:
  Calls(StallInspector *inspector, const StallInspector::Position &at,
        uint64_t id, FlightRecorder &flight, const char *call, size_t pieces,
        Start start, Finish finish)
      : Pieces(inspector, at, id, flight, call, pieces),
        start_(std::move(start)), finish_(std::move(finish)) {}

private:
  int start(size_t i, MPI_Request *request) override {
    return start_(i, request);
  }
  void finish(size_t i) override { finish_(i); }

  const Start start_;
  const Finish finish_;
};

// The transports alive, by id (MpiTransport::find, for_each).
std::mutex registry_mutex;
std::unordered_map<uint64_t, MpiTransport *> registered;

// Elements of piece `i` of `count` split into pieces of `step`.
int piece_count(size_t i, size_t step, size_t count) {
  return static_cast<int>(std::min(step, count - i * step));
}

size_t pieces_of(size_t count, size_t step) {
  return std::max<size_t>(1, (count + step - 1) / step);
}

// Blocks as MPI's large-count calls take them, 64-bit, so that no block
// is cut into pieces. MPI reads them until the operation completes: the
// operation's call keeps them.
struct MpiBlocks {
  std::vector<MPI_Count> counts;
  std::vector<MPI_Aint> offsets;
  explicit MpiBlocks(const Blocks &b)
      : counts(b.counts.begin(), b.counts.end()),
        offsets(b.offsets.begin(), b.offsets.end()) {}
};

// buf /= divisor, element-wise in `dt`, in place.
void divide(void *buf, size_t count, DType dt, int divisor) {
  convert_scaled(buf, dt, buf, dt, count, 1.0f, divisor);
}

} // namespace

template <typename Start, typename Finish>
Status MpiTransport::start_pieces(const char *call, size_t pieces,
                                  Start start, Finish finish, WorkPtr *work) {
  std::unique_ptr<Pieces> started(
      new Calls<Start, Finish>(inspector_.get(), at_, id_, flight_, call,
                               pieces, std::move(start), std::move(finish)));
  NNCOMM_RETURN_IF_ERROR(started->begin());
  *work = std::move(started);
  return Status::Ok();
}

Status MpiTransport::begin(const ShadowOp &op) {
  NNCOMM_RETURN_IF_ERROR(refuse_if_broken());
  ++at_.seq;
  at_.fingerprint = op.fingerprint;
  at_.phase = op.phase;
  if (inspector_)
    inspector_->began(at_);
  flight_.enqueue(at_.seq,
                  {op.name, op.count, op.dt, op.root, op.fingerprint},
                  op.phase);
  return Join::open() ? Join::note(*this, op) : Status::Ok();
}

Status MpiTransport::check_call(uint64_t signature, bool always) {
  unchecked_ = Fingerprint().add(unchecked_).add(signature).value();
  // A signature compared once can later come on one rank beside another
  // call on the others (a rank with a batch fewer): its MPI call may then
  // complete with mixed data. So about one call in kSampledCalls is
  // compared too, chosen by the calls since the last comparison: the same
  // call on ranks that made the same calls. Ranks whose calls differed
  // compare at different calls, which the stall reports tell apart. (One
  // in 32 made bench/allreduce_bench.py's 4-byte all-reduce 0.4 µs
  // slower, +14 %; one in 128, 0.05 µs, +2 %.)
  const bool sampled = unchecked_ % kSampledCalls == 0;
  if (!always && !sampled && checked_.count(signature) != 0)
    return Status::Ok();
  // Every call since the last comparison is in `unchecked_`.
  ShadowOp op;
  op.kind = ShadowOp::Kind::kCheck;
  op.name = "check";
  op.fingerprint = signature;
  op.phase = 1;
  NNCOMM_RETURN_IF_ERROR(begin(op));
  bool same = false;
  NNCOMM_RETURN_IF_ERROR(same_everywhere(check_comm_, unchecked_, &same));
  unchecked_ = 0; // a difference is reported once
  if (!same) {
    const std::string message =
        "the ranks of this group make different calls (" +
        OperationLabel::current() +
        " here; different arguments: number, sizes, dtypes or order of the "
        "arrays, root or options, or another collective, now or since the "
        "last call compared)";
    flight_.failed(at_.seq);
    FlightRecorder::dump_after(message);
    return Status::InvalidArgument(message);
  }
  // Bounded: a program whose sizes never repeat compares again later.
  if (checked_.size() >= 4096)
    checked_.clear();
  checked_.insert(signature);
  return Status::Ok();
}

Status MpiTransport::Create(MPI_Comm comm, std::unique_ptr<MpiTransport> *out) {
  return Create(comm, Fingerprint().add("root").add(roots_made++).value(), out);
}

Status MpiTransport::Duplicate(std::unique_ptr<MpiTransport> *out,
                               const char *role) {
  NNCOMM_RETURN_IF_ERROR(begin(described(ShadowOp::Kind::kDuplicate,
                                         "duplicate", 0, DType::kInt64)));
  const uint64_t seq = at_.seq;
  const Status status = Create(
      comm_, Fingerprint().add(id_).add("duplicate").add(duplicates_++)
                 .value(),
      out);
  // The new communicator's own record holds the creation's steps; this
  // one's says how it ended, or a flight record would show every rank
  // still in it.
  if (status.ok()) {
    flight_.completed(seq);
    (*out)->inspector_->set_role(role);
  } else {
    flight_.failed(seq);
  }
  return status;
}

Status MpiTransport::Create(MPI_Comm comm, uint64_t id,
                            std::unique_ptr<MpiTransport> *out) {
  NNCOMM_RETURN_IF_ERROR(refuse_if_broken());
  set_job_abort(abort_world);
  // Nonblocking, so that a rank that never comes cannot hold this one
  // forever; the waiting policy is the parent's, so waited for here.
  std::vector<int> makers;
  const int err = world_ranks_of(comm, &makers);
  if (err != MPI_SUCCESS)
    return mpi_failure(err, "MPI_Group_translate_ranks");
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  NNCOMM_MPI_CALL(MPI_Comm_idup, comm, &dup, &request);
  std::unique_ptr<MpiTransport> transport(new MpiTransport(dup, id));
  NNCOMM_RETURN_IF_ERROR(transport->Init(&request, std::move(makers)));
  *out = std::move(transport);
  return Status::Ok();
}

Status MpiTransport::CreateGroup(const MpiTransport &parent,
                                 const std::vector<int> &ranks,
                                 std::unique_ptr<MpiTransport> *out) {
  MPI_Group parent_group = MPI_GROUP_NULL;
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Comm comm = MPI_COMM_NULL;
  NNCOMM_MPI_CALL(MPI_Comm_group, parent.comm_, &parent_group);
  int err = MPI_Group_incl(parent_group, static_cast<int>(ranks.size()),
                           ranks.data(), &group);
  MPI_Group_free(&parent_group);
  if (err != MPI_SUCCESS)
    return mpi_failure(err, "MPI_Group_incl");
  // Blocking: MPI has no nonblocking form. The caller has met every rank of
  // the parent first (a bounded barrier), so every member is here.
  err = MPI_Comm_create_group(parent.comm_, group, 0, &comm);
  MPI_Group_free(&group);
  if (err != MPI_SUCCESS)
    return mpi_failure(err, "MPI_Comm_create_group");
  Fingerprint id;
  id.add(parent.id_).add("group").add(parent.at_.seq);
  for (int r : ranks)
    id.add(static_cast<uint64_t>(r));
  std::unique_ptr<MpiTransport> transport(new MpiTransport(comm, id.value()));
  NNCOMM_RETURN_IF_ERROR(transport->Init(nullptr, {}));
  *out = std::move(transport);
  return Status::Ok();
}

Status MpiTransport::Init(MPI_Request *created, std::vector<int> makers) {
  if (created != nullptr) {
    // A communicator being created has no ranks to report stalls to yet.
    OperationLabel label("creating a communicator");
    // Not a Join operation: its transport has no ranks yet.
    Status status =
        begin(described(ShadowOp::Kind::kDuplicate, "create", 0,
                        DType::kInt64));
    if (status.ok()) {
      Calls idup(inspector_.get(), at_, id_, flight_, "MPI_Comm_idup", 1,
                 [created](size_t, MPI_Request *request) {
                   *request = *created;
                   return MPI_SUCCESS;
                 },
                 no_finish);
      status = idup.begin();
      Creation creation(idup, std::move(makers), id_, at_.seq);
      if (status.ok())
        status = wait_for(creation, false, nullptr);
    }
    if (!status.ok()) {
      // Never completed: freeing it would be erroneous.
      comm_ = MPI_COMM_NULL;
      return status;
    }
  }
  NNCOMM_MPI_CALL(MPI_Comm_set_errhandler, comm_, MPI_ERRORS_RETURN);
  NNCOMM_MPI_CALL(MPI_Comm_rank, comm_, &rank_);
  NNCOMM_MPI_CALL(MPI_Comm_size, comm_, &size_);
  std::vector<int> world_ranks;
  int err = world_ranks_of(comm_, &world_ranks);
  if (err != MPI_SUCCESS)
    return mpi_failure(err, "MPI_Group_translate_ranks");
  flight_.set_group(world_ranks);
  inspector_.reset(
      new StallInspector(comm_, rank_, std::move(world_ranks), id_));
  // Every member is here by now (the communicator is complete).
  NNCOMM_MPI_CALL(MPI_Comm_dup, comm_, &check_comm_);
  MPI_Comm node = MPI_COMM_NULL;
  NNCOMM_MPI_CALL(MPI_Comm_split_type, comm_, MPI_COMM_TYPE_SHARED, rank_,
                  MPI_INFO_NULL, &node);
  err = MPI_Comm_rank(node, &local_rank_);
  if (err != MPI_SUCCESS) {
    MPI_Comm_free(&node);
    return mpi_failure(err, "MPI_Comm_rank");
  }
  NNCOMM_RETURN_IF_ERROR(
      HierarchicalAllreduce::Create(comm_, rank_, node, &two_level_));
  created_seq_ = at_.seq;
  count_operations(id_, &at_.seq);
  std::lock_guard<std::mutex> lock(registry_mutex);
  registered[id_] = this;
  return Status::Ok();
}

MpiTransport *MpiTransport::find(uint64_t id) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  const auto it = registered.find(id);
  return it == registered.end() ? nullptr : it->second;
}

void MpiTransport::for_each(const std::function<void(MpiTransport &)> &f) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (auto &e : registered)
    f(*e.second);
}

MpiTransport::~MpiTransport() {
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto it = registered.find(id_);
    if (it != registered.end() && it->second == this) {
      registered.erase(it);
      stop_counting(id_);
    }
  }
  // After: Join may hold this transport, found before, until it lets go.
  Join::withdraw(this);
  inspector_.reset();
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (!finalized && check_comm_ != MPI_COMM_NULL)
    MPI_Comm_free(&check_comm_);
  if (!finalized && comm_ != MPI_COMM_NULL)
    MPI_Comm_free(&comm_);
}

Status MpiTransport::start_allreduce(void *buf, size_t count, DType dt,
                                     float scale, int divisor,
                                     WorkPtr *work) {
  MPI_Op op = MPI_OP_NULL;
  NNCOMM_RETURN_IF_ERROR(sum_op(dt, &op));
  // Named apart in stall reports and flight records; every rank of the
  // transport takes the same path (decided together at its creation).
  ShadowOp described_op = described(
      ShadowOp::Kind::kAllreduce,
      two_level_ ? "hierarchical_allreduce" : "allreduce", count, dt);
  described_op.scale = scale;
  described_op.divisor = divisor;
  NNCOMM_RETURN_IF_ERROR(begin(described_op));
  const size_t bytes = count * dtype_size(dt);
  if (bytes >= config::huge_page_bytes())
    prefer_huge_pages(buf, bytes);
  const size_t step = chunk_elements(dt);
  char *base = static_cast<char *>(buf);
  if (two_level_) {
    const Reduction r{base, count, step, dt, mpi_type(dt), op, scale,
                      divisor};
    HierarchicalAllreduce *levels = two_level_.get();
    return start_pieces(
        "the two-level all-reduce (MPI_Ireduce_scatter, MPI_Iallreduce, "
        "MPI_Iallgatherv)",
        HierarchicalAllreduce::steps(r),
        [=](size_t i, MPI_Request *request) {
          return levels->start(r, i, request);
        },
        [=](size_t i) { levels->finish(r, i); }, work);
  }
  const size_t size = dtype_size(dt);
  const MPI_Comm comm = comm_;
  // This rank's share is scaled where it lies and the sum overwrites it,
  // piece by piece, next to the piece's reduction.
  return start_pieces(
      "MPI_Iallreduce", pieces_of(count, step),
      [=](size_t i, MPI_Request *request) {
        char *piece = base + i * step * size;
        const int n = piece_count(i, step, count);
        if (scale != 1.0f)
          convert_scaled(piece, dt, piece, dt, n, scale, 1);
        return MPI_Iallreduce(MPI_IN_PLACE, piece, n, mpi_type(dt), op, comm,
                              request);
      },
      [=](size_t i) {
        if (divisor != 1)
          divide(base + i * step * size, piece_count(i, step, count), dt,
                 divisor);
      },
      work);
}

Status MpiTransport::start_reduce(void *buf, size_t count, DType dt, int root,
                                  int divisor, WorkPtr *work) {
  MPI_Op op = MPI_OP_NULL;
  NNCOMM_RETURN_IF_ERROR(sum_op(dt, &op));
  ShadowOp described_op =
      described(ShadowOp::Kind::kReduce, "reduce", count, dt, root);
  described_op.divisor = divisor;
  NNCOMM_RETURN_IF_ERROR(begin(described_op));
  const bool is_root = rank_ == root;
  const size_t step = chunk_elements(dt);
  char *base = static_cast<char *>(buf);
  const size_t size = dtype_size(dt);
  const MPI_Comm comm = comm_;
  return start_pieces(
      "MPI_Ireduce", pieces_of(count, step),
      [=](size_t i, MPI_Request *request) {
        char *piece = base + i * step * size;
        // Only the root receives; the others' buffers stay as they are.
        return MPI_Ireduce(is_root ? MPI_IN_PLACE : piece,
                           is_root ? piece : nullptr,
                           piece_count(i, step, count), mpi_type(dt), op,
                           root, comm, request);
      },
      [=](size_t i) {
        if (is_root && divisor != 1)
          divide(base + i * step * size, piece_count(i, step, count), dt,
                 divisor);
      },
      work);
}

Status MpiTransport::start_bcast(void *buf, size_t count, DType dt, int root,
                                 WorkPtr *work) {
  NNCOMM_RETURN_IF_ERROR(
      begin(described(ShadowOp::Kind::kBcast, "bcast", count, dt, root)));
  const MPI_Comm comm = comm_;
  const auto call = [=](size_t, MPI_Request *request) {
    return MPI_Ibcast_c(buf, static_cast<MPI_Count>(count), mpi_type(dt), root,
                        comm, request);
  };
  return start_pieces("MPI_Ibcast_c", 1, call, no_finish, work);
}

Status MpiTransport::start_allgather(const void *send, void *recv,
                                     size_t count, DType dt, WorkPtr *work) {
  NNCOMM_RETURN_IF_ERROR(
      begin(described(ShadowOp::Kind::kAllgather, "allgather", count, dt)));
  const MPI_Comm comm = comm_;
  const auto call = [=](size_t, MPI_Request *request) {
    return MPI_Iallgather_c(send, static_cast<MPI_Count>(count), mpi_type(dt),
                            recv, static_cast<MPI_Count>(count), mpi_type(dt),
                            comm, request);
  };
  return start_pieces("MPI_Iallgather_c", 1, call, no_finish, work);
}

Status MpiTransport::start_reduce_scatter(const void *send, void *recv,
                                          size_t count, DType dt, int divisor,
                                          WorkPtr *work) {
  MPI_Op op = MPI_OP_NULL;
  NNCOMM_RETURN_IF_ERROR(sum_op(dt, &op));
  ShadowOp described_op = described(ShadowOp::Kind::kReduceScatter,
                                   "reduce_scatter", count, dt);
  described_op.divisor = divisor;
  NNCOMM_RETURN_IF_ERROR(begin(described_op));
  const MPI_Comm comm = comm_;
  return start_pieces(
      "MPI_Ireduce_scatter_block_c", 1,
      [=](size_t, MPI_Request *request) {
        return MPI_Ireduce_scatter_block_c(send, recv,
                                           static_cast<MPI_Count>(count),
                                           mpi_type(dt), op, comm, request);
      },
      [=](size_t) {
        if (divisor != 1)
          divide(recv, count, dt, divisor);
      },
      work);
}

Status MpiTransport::start_alltoallv(const void *send,
                                     const Blocks &send_blocks, void *recv,
                                     const Blocks &recv_blocks, DType dt,
                                     WorkPtr *work) {
  // The counts differ from rank to rank; the ranks' number does not.
  ShadowOp op = described(ShadowOp::Kind::kAlltoallv, "alltoallv", size_, dt);
  if (Join::open()) {
    op.counts.assign(send_blocks.counts.begin(), send_blocks.counts.end());
    op.from.assign(recv_blocks.counts.begin(), recv_blocks.counts.end());
  }
  NNCOMM_RETURN_IF_ERROR(begin(op));
  const MPI_Comm comm = comm_;
  const auto call = [=, from = MpiBlocks(send_blocks),
                     to = MpiBlocks(recv_blocks)](size_t,
                                                  MPI_Request *request) {
    return MPI_Ialltoallv_c(send, from.counts.data(), from.offsets.data(),
                            mpi_type(dt), recv, to.counts.data(),
                            to.offsets.data(), mpi_type(dt), comm, request);
  };
  return start_pieces("MPI_Ialltoallv_c", 1, call, no_finish, work);
}

Status MpiTransport::start_allgatherv(const void *send, size_t count,
                                      void *recv, const Blocks &blocks,
                                      DType dt, WorkPtr *work) {
  const size_t total = std::accumulate(blocks.counts.begin(),
                                       blocks.counts.end(), size_t(0));
  ShadowOp op =
      described(ShadowOp::Kind::kAllgatherv, "allgatherv", total, dt);
  if (Join::open())
    op.counts.assign(blocks.counts.begin(), blocks.counts.end());
  NNCOMM_RETURN_IF_ERROR(begin(op));
  const MPI_Comm comm = comm_;
  const auto call = [=, to = MpiBlocks(blocks)](size_t,
                                                MPI_Request *request) {
    return MPI_Iallgatherv_c(send, static_cast<MPI_Count>(count),
                             mpi_type(dt), recv, to.counts.data(),
                             to.offsets.data(), mpi_type(dt), comm, request);
  };
  return start_pieces("MPI_Iallgatherv_c", 1, call, no_finish, work);
}

Status MpiTransport::start_barrier(WorkPtr *work) {
  NNCOMM_RETURN_IF_ERROR(begin(
      described(ShadowOp::Kind::kBarrier, "barrier", 0, DType::kInt64)));
  const MPI_Comm comm = comm_;
  const auto call = [=](size_t, MPI_Request *request) {
    return MPI_Ibarrier(comm, request);
  };
  return start_pieces("MPI_Ibarrier", 1, call, no_finish, work);
}

Status MpiTransport::agree(uint64_t value, bool *same) {
  NNCOMM_RETURN_IF_ERROR(
      begin(described(ShadowOp::Kind::kAgree, "agree", 2, DType::kInt64)));
  return same_everywhere(comm_, value, same);
}

Status MpiTransport::unite(uint64_t *words, size_t count) {
  NNCOMM_RETURN_IF_ERROR(begin(
      described(ShadowOp::Kind::kUnite, "unite", count, DType::kInt64)));
  WorkPtr round;
  NNCOMM_RETURN_IF_ERROR(start_word_round(
      comm_, words, static_cast<int>(count), MPI_UINT64_T, MPI_BOR, &round));
  return wait_for(*round, rank_ == 0, nullptr);
}

Status MpiTransport::same_everywhere(MPI_Comm comm, uint64_t value,
                                     bool *same) {
  // max(v) == v and max(~v) == ~v hold on every rank only if all v agree.
  uint64_t both[2] = {value, ~value};
  WorkPtr round;
  NNCOMM_RETURN_IF_ERROR(start_same(comm, both, &round));
  NNCOMM_RETURN_IF_ERROR(wait_for(*round, rank_ == 0, nullptr));
  *same = both[0] == value && both[1] == ~value;
  return Status::Ok();
}

Status MpiTransport::start_same(MPI_Comm comm, uint64_t *both,
                                WorkPtr *work) {
  return start_word_round(comm, both, 2, MPI_UINT64_T, MPI_MAX, work);
}

Status MpiTransport::start_count(int64_t mine, int64_t *total,
                                 WorkPtr *work) {
  NNCOMM_RETURN_IF_ERROR(
      begin(described(ShadowOp::Kind::kCount, "count", 1, DType::kInt64)));
  *total = mine;
  return start_word_round(comm_, total, 1, MPI_INT64_T, MPI_SUM, work);
}

Status MpiTransport::start_word_round(MPI_Comm comm, void *words, int count,
                                      MPI_Datatype type, MPI_Op op,
                                      WorkPtr *work) {
  return start_pieces(
      "MPI_Iallreduce", 1,
      [=](size_t, MPI_Request *request) {
        return MPI_Iallreduce(MPI_IN_PLACE, words, count, type, op, comm,
                              request);
      },
      no_finish, work);
}

const std::vector<int> &MpiTransport::world_ranks() const {
  static const std::vector<int> none;
  return inspector_ ? inspector_->world_ranks() : none;
}

void MpiTransport::forget_calls() {
  checked_.clear();
  unchecked_ = 0;
}

namespace {
// `*scratch` beginning with `bytes` zeros, for a leaver's share; kept
// from one operation to the next, so that it is allocated once.
char *zeros(std::vector<char> *scratch, size_t bytes) {
  bytes = std::max<size_t>(bytes, 16);
  if (scratch->size() < bytes)
    scratch->resize(bytes);
  std::memset(scratch->data(), 0, bytes);
  return scratch->data();
}
} // namespace

Status MpiTransport::start_shadow(const ShadowOp &op,
                                  std::vector<char> *scratch, WorkPtr *work) {
  using Kind = ShadowOp::Kind;
  const size_t size = dtype_size(op.dt);
  const size_t n = static_cast<size_t>(size_);
  switch (op.kind) {
  case Kind::kAllreduce:
    return start_allreduce(zeros(scratch, op.count * size), op.count, op.dt,
                           op.scale, op.divisor, work);
  case Kind::kReduce:
    return start_reduce(zeros(scratch, op.count * size), op.count, op.dt,
                        op.root, op.divisor, work);
  case Kind::kBcast:
    if (op.root == rank_) {
      return Status::InvalidArgument(
          "the ranks still training broadcast from world rank " +
          std::to_string(world_ranks()[rank_]) +
          ", whose data has ended (it left comm.join()); broadcast from a "
          "rank still training");
    }
    return start_bcast(zeros(scratch, op.count * size), op.count, op.dt,
                       op.root, work);
  case Kind::kAllgather: {
    char *buf = zeros(scratch, (n + 1) * op.count * size);
    return start_allgather(buf, buf + op.count * size, op.count, op.dt, work);
  }
  case Kind::kReduceScatter: {
    char *buf = zeros(scratch, (n + 1) * op.count * size);
    return start_reduce_scatter(buf, buf + n * op.count * size, op.count,
                                op.dt, op.divisor, work);
  }
  case Kind::kAllgatherv: {
    if (op.counts.size() != n)
      break;
    Blocks blocks = Blocks::packed(
        std::vector<size_t>(op.counts.begin(), op.counts.end()));
    const size_t mine = op.counts[rank_];
    char *buf = zeros(scratch, (blocks.extent() + mine) * size);
    return start_allgatherv(buf + blocks.extent() * size, mine, buf, blocks,
                            op.dt, work);
  }
  case Kind::kAlltoallv: {
    // `counts` and `from` are, per rank, what it sends to this one and
    // receives from it (Join gathers them from every rank still training).
    if (op.counts.size() != n || op.from.size() != n)
      break;
    Blocks to_send = Blocks::packed(
        std::vector<size_t>(op.from.begin(), op.from.end()));
    Blocks to_receive = Blocks::packed(
        std::vector<size_t>(op.counts.begin(), op.counts.end()));
    const size_t sent = to_send.extent() * size;
    char *buf = zeros(scratch, sent + to_receive.extent() * size);
    return start_alltoallv(buf, to_send, buf + sent, to_receive, op.dt, work);
  }
  case Kind::kBarrier:
    return start_barrier(work);
  case Kind::kAgree:
  case Kind::kCheck: {
    // Zeros leave every rank's maximum as it is: the comparison is among
    // the ranks still training. Names do not travel: the records'.
    ShadowOp named = op;
    named.name = op.kind == Kind::kAgree ? "agree" : "check";
    NNCOMM_RETURN_IF_ERROR(begin(named));
    uint64_t *both = reinterpret_cast<uint64_t *>(zeros(scratch, 16));
    return start_same(op.kind == Kind::kAgree ? comm_ : check_comm_, both,
                      work);
  }
  case Kind::kCount: {
    int64_t *total = reinterpret_cast<int64_t *>(zeros(scratch, 8));
    return start_count(0, total, work);
  }
  case Kind::kUnite: {
    // Zeros leave every rank's OR as it is.
    NNCOMM_RETURN_IF_ERROR(begin(op));
    uint64_t *words =
        reinterpret_cast<uint64_t *>(zeros(scratch, 8 * op.count));
    return start_word_round(comm_, words, static_cast<int>(op.count),
                            MPI_UINT64_T, MPI_BOR, work);
  }
  case Kind::kDuplicate:
    return Status::InvalidArgument(
        "the ranks still training make a new communicator (a new callback "
        "engine, GPU path or queue of async_op=True calls) after world "
        "rank " +
        std::to_string(world_ranks()[rank_]) +
        " left comm.join(); make callbacks, and a group's first async_op "
        "call, before the data ends, so that every rank has them");
  }
  return Status::InvalidArgument("an operation of the ranks still training "
                                 "is described inconsistently");
}

void MpiTransport::abort(int errorcode) const { MPI_Abort(comm_, errorcode); }

} // namespace nncomm
