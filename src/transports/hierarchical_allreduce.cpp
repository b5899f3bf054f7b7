#include "nncomm/transports/hierarchical_allreduce.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>

#include "nncomm/host/elementwise.hpp"
#include "nncomm/observability/config.hpp"
#include "nncomm/transports/host_layout.hpp"
#include "nncomm/transports/mpi_failure.hpp"

namespace nncomm {

namespace {

enum Step { kReduceScatter = 0, kCrossAllreduce = 1, kAllgather = 2 };

} // namespace

Status HierarchicalAllreduce::Create(
    MPI_Comm comm, int rank, MPI_Comm node,
    std::unique_ptr<HierarchicalAllreduce> *out) {
  // A host is named by its lowest rank; every rank learns every rank's,
  // and its setting.
  int mine[2] = {rank, static_cast<int>(config::hierarchical())};
  int local_rank = 0;
  int local_size = 0;
  int size = 0;
  int err = MPI_Allreduce(MPI_IN_PLACE, &mine[0], 1, MPI_INT, MPI_MIN, node);
  if (err == MPI_SUCCESS)
    err = MPI_Comm_rank(node, &local_rank);
  if (err == MPI_SUCCESS)
    err = MPI_Comm_size(node, &local_size);
  if (err == MPI_SUCCESS)
    err = MPI_Comm_size(comm, &size);
  std::vector<int> everyone(2 * size);
  if (err == MPI_SUCCESS) {
    err = MPI_Allgather(mine, 2, MPI_INT, everyone.data(), 2, MPI_INT, comm);
  }
  if (err != MPI_SUCCESS) {
    MPI_Comm_free(&node);
    return mpi_failure(err, "finding the hosts of the ranks");
  }
  std::vector<int> host_of(size);
  bool agreed = true;
  for (int r = 0; r < size; ++r) {
    host_of[r] = everyone[2 * r];
    agreed = agreed && everyone[2 * r + 1] == mine[1];
  }
  // Ranks whose settings differ run flat alike (and fail init() right
  // after, naming the variable: job.pxi), so that no rank makes a call
  // the others do not.
  std::string why_flat;
  const bool on = HostLayout::of(host_of).two_level(
      agreed ? config::hierarchical() : config::Hierarchical::kOff,
      &why_flat);
  // Once per process, by a group's first rank: a group of uneven hosts
  // (a model's own sub-groups, say) is no reason to stop a job whose
  // results are the same either way.
  static std::atomic<bool> noted{false};
  if (!why_flat.empty() && rank == 0 && !noted.exchange(true))
    std::fprintf(stderr, "nncomm: %s\n", why_flat.c_str());
  if (!on) {
    MPI_Comm_free(&node);
    return Status::Ok();
  }
  MPI_Comm cross = MPI_COMM_NULL;
  err = MPI_Comm_split(comm, local_rank, rank, &cross);
  if (err == MPI_SUCCESS)
    err = MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
  if (err == MPI_SUCCESS)
    err = MPI_Comm_set_errhandler(cross, MPI_ERRORS_RETURN);
  out->reset(new HierarchicalAllreduce(node, cross, local_rank, local_size));
  if (err != MPI_SUCCESS) {
    out->reset();
    return mpi_failure(err, "the two-level all-reduce's MPI_Comm_split");
  }
  return Status::Ok();
}

HierarchicalAllreduce::~HierarchicalAllreduce() {
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (finalized)
    return;
  if (node_ != MPI_COMM_NULL)
    MPI_Comm_free(&node_);
  if (cross_ != MPI_COMM_NULL)
    MPI_Comm_free(&cross_);
}

size_t HierarchicalAllreduce::steps(const Reduction &r) {
  return 3 * std::max<size_t>(1, (r.count + r.step - 1) / r.step);
}

int HierarchicalAllreduce::start(const Reduction &r, size_t i,
                                 MPI_Request *request) {
  const size_t size = dtype_size(r.dt);
  const size_t first = i / 3 * r.step;
  char *piece = r.base + first * size;
  const int mine = counts_.empty() ? 0 : counts_[local_rank_];
  switch (static_cast<Step>(i % 3)) {
  case kReduceScatter: {
    const size_t n = std::min(r.step, r.count - first);
    split_shards(n, local_size_, &counts_, &offsets_);
    const size_t longest = static_cast<size_t>(counts_[0]) * size;
    if (shard_.size() < longest)
      shard_.resize(longest);
    if (r.scale != 1.0f)
      convert_scaled(piece, r.dt, piece, r.dt, n, r.scale, 1);
    return MPI_Ireduce_scatter(piece, shard_.data(), counts_.data(), r.type,
                               r.op, node_, request);
  }
  case kCrossAllreduce:
    return MPI_Iallreduce(MPI_IN_PLACE, shard_.data(), mine, r.type, r.op,
                          cross_, request);
  case kAllgather:
    return MPI_Iallgatherv(shard_.data(), mine, r.type, piece,
                           counts_.data(), offsets_.data(), r.type, node_,
                           request);
  }
  return MPI_ERR_OTHER;
}

void HierarchicalAllreduce::finish(const Reduction &r, size_t i) {
  // Divided once, by the rank that owns the shard, before it is copied to
  // the host's other ranks: 1/(ranks per host) of the flat path's work.
  if (i % 3 == kCrossAllreduce && r.divisor != 1)
    convert_scaled(shard_.data(), r.dt, shard_.data(), r.dt,
                   counts_[local_rank_], 1.0f, r.divisor);
}

} // namespace nncomm
