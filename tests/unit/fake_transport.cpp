#include "fake_transport.hpp"

#include <cstring>
#include <numeric>
#include <sstream>
#include <thread>

#include "check.hpp"
#include "nncomm/host/bfloat16.hpp"
#include "nncomm/core/fingerprint.hpp"
#include "nncomm/host/elementwise.hpp"
#include "nncomm/core/wait.hpp"

namespace unit {

using nncomm::DType;
using nncomm::Status;
using nncomm::WorkPtr;

namespace {

template <typename T> T plus(T a, T b) { return a + b; }
// 16-bit floats: each addition widened to float and rounded back, as
// MpiTransport's narrow_sum (and numpy) add them.
template <> _Float16 plus(_Float16 a, _Float16 b) {
  return static_cast<_Float16>(static_cast<float>(a) + static_cast<float>(b));
}
template <> nncomm::BFloat16 plus(nncomm::BFloat16 a, nncomm::BFloat16 b) {
  return nncomm::BFloat16(static_cast<float>(a) + static_cast<float>(b));
}

template <typename T> void add_into(char *sum, const char *x, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    T a, b;
    std::memcpy(&a, sum + i * sizeof(T), sizeof(T));
    std::memcpy(&b, x + i * sizeof(T), sizeof(T));
    a = plus(a, b);
    std::memcpy(sum + i * sizeof(T), &a, sizeof(T));
  }
}

// sum[i] += x[i] for `count` elements of `dt`.
void add_into(char *sum, const char *x, size_t count, DType dt) {
  switch (dt) {
  case DType::kFloat32: return add_into<float>(sum, x, count);
  case DType::kFloat64: return add_into<double>(sum, x, count);
  case DType::kFloat16: return add_into<_Float16>(sum, x, count);
  case DType::kBFloat16: return add_into<nncomm::BFloat16>(sum, x, count);
  case DType::kInt32: return add_into<int32_t>(sum, x, count);
  case DType::kInt64: return add_into<int64_t>(sum, x, count);
  }
}

// Block `block` of `bytes` bytes of every share, summed in rank order.
std::vector<char> sum_of(const std::vector<const std::vector<char> *> &shares,
                         size_t block, size_t bytes, const Call &call) {
  std::vector<char> sum(shares[0]->begin() + block * bytes,
                        shares[0]->begin() + (block + 1) * bytes);
  for (size_t r = 1; r < shares.size(); ++r) {
    add_into(sum.data(), shares[r]->data() + block * bytes, call.count,
             call.dtype);
  }
  return sum;
}

std::vector<char> copy_of(const void *buffer, size_t bytes) {
  const char *p = static_cast<const char *>(buffer);
  return std::vector<char>(p, p + bytes);
}

std::string rank_list(const std::vector<int> &ranks) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ranks.size(); ++i)
    out << (i ? ", " : "") << ranks[i];
  out << "]";
  return out.str();
}

const char *kind_name(OpKind kind) {
  switch (kind) {
  case OpKind::kAllreduce: return "allreduce";
  case OpKind::kReduce: return "reduce";
  case OpKind::kBcast: return "bcast";
  case OpKind::kAllgather: return "allgather";
  case OpKind::kReduceScatter: return "reduce_scatter";
  case OpKind::kAlltoallv: return "alltoallv";
  case OpKind::kAllgatherv: return "allgatherv";
  case OpKind::kBarrier: return "barrier";
  case OpKind::kAgree: return "agree";
  case OpKind::kCheck: return "check of a call";
  case OpKind::kUnite: return "unite";
  }
  return "?";
}

} // namespace

std::ostream &operator<<(std::ostream &out, const Call &call) {
  out << kind_name(call.kind);
  if (call.kind == OpKind::kBarrier || call.kind == OpKind::kAgree ||
      call.kind == OpKind::kCheck)
    return out;
  out << " of " << call.count << " " << show(call.dtype);
  if (call.kind == OpKind::kReduce || call.kind == OpKind::kBcast)
    out << " with root " << call.root;
  return out;
}

// One rank's side of an operation.
class FakeWork : public nncomm::Work {
public:
  FakeWork(FakeWorld &world, int rank, size_t index, void *out, int divisor,
           std::optional<nncomm::Blocks> blocks)
      : world_(world), rank_(rank), index_(index), out_(out),
        divisor_(divisor), blocks_(std::move(blocks)) {}

  Status test(bool *done) override {
    *done = done_;
    if (done_)
      return Status::Ok();
    std::unique_lock<std::mutex> lock(world_.mutex_);
    if (world_.failing_.count({rank_, index_}) != 0) {
      return Status::Transport("fake transport: " + describe() +
                               " failed on world rank " +
                               std::to_string(world_.world_ranks_[rank_]));
    }
    FakeWorld::Operation &op = world_.operations_.at(index_);
    const Call mine = op.arrivals[rank_]->call;
    const auto now = FakeWorld::Clock::now();
    bool complete = true;
    for (int r = 0; r < world_.size(); ++r) {
      const std::optional<FakeWorld::Arrival> &other = op.arrivals[r];
      if (!other) {
        complete = false;
      } else if (other->call != mine) {
        std::ostringstream message;
        message << "the ranks of this group make different calls at "
                << describe() << ": " << mine << " here, " << other->call
                << " on world rank " << world_.world_ranks_[r];
        return Status::InvalidArgument(message.str());
      } else if (other->seen_at > now) {
        complete = false;
      }
    }
    if (!complete)
      return Status::Ok();
    if (!op.computed)
      world_.compute(op);
    if (!op.error.empty())
      return Status::InvalidArgument("fake transport: " + op.error);
    const std::vector<char> result = std::move(op.results[rank_]);
    lock.unlock();
    if (blocks_)
      place(result, mine.dtype);
    else if (!result.empty())
      std::memcpy(out_, result.data(), result.size());
    if (divisor_ != 1) {
      nncomm::convert_scaled(out_, mine.dtype, out_, mine.dtype, mine.count,
                             1.0f, divisor_);
    }
    done_ = *done = true;
    return Status::Ok();
  }

  nncomm::Stall inspect() override {
    nncomm::Stall stall;
    stall.known = true;
    std::lock_guard<std::mutex> lock(world_.mutex_);
    const FakeWorld::Operation &op = world_.operations_.at(index_);
    const auto now = FakeWorld::Clock::now();
    for (int r = 0; r < world_.size(); ++r) {
      if (r != rank_ && (!op.arrivals[r] || op.arrivals[r]->seen_at > now))
        stall.missing.push_back(world_.world_ranks_[r]);
    }
    return stall;
  }

  std::string describe() const override { return world_.describe(index_); }

private:
  // Copies `result`, the blocks back to back, each to its place in out_.
  void place(const std::vector<char> &result, DType dt) const {
    const size_t elem = nncomm::dtype_size(dt);
    size_t at = 0;
    for (size_t r = 0; r < blocks_->counts.size(); ++r) {
      const size_t bytes = blocks_->counts[r] * elem;
      if (bytes > 0) {
        std::memcpy(static_cast<char *>(out_) + blocks_->offsets[r] * elem,
                    result.data() + at, bytes);
      }
      at += bytes;
    }
  }

  FakeWorld &world_;
  const int rank_;
  const size_t index_;
  void *const out_;
  const int divisor_;
  const std::optional<nncomm::Blocks> blocks_;
  bool done_ = false;
};

FakeWorld::FakeWorld(int size, std::vector<int> world_ranks)
    : size_(size), world_ranks_(std::move(world_ranks)), logs_(size),
      delays_(size, Clock::duration::zero()) {
  for (int r = static_cast<int>(world_ranks_.size()); r < size; ++r)
    world_ranks_.push_back(r);
}

std::unique_ptr<FakeTransport> FakeWorld::transport(int rank) {
  return std::make_unique<FakeTransport>(*this, rank);
}

void FakeWorld::set_delay(int rank, std::chrono::microseconds delay) {
  std::lock_guard<std::mutex> lock(mutex_);
  delays_[rank] = delay;
}

void FakeWorld::fail_operation(int rank, size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  failing_.insert({rank, index});
}

std::vector<LoggedOp> FakeWorld::log(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return logs_[rank];
}

std::vector<Call> FakeWorld::calls(int rank) const {
  std::vector<Call> calls;
  for (const LoggedOp &op : log(rank))
    calls.push_back(op.call);
  return calls;
}

size_t FakeWorld::arrive(int rank, const Call &call, const void *buffer,
                         Arrival arrival) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t index = logs_[rank].size();
  logs_[rank].push_back({call, buffer});
  Operation &op = operations_[index];
  op.arrivals.resize(size_);
  arrival.call = call;
  arrival.seen_at = Clock::now() + delays_[rank];
  op.arrivals[rank] = std::move(arrival);
  return index;
}

void FakeWorld::compute(Operation &op) const {
  const Call &call = op.arrivals[0]->call;
  std::vector<const std::vector<char> *> shares;
  for (const std::optional<Arrival> &a : op.arrivals)
    shares.push_back(&a->share);
  const size_t bytes = call.count * nncomm::dtype_size(call.dtype);
  op.results.assign(size_, {});
  switch (call.kind) {
  case OpKind::kAllreduce:
    op.results.assign(size_, sum_of(shares, 0, bytes, call));
    break;
  case OpKind::kReduce:
    op.results[call.root] = sum_of(shares, 0, bytes, call);
    break;
  case OpKind::kBcast:
    for (int r = 0; r < size_; ++r) {
      if (r != call.root)
        op.results[r] = *shares[call.root];
    }
    break;
  case OpKind::kAllgather: {
    std::vector<char> gathered;
    for (const std::vector<char> *share : shares)
      gathered.insert(gathered.end(), share->begin(), share->end());
    op.results.assign(size_, gathered);
    break;
  }
  case OpKind::kReduceScatter:
    for (int r = 0; r < size_; ++r)
      op.results[r] = sum_of(shares, r, bytes, call);
    break;
  case OpKind::kAlltoallv:
  case OpKind::kAllgatherv:
    exchange_blocks(op, nncomm::dtype_size(call.dtype),
                    call.kind == OpKind::kAlltoallv);
    break;
  case OpKind::kBarrier:
    break;
  case OpKind::kAgree:
  case OpKind::kCheck: {
    bool same = true;
    for (const std::vector<char> *share : shares)
      same = same && *share == *shares[0];
    op.results.assign(size_, std::vector<char>{same});
    break;
  }
  case OpKind::kUnite: {
    std::vector<char> united(bytes, 0);
    for (const std::vector<char> *share : shares) {
      for (size_t b = 0; b < bytes; ++b)
        united[b] |= (*share)[b];
    }
    op.results.assign(size_, united);
    break;
  }
  }
  for (std::optional<Arrival> &a : op.arrivals)
    a->share = {}; // not needed any more
  op.computed = true;
}

void FakeWorld::exchange_blocks(Operation &op, size_t elem,
                                bool own_blocks) const {
  for (int to = 0; to < size_; ++to) {
    const Arrival &receiver = *op.arrivals[to];
    for (int from = 0; from < size_; ++from) {
      const Arrival &sender = *op.arrivals[from];
      const size_t count = sender.sends[to];
      if (count != receiver.expects[from]) {
        op.error = "world rank " + std::to_string(world_ranks_[from]) +
                   " sends " + std::to_string(count) +
                   " elements to world rank " +
                   std::to_string(world_ranks_[to]) + ", which expects " +
                   std::to_string(receiver.expects[from]);
        return;
      }
      size_t at = 0;
      for (int r = 0; own_blocks && r < to; ++r)
        at += sender.sends[r];
      const auto block = sender.share.begin() + at * elem;
      op.results[to].insert(op.results[to].end(), block,
                            block + count * elem);
    }
  }
}

std::string FakeWorld::describe(size_t index) const {
  return "operation " + std::to_string(index) +
         " on the group of world ranks " + rank_list(world_ranks_);
}

Status FakeTransport::start(const Call &call, const void *buffer,
                            FakeWorld::Arrival arrival, void *out,
                            int divisor, std::optional<nncomm::Blocks> blocks,
                            WorkPtr *work) {
  // As MpiTransport: nothing starts after a failed wait.
  NNCOMM_RETURN_IF_ERROR(nncomm::refuse_if_broken());
  const size_t index = world_.arrive(rank_, call, buffer, std::move(arrival));
  work->reset(
      new FakeWork(world_, rank_, index, out, divisor, std::move(blocks)));
  return Status::Ok();
}

Status FakeTransport::start(const Call &call, const void *buffer,
                            std::vector<char> share, void *out, int divisor,
                            WorkPtr *work) {
  FakeWorld::Arrival arrival;
  arrival.share = std::move(share);
  return start(call, buffer, std::move(arrival), out, divisor, std::nullopt,
               work);
}

Status FakeTransport::start_allreduce(void *buf, size_t count, DType dt,
                                      float scale, int divisor,
                                      WorkPtr *work) {
  std::vector<char> share(count * nncomm::dtype_size(dt));
  nncomm::convert_scaled(share.data(), dt, buf, dt, count, scale, 1);
  return start({OpKind::kAllreduce, count, dt}, buf, std::move(share), buf,
               divisor, work);
}

Status FakeTransport::start_reduce(void *buf, size_t count, DType dt,
                                   int root, int divisor, WorkPtr *work) {
  return start({OpKind::kReduce, count, dt, root}, buf,
               copy_of(buf, count * nncomm::dtype_size(dt)), buf,
               rank_ == root ? divisor : 1, work);
}

Status FakeTransport::start_bcast(void *buf, size_t count, DType dt, int root,
                                  WorkPtr *work) {
  return start({OpKind::kBcast, count, dt, root}, buf,
               copy_of(buf, count * nncomm::dtype_size(dt)), buf, 1, work);
}

Status FakeTransport::start_allgather(const void *send, void *recv,
                                      size_t count, DType dt, WorkPtr *work) {
  return start({OpKind::kAllgather, count, dt}, send,
               copy_of(send, count * nncomm::dtype_size(dt)), recv, 1, work);
}

Status FakeTransport::start_reduce_scatter(const void *send, void *recv,
                                           size_t count, DType dt, int divisor,
                                           WorkPtr *work) {
  return start({OpKind::kReduceScatter, count, dt}, send,
               copy_of(send, size() * count * nncomm::dtype_size(dt)), recv,
               divisor, work);
}

Status FakeTransport::start_alltoallv(const void *send,
                                      const nncomm::Blocks &send_blocks,
                                      void *recv,
                                      const nncomm::Blocks &recv_blocks,
                                      DType dt, WorkPtr *work) {
  const size_t elem = nncomm::dtype_size(dt);
  FakeWorld::Arrival arrival;
  for (int r = 0; r < size(); ++r) {
    const char *block =
        static_cast<const char *>(send) + send_blocks.offsets[r] * elem;
    arrival.share.insert(arrival.share.end(), block,
                         block + send_blocks.counts[r] * elem);
  }
  arrival.sends = send_blocks.counts;
  arrival.expects = recv_blocks.counts;
  return start({OpKind::kAlltoallv, 0, dt}, send, std::move(arrival), recv, 1,
               recv_blocks, work);
}

Status FakeTransport::start_allgatherv(const void *send, size_t count,
                                       void *recv,
                                       const nncomm::Blocks &blocks, DType dt,
                                       WorkPtr *work) {
  FakeWorld::Arrival arrival;
  arrival.share = copy_of(send, count * nncomm::dtype_size(dt));
  arrival.sends.assign(size(), count);
  arrival.expects = blocks.counts;
  const size_t total =
      std::accumulate(blocks.counts.begin(), blocks.counts.end(), size_t(0));
  return start({OpKind::kAllgatherv, total, dt}, send, std::move(arrival),
               recv, 1, blocks, work);
}

Status FakeTransport::start_barrier(WorkPtr *work) {
  return start({OpKind::kBarrier}, nullptr, {}, nullptr, 1, work);
}

Status FakeTransport::compare(OpKind kind, uint64_t value, bool *same) {
  char result = 0;
  WorkPtr work;
  NNCOMM_RETURN_IF_ERROR(start({kind}, nullptr,
                               copy_of(&value, sizeof value), &result, 1,
                               &work));
  NNCOMM_RETURN_IF_ERROR(nncomm::wait_for(*work, rank_ == 0, nullptr));
  *same = result != 0;
  return Status::Ok();
}

Status FakeTransport::agree(uint64_t value, bool *same) {
  return compare(OpKind::kAgree, value, same);
}

Status FakeTransport::unite(uint64_t *words, size_t count) {
  WorkPtr work;
  NNCOMM_RETURN_IF_ERROR(start({OpKind::kUnite, count}, nullptr,
                               copy_of(words, count * sizeof *words), words,
                               1, &work));
  return nncomm::wait_for(*work, rank_ == 0, nullptr);
}

Status FakeTransport::check_call(uint64_t signature, bool always) {
  unchecked_ = nncomm::Fingerprint().add(unchecked_).add(signature).value();
  if (!always && checked_.count(signature) != 0)
    return Status::Ok();
  bool same = false;
  NNCOMM_RETURN_IF_ERROR(compare(OpKind::kCheck, unchecked_, &same));
  unchecked_ = 0;
  if (!same) {
    return Status::InvalidArgument(
        "the ranks of this group make different calls (" +
        nncomm::OperationLabel::current() +
        " here, or since the last call compared)");
  }
  checked_.insert(signature);
  return Status::Ok();
}

void run_ranks(int size, const std::function<void(int rank)> &body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back(body, r);
  for (std::thread &t : threads)
    t.join();
}

} // namespace unit
