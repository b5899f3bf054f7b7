#include "nncomm/transport.hpp"

#include <algorithm>

#include "nncomm/wait.hpp"

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
  OperationLabel label("barrier");
  WorkPtr work;
  return complete(*this, start_barrier(&work), work);
}

} // namespace nncomm
