#include "nncomm/stall_inspector.hpp"

namespace nncomm {

namespace {
// Far above any tag a user could reach through nncomm's communicators,
// which carry no user point-to-point traffic anyway.
constexpr int kArrivalTag = 0x6e63;
} // namespace

StallInspector::~StallInspector() {
  int finalized = 1;
  MPI_Finalized(&finalized);
  for (Send *s : sends_) {
    if (!finalized) {
      // A report to a rank that never looked for it.
      MPI_Cancel(&s->request);
      MPI_Request_free(&s->request);
    }
    delete s;
  }
}

void StallInspector::arrived(uint64_t seq) {
  if (reported_ == seq)
    return;
  reported_ = seq;
  // Reports already delivered free their buffers.
  for (auto it = sends_.begin(); it != sends_.end();) {
    int done = 0;
    if (MPI_Test(&(*it)->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS ||
        done) {
      delete *it;
      it = sends_.erase(it);
    } else {
      ++it;
    }
  }
  for (int r = 0; r < static_cast<int>(world_ranks_.size()); ++r) {
    if (r == rank_)
      continue;
    Send *s = new Send{MPI_REQUEST_NULL, seq};
    // A failed send (a dead rank) only means that rank hears nothing.
    if (MPI_Isend(&s->seq, 1, MPI_UINT64_T, r, kArrivalTag, comm_,
                  &s->request) == MPI_SUCCESS) {
      sends_.push_back(s);
    } else {
      delete s;
    }
  }
}

void StallInspector::collect(uint64_t seq) {
  for (;;) {
    int pending = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kArrivalTag, comm_, &pending, &status) !=
            MPI_SUCCESS ||
        !pending)
      break;
    uint64_t at = 0;
    if (MPI_Recv(&at, 1, MPI_UINT64_T, status.MPI_SOURCE, kArrivalTag, comm_,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS)
      break;
    // A rank may already be at a later operation than this one.
    if (at >= seq) {
      auto &ranks = arrived_[at];
      ranks.resize(world_ranks_.size());
      ranks[status.MPI_SOURCE] = true;
    }
  }
  arrived_.erase(arrived_.begin(), arrived_.lower_bound(seq));
}

std::vector<int> StallInspector::missing(uint64_t seq) {
  collect(seq);
  const auto found = arrived_.find(seq);
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(world_ranks_.size()); ++r) {
    const bool here = r == rank_ ||
                      (found != arrived_.end() && found->second[r]);
    if (!here)
      out.push_back(world_ranks_[r]);
  }
  return out;
}

} // namespace nncomm
