#include "nncomm/transports/transport.hpp"

#include <algorithm>
#include <cstring>

#include "nncomm/core/wait.hpp"

namespace nncomm {

Blocks Blocks::packed(std::vector<size_t> counts) {
  Blocks blocks;
  size_t offset = 0;
  for (size_t count : counts) {
    blocks.offsets.push_back(offset);
    offset += count;
  }
  blocks.counts = std::move(counts);
  return blocks;
}

size_t Blocks::extent() const {
  size_t end = 0;
  for (size_t r = 0; r < counts.size(); ++r)
    end = std::max(end, offsets[r] + counts[r]);
  return end;
}

namespace {
// Waits for the operation `started` opened, as `polling` says.
Status complete(const Transport &transport, Status started, WorkPtr &work,
                const Polling *polling = nullptr) {
  NNCOMM_RETURN_IF_ERROR(started);
  return wait_for(*work, transport.rank() == 0, polling);
}
} // namespace

Status Transport::allreduce(void *buf, size_t count, DType dt, float scale,
                            int divisor, const Polling *polling) {
  WorkPtr work;
  return complete(*this,
                  start_allreduce(buf, count, dt, scale, divisor, &work), work,
                  polling);
}

Status Transport::reduce(void *buf, size_t count, DType dt, int root,
                         int divisor) {
  WorkPtr work;
  return complete(*this, start_reduce(buf, count, dt, root, divisor, &work),
                  work);
}

Status Transport::bcast(void *buf, size_t count, DType dt, int root) {
  WorkPtr work;
  return complete(*this, start_bcast(buf, count, dt, root, &work), work);
}

Status Transport::allgather(const void *send, void *recv, size_t count,
                            DType dt) {
  WorkPtr work;
  return complete(*this, start_allgather(send, recv, count, dt, &work), work);
}

Status Transport::reduce_scatter(const void *send, void *recv, size_t count,
                                 DType dt, int divisor) {
  WorkPtr work;
  return complete(
      *this, start_reduce_scatter(send, recv, count, dt, divisor, &work),
      work);
}

Status Transport::alltoallv(const void *send, const Blocks &send_blocks,
                            void *recv, const Blocks &recv_blocks, DType dt) {
  WorkPtr work;
  return complete(*this,
                  start_alltoallv(send, send_blocks, recv, recv_blocks, dt,
                                  &work),
                  work);
}

Status Transport::allgatherv(const void *send, size_t count, void *recv,
                             const Blocks &blocks, DType dt) {
  WorkPtr work;
  return complete(
      *this, start_allgatherv(send, count, recv, blocks, dt, &work), work);
}

Status Transport::barrier() {
  // A barrier that another operation makes (new_group, comm.join()) goes
  // by that operation's name in messages.
  const OperationLabel *outer = OperationLabel::innermost();
  OperationLabel label(outer ? outer->format() : "barrier",
                       outer ? outer->a() : 0, outer ? outer->b() : 0);
  WorkPtr work;
  return complete(*this, start_barrier(&work), work);
}

Status fail_together(Transport &t, const Status &mine,
                     const std::string &step) {
  // Each rank's code and the start of its message, in the whole words the
  // host transport moves; a cut message still names the failing call.
  struct Outcome {
    int64_t code;
    char message[248];
  };
  static_assert(sizeof(Outcome) % sizeof(int64_t) == 0, "whole words");
  Outcome own;
  std::memset(&own, 0, sizeof own);
  own.code = static_cast<int64_t>(mine.code());
  std::strncpy(own.message, mine.message().c_str(), sizeof own.message - 1);
  std::vector<Outcome> all(t.size());
  Status exchanged;
  {
    OperationLabel label("comparing the ranks' outcomes of a set-up step");
    exchanged = t.host().allgather(&own, all.data(),
                                   sizeof own / sizeof(int64_t),
                                   DType::kInt64);
  }
  if (!mine.ok())
    return mine;
  NNCOMM_RETURN_IF_ERROR(exchanged);
  std::vector<int> failed;
  for (int r = 0; r < t.size(); ++r) {
    if (all[r].code != 0)
      failed.push_back(r);
  }
  if (failed.empty())
    return Status::Ok();
  const Outcome &first = all[failed[0]];
  std::string message =
      failed.size() == 1
          ? "group rank " + std::to_string(failed[0]) + " failed " + step +
                ": " + first.message
          : "group ranks " + rank_list(failed) + " failed " + step +
                "; rank " + std::to_string(failed[0]) + ": " + first.message;
  // Of the same kind everywhere (a MemoryError where the rank ran out),
  // but an interruption is the failing rank's own.
  StatusCode code = static_cast<StatusCode>(first.code);
  if (code == StatusCode::kInterrupted)
    code = StatusCode::kRuntimeError;
  switch (code) {
  case StatusCode::kInvalidArgument:
    return Status::InvalidArgument(std::move(message));
  case StatusCode::kTransport:
    return Status::Transport(std::move(message));
  case StatusCode::kOutOfMemory:
    return Status::OutOfMemory(std::move(message));
  case StatusCode::kCommunicator:
    return Status::Communicator(std::move(message));
  default:
    return Status::RuntimeError(std::move(message));
  }
}

} // namespace nncomm
