#include "nncomm/mpi_transport.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>

#include "nncomm/bfloat16.hpp"
#include "nncomm/config.hpp"
#include "nncomm/fingerprint.hpp"
#include "nncomm/host_memory.hpp"
#include "nncomm/wait.hpp"

namespace nncomm {

Status Status::Mpi(int mpi_error, const char *call) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(mpi_error, text, &length) != MPI_SUCCESS)
    length = 0;
  return Status(StatusCode::kMpiError,
                std::string(call) + " failed: " + std::string(text, length));
}

namespace {

#define NNCOMM_MPI_CALL(fn, ...)                                               \
  do {                                                                         \
    int _nncomm_err = fn(__VA_ARGS__);                                         \
    if (_nncomm_err != MPI_SUCCESS)                                            \
      return Status::Mpi(_nncomm_err, #fn);                                    \
  } while (0)

// MPI has no 16-bit float sums. Each step widens to float, adds, and rounds
// back, which is what a float16 reduction in numpy does per addition.
template <typename T>
void narrow_sum(void *in, void *inout, int *len, MPI_Datatype *) {
  const T *a = static_cast<const T *>(in);
  T *b = static_cast<T *>(inout);
  for (int i = 0; i < *len; ++i) {
    b[i] = static_cast<T>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
  }
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
template <typename T> Status narrow_sum_op(MPI_Op *op) {
  static MPI_Op created_op = MPI_OP_NULL;
  static int created = MPI_Op_create(&narrow_sum<T>, 1, &created_op);
  if (created != MPI_SUCCESS)
    return Status::Mpi(created, "MPI_Op_create");
  *op = created_op;
  return Status::Ok();
}

// The sum for `dt`.
Status sum_op(DType dt, MPI_Op *op) {
  if (dt == DType::kFloat16)
    return narrow_sum_op<_Float16>(op);
  if (dt == DType::kBFloat16)
    return narrow_sum_op<BFloat16>(op);
  *op = MPI_SUM;
  return Status::Ok();
}

// Elements per reduction call: the configured chunk, capped so that the
// count always fits MPI's int.
size_t chunk_elements(DType dt) {
  size_t elems = config::chunk_bytes() / dtype_size(dt);
  return std::max<size_t>(1, std::min<size_t>(elems, INT_MAX));
}

// Runs `reduce_piece(piece, n)` over `buf` a chunk at a time. Large buffers
// are moved onto huge pages first (host_memory.hpp).
template <typename ReducePiece>
Status for_each_chunk(void *buf, size_t count, DType dt,
                      ReducePiece reduce_piece) {
  const size_t bytes = count * dtype_size(dt);
  if (bytes >= config::huge_page_bytes())
    prefer_huge_pages(buf, bytes);
  const size_t step = chunk_elements(dt);
  char *base = static_cast<char *>(buf);
  for (size_t done = 0; done < count; done += step) {
    const int n = static_cast<int>(std::min(step, count - done));
    NNCOMM_RETURN_IF_ERROR(reduce_piece(base + done * dtype_size(dt), n));
  }
  return Status::Ok();
}

thread_local const OperationLabel *operation_label = nullptr;

// Tests made back to back before a wait starts yielding and looking at
// the clock: about 5 µs on a 2-rank shared-memory job.
constexpr int kSpinTests = 64;

std::string rank_list(const std::vector<int> &ranks) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ranks.size(); ++i)
    out << (i ? ", " : "") << ranks[i];
  out << "]";
  return out.str();
}

} // namespace

OperationLabel::OperationLabel(const char *format, size_t a, size_t b)
    : format_(format), a_(a), b_(b), previous_(operation_label) {
  operation_label = this;
}

OperationLabel::~OperationLabel() { operation_label = previous_; }

std::string OperationLabel::current() {
  if (operation_label == nullptr)
    return "an operation";
  char text[256];
  std::snprintf(text, sizeof text, operation_label->format_,
                operation_label->a_, operation_label->b_);
  return text;
}

// What the stall reports say a rank is doing: the same on every rank making
// the same MPI call.
uint64_t operation(const char *kind, size_t count, DType dt, int root = 0) {
  return Fingerprint()
      .add(kind)
      .add(count)
      .add(static_cast<uint64_t>(dt))
      .add(static_cast<uint64_t>(root))
      .value();
}

// Fails once a wait has failed in this process (wait.hpp).
Status refuse_if_broken() {
  std::string reason;
  if (broken(&reason)) {
    return Status::Communicator("nncomm can no longer communicate: " + reason +
                                "; the job is being aborted");
  }
  return Status::Ok();
}

Status MpiTransport::begin(uint64_t fingerprint, uint64_t phase) const {
  NNCOMM_RETURN_IF_ERROR(refuse_if_broken());
  ++at_.seq;
  at_.fingerprint = fingerprint;
  at_.phase = phase;
  return Status::Ok();
}

Status MpiTransport::check_call(uint64_t signature, bool always) const {
  unchecked_ = Fingerprint().add(unchecked_).add(signature).value();
  if (!always && checked_.count(signature) != 0)
    return Status::Ok();
  // Every call since the last comparison is in `unchecked_`.
  NNCOMM_RETURN_IF_ERROR(begin(signature, 1));
  bool same = false;
  NNCOMM_RETURN_IF_ERROR(same_everywhere(check_comm_, unchecked_, &same));
  unchecked_ = 0; // a difference is reported once
  if (!same) {
    return Status::InvalidArgument(
        "the ranks of this group make different calls (" +
        OperationLabel::current() +
        " here; different arguments: number, sizes, dtypes or order of the "
        "arrays, root or options, or another collective, now or since the "
        "last call compared)");
  }
  // Bounded: a program whose sizes never repeat compares again later.
  if (checked_.size() >= 4096)
    checked_.clear();
  checked_.insert(signature);
  return Status::Ok();
}

Status MpiTransport::wait(MPI_Request *request, const Polling *polling) const {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const double timeout = config::timeout_seconds();
  const double stall = config::stall_warning_seconds();
  const auto after = [&](double seconds) {
    return start + std::chrono::duration_cast<clock::duration>(
                       std::chrono::duration<double>(seconds));
  };
  auto next_look = after(StallInspector::kArrivalReportSeconds);
  // Late enough for the other waiting ranks' first reports to be in.
  auto next_warning =
      after(std::max(stall, 2 * StallInspector::kArrivalReportSeconds));
  auto next_signals = after(0.1);
  // Most operations of a healthy job complete within a few tests: those
  // are made back to back, before any clock read or yield.
  for (int spin = 0; spin < kSpinTests; ++spin) {
    int done = 0;
    NNCOMM_MPI_CALL(MPI_Test, request, &done, MPI_STATUS_IGNORE);
    if (done)
      return Status::Ok();
  }
  for (;;) {
    int done = 0;
    NNCOMM_MPI_CALL(MPI_Test, request, &done, MPI_STATUS_IGNORE);
    if (done)
      return Status::Ok();
    if (polling != nullptr && polling->cancel != nullptr &&
        polling->cancel->load()) {
      mark_broken("a wait for other ranks was cancelled", false);
      return Status::Communicator("the wait for other ranks was cancelled");
    }
    const auto now = clock::now();
    if (polling == nullptr && now >= next_signals) {
      next_signals = now + std::chrono::milliseconds(100);
      if (interrupted()) {
        mark_broken("a wait was interrupted (" + OperationLabel::current() +
                        ")",
                    false);
        return Status::Interrupted();
      }
    }
    if (now >= next_look) {
      next_look = now + std::chrono::milliseconds(200);
      if (inspector_) {
        inspector_->arrived(at_);
        const std::vector<int> other = inspector_->differing(at_);
        if (!other.empty()) {
          // This operation can never complete.
          const std::string message =
              "the ranks of this group make different calls: " +
              OperationLabel::current() + " (operation " +
              std::to_string(at_.seq) + ") here, another call on world ranks " +
              rank_list(other);
          mark_broken(message, true);
          return Status::InvalidArgument(message);
        }
      }
      const double waited = std::chrono::duration<double>(now - start).count();
      const bool timed_out = timeout > 0 && waited >= timeout;
      const bool warn = stall > 0 && now >= next_warning && rank_ == 0;
      if (timed_out || warn) {
        const std::vector<int> missing =
            inspector_ ? inspector_->missing(at_) : std::vector<int>();
        std::ostringstream what;
        what << OperationLabel::current() << " (operation " << at_.seq;
        if (inspector_)
          what << " on the group of world ranks "
               << rank_list(inspector_->world_ranks());
        what << ")";
        if (timed_out) {
          std::ostringstream message;
          message << what.str() << " did not complete in " << timeout
                  << " s (NNCOMM_TIMEOUT): ";
          if (inspector_)
            message << "world ranks " << rank_list(missing)
                    << " never arrived (stopped, dead or in another call?)";
          else
            message << "not every rank arrived";
          mark_broken(message.str(), true);
          return Status::Communicator(message.str());
        }
        next_warning = now + std::chrono::duration_cast<clock::duration>(
                                 std::chrono::duration<double>(stall));
        std::fprintf(stderr,
                     "nncomm: stalled for %.0f s in %s: waiting for world "
                     "ranks %s\n",
                     waited, what.str().c_str(), rank_list(missing).c_str());
        std::fflush(stderr);
      }
    }
    if (polling == nullptr ||
        (polling->hurry != nullptr && polling->hurry->load())) {
      // Only a process waiting for its core (more ranks than cores) gets
      // it; otherwise the test comes again at once.
      std::this_thread::yield();
    } else if (polling->interval_us > 0) {
      std::this_thread::sleep_for(
          std::chrono::microseconds(polling->interval_us));
    }
  }
}

Status MpiTransport::Create(MPI_Comm comm, std::unique_ptr<MpiTransport> *out) {
  NNCOMM_RETURN_IF_ERROR(refuse_if_broken());
  // Nonblocking, so that a rank that never comes cannot hold this one
  // forever; the waiting policy is the parent's, so waited for here.
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  NNCOMM_MPI_CALL(MPI_Comm_idup, comm, &dup, &request);
  std::unique_ptr<MpiTransport> transport(new MpiTransport(dup));
  NNCOMM_RETURN_IF_ERROR(transport->Init(&request));
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
    return Status::Mpi(err, "MPI_Group_incl");
  // Blocking: MPI has no nonblocking form. The caller has met every rank of
  // the parent first (a bounded barrier), so every member is here.
  err = MPI_Comm_create_group(parent.comm_, group, 0, &comm);
  MPI_Group_free(&group);
  if (err != MPI_SUCCESS)
    return Status::Mpi(err, "MPI_Comm_create_group");
  std::unique_ptr<MpiTransport> transport(new MpiTransport(comm));
  NNCOMM_RETURN_IF_ERROR(transport->Init(nullptr));
  *out = std::move(transport);
  return Status::Ok();
}

Status MpiTransport::Init(MPI_Request *created) {
  if (created != nullptr) {
    // A communicator being created has no ranks to report stalls to yet.
    OperationLabel label("creating a communicator");
    Status status = begin(operation("create", 0, DType::kInt64));
    if (status.ok())
      status = wait(created, nullptr);
    if (!status.ok()) {
      // Never completed: freeing it would be erroneous.
      comm_ = MPI_COMM_NULL;
      return status;
    }
  }
  NNCOMM_MPI_CALL(MPI_Comm_set_errhandler, comm_, MPI_ERRORS_RETURN);
  NNCOMM_MPI_CALL(MPI_Comm_rank, comm_, &rank_);
  NNCOMM_MPI_CALL(MPI_Comm_size, comm_, &size_);
  std::vector<int> ranks(size_);
  std::vector<int> world_ranks(size_);
  for (int r = 0; r < size_; ++r)
    ranks[r] = r;
  MPI_Group own = MPI_GROUP_NULL;
  MPI_Group world = MPI_GROUP_NULL;
  NNCOMM_MPI_CALL(MPI_Comm_group, comm_, &own);
  int err = MPI_Comm_group(MPI_COMM_WORLD, &world);
  if (err == MPI_SUCCESS) {
    err = MPI_Group_translate_ranks(own, size_, ranks.data(), world,
                                    world_ranks.data());
  }
  MPI_Group_free(&own);
  if (world != MPI_GROUP_NULL)
    MPI_Group_free(&world);
  if (err != MPI_SUCCESS)
    return Status::Mpi(err, "MPI_Group_translate_ranks");
  inspector_.reset(new StallInspector(comm_, rank_, std::move(world_ranks)));
  // Every member is here by now (the communicator is complete).
  NNCOMM_MPI_CALL(MPI_Comm_dup, comm_, &check_comm_);
  MPI_Comm node = MPI_COMM_NULL;
  NNCOMM_MPI_CALL(MPI_Comm_split_type, comm_, MPI_COMM_TYPE_SHARED, rank_,
                  MPI_INFO_NULL, &node);
  err = MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_free(&node);
  if (err != MPI_SUCCESS)
    return Status::Mpi(err, "MPI_Comm_rank");
  return Status::Ok();
}

MpiTransport::~MpiTransport() {
  inspector_.reset();
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (!finalized && check_comm_ != MPI_COMM_NULL)
    MPI_Comm_free(&check_comm_);
  if (!finalized && comm_ != MPI_COMM_NULL)
    MPI_Comm_free(&comm_);
}

Status MpiTransport::allreduce(void *buf, size_t count, DType dt,
                               const Polling *polling, const PieceFn &before,
                               const PieceFn &after) const {
  MPI_Op op = MPI_OP_NULL;
  NNCOMM_RETURN_IF_ERROR(sum_op(dt, &op));
  NNCOMM_RETURN_IF_ERROR(begin(operation("allreduce", count, dt)));
  return for_each_chunk(buf, count, dt, [&](char *piece, int n) {
    if (before)
      before(piece, static_cast<size_t>(n));
    MPI_Request request = MPI_REQUEST_NULL;
    NNCOMM_MPI_CALL(MPI_Iallreduce, MPI_IN_PLACE, piece, n, mpi_type(dt), op,
                    comm_, &request);
    NNCOMM_RETURN_IF_ERROR(wait(&request, polling));
    if (after)
      after(piece, static_cast<size_t>(n));
    return Status::Ok();
  });
}

Status MpiTransport::reduce(void *buf, size_t count, DType dt, int root) const {
  MPI_Op op = MPI_OP_NULL;
  NNCOMM_RETURN_IF_ERROR(sum_op(dt, &op));
  NNCOMM_RETURN_IF_ERROR(begin(operation("reduce", count, dt, root)));
  const bool is_root = rank_ == root;
  return for_each_chunk(buf, count, dt, [&](char *piece, int n) {
    // Only the root receives; the others' buffers stay as they are.
    MPI_Request request = MPI_REQUEST_NULL;
    NNCOMM_MPI_CALL(MPI_Ireduce, is_root ? MPI_IN_PLACE : piece,
                    is_root ? piece : nullptr, n, mpi_type(dt), op, root,
                    comm_, &request);
    return wait(&request, nullptr);
  });
}

Status MpiTransport::bcast(void *buf, size_t count, DType dt, int root) const {
  NNCOMM_RETURN_IF_ERROR(begin(operation("bcast", count, dt, root)));
  MPI_Request request = MPI_REQUEST_NULL;
  NNCOMM_MPI_CALL(MPI_Ibcast_c, buf, static_cast<MPI_Count>(count),
                  mpi_type(dt), root, comm_, &request);
  return wait(&request, nullptr);
}

Status MpiTransport::allgather(const void *send, void *recv, size_t count,
                               DType dt) const {
  NNCOMM_RETURN_IF_ERROR(begin(operation("allgather", count, dt)));
  MPI_Request request = MPI_REQUEST_NULL;
  NNCOMM_MPI_CALL(MPI_Iallgather_c, send, static_cast<MPI_Count>(count),
                  mpi_type(dt), recv, static_cast<MPI_Count>(count),
                  mpi_type(dt), comm_, &request);
  return wait(&request, nullptr);
}

Status MpiTransport::reduce_scatter(const void *send, void *recv, size_t count,
                                    DType dt) const {
  MPI_Op op = MPI_OP_NULL;
  NNCOMM_RETURN_IF_ERROR(sum_op(dt, &op));
  NNCOMM_RETURN_IF_ERROR(begin(operation("reduce_scatter", count, dt)));
  MPI_Request request = MPI_REQUEST_NULL;
  NNCOMM_MPI_CALL(MPI_Ireduce_scatter_block_c, send, recv,
                  static_cast<MPI_Count>(count), mpi_type(dt), op, comm_,
                  &request);
  return wait(&request, nullptr);
}

Status MpiTransport::barrier() const {
  OperationLabel label("barrier");
  NNCOMM_RETURN_IF_ERROR(begin(operation("barrier", 0, DType::kInt64)));
  MPI_Request request = MPI_REQUEST_NULL;
  NNCOMM_MPI_CALL(MPI_Ibarrier, comm_, &request);
  return wait(&request, nullptr);
}

Status MpiTransport::agree(uint64_t value, bool *same) const {
  NNCOMM_RETURN_IF_ERROR(begin(operation("agree", 2, DType::kInt64)));
  return same_everywhere(comm_, value, same);
}

Status MpiTransport::same_everywhere(MPI_Comm comm, uint64_t value,
                                     bool *same) const {
  // max(v) == v and max(~v) == ~v hold on every rank only if all v agree.
  uint64_t both[2] = {value, ~value};
  MPI_Request request = MPI_REQUEST_NULL;
  NNCOMM_MPI_CALL(MPI_Iallreduce, MPI_IN_PLACE, both, 2, MPI_UINT64_T, MPI_MAX,
                  comm, &request);
  NNCOMM_RETURN_IF_ERROR(wait(&request, nullptr));
  *same = both[0] == value && both[1] == ~value;
  return Status::Ok();
}

void MpiTransport::abort(int errorcode) const { MPI_Abort(comm_, errorcode); }

} // namespace nncomm
