#include "nncomm/group.hpp"

#include <algorithm>

namespace nncomm {

// Takes the group's turn for the rest of the scope, or returns.
#define NNCOMM_IN_TURN()                                                       \
  CollectiveQueue::Turn _nncomm_turn(queue_);                                  \
  NNCOMM_RETURN_IF_ERROR(_nncomm_turn.status())

Status Group::Create(MPI_Comm comm, std::unique_ptr<Group> *out) {
  std::unique_ptr<MpiTransport> transport;
  NNCOMM_RETURN_IF_ERROR(MpiTransport::Create(comm, &transport));
  out->reset(new Group(std::move(transport), "world"));
  return Status::Ok();
}

Status Group::create_subgroup(const std::vector<int> &ranks,
                              const std::string &name,
                              std::unique_ptr<Group> *out) {
  NNCOMM_IN_TURN();
  // MPI_Comm_create_group has no nonblocking form: meeting every rank
  // first (a bounded wait) means no member can block in it for a rank
  // that never comes.
  NNCOMM_RETURN_IF_ERROR(transport_->barrier());
  if (std::find(ranks.begin(), ranks.end(), rank()) == ranks.end())
    return Status::Ok();
  std::unique_ptr<MpiTransport> transport;
  NNCOMM_RETURN_IF_ERROR(
      MpiTransport::CreateGroup(*transport_, ranks, &transport));
  out->reset(new Group(std::move(transport), name));
  return Status::Ok();
}

Status Group::duplicate_transport(std::unique_ptr<MpiTransport> *out) {
  NNCOMM_IN_TURN();
  return transport_->Duplicate(out);
}

Status Group::create_engine(size_t num_tensors, std::vector<Bucket> plan,
                            int poll_us, std::unique_ptr<Engine> *out) {
  std::unique_ptr<MpiTransport> own;
  NNCOMM_RETURN_IF_ERROR(duplicate_transport(&own));
  std::unique_ptr<BucketRunner> runner(
      new BucketRunner(*own, std::unique_ptr<ArrayMemory>(new HostArrays)));
  out->reset(new Engine(std::move(own), std::move(runner), num_tensors,
                        std::move(plan), poll_us));
  return Status::Ok();
}

Status Group::barrier() {
  NNCOMM_IN_TURN();
  return transport_->barrier();
}

Status Group::agree(uint64_t value, bool *same) {
  NNCOMM_IN_TURN();
  return transport_->agree(value, same);
}

Status Group::allgather(const void *send, void *recv, size_t count,
                        DType dt) {
  NNCOMM_IN_TURN();
  return transport_->allgather(send, recv, count, dt);
}

Status Group::all_reduce(std::vector<ArrayRef> &arrays, bool division,
                         float scale, bool fuse, Materializer materialize) {
  NNCOMM_IN_TURN();
  CollectiveSpan traced("all_reduce", name_, arrays);
  return all_reduce_list(*transport_, memory_, arrays, division, scale, fuse,
                         materialize);
}

Status Group::reduce(const std::vector<ArrayRef> &arrays, int root,
                     bool division, bool fuse) {
  NNCOMM_IN_TURN();
  CollectiveSpan traced("reduce", name_, arrays);
  return reduce_list(*transport_, memory_, arrays, root, division, fuse);
}

Status Group::bcast(const std::vector<ArrayRef> &arrays, int root, bool fuse) {
  NNCOMM_IN_TURN();
  CollectiveSpan traced("bcast", name_, arrays);
  return bcast_list(*transport_, memory_, arrays, root, fuse);
}

Status Group::all_gather(const ArrayRef &send,
                         const std::vector<ArrayRef> &recv) {
  NNCOMM_IN_TURN();
  CollectiveSpan traced("all_gather", name_, send);
  return nncomm::all_gather(*transport_, memory_, send, recv);
}

Status Group::all_gatherv(const ArrayRef &send,
                          const std::vector<size_t> &counts,
                          const std::vector<ArrayRef> &recv) {
  NNCOMM_IN_TURN();
  CollectiveSpan traced("all_gather", name_, send);
  return nncomm::all_gatherv(*transport_, memory_, send, counts, recv);
}

Status Group::alltoall(const ArrayRef &send,
                       const std::vector<size_t> &send_counts,
                       const ArrayRef &recv,
                       const std::vector<size_t> &recv_counts) {
  NNCOMM_IN_TURN();
  CollectiveSpan traced("alltoall", name_, send);
  return nncomm::alltoall(*transport_, send, send_counts, recv, recv_counts);
}

Status Group::reduce_scatter(const std::vector<ArrayRef> &send,
                             const ArrayRef &recv, bool division) {
  NNCOMM_IN_TURN();
  CollectiveSpan traced("reduce_scatter", name_, send);
  return nncomm::reduce_scatter(*transport_, memory_, send, recv, division);
}

} // namespace nncomm
