#include "nncomm/observability/stall_inspector.hpp"

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

void StallInspector::arrived(const Position &at) {
  if (reported_ == at.seq && reported_phase_ == at.phase)
    return;
  reported_ = at.seq;
  reported_phase_ = at.phase;
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
    Send *s = new Send{MPI_REQUEST_NULL, {at.seq, at.fingerprint, at.phase}};
    // A failed send (a dead rank) only means that rank hears nothing.
    if (MPI_Isend(s->message, 3, MPI_UINT64_T, r, kArrivalTag, comm_,
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
    uint64_t message[3] = {0, 0, 0};
    if (MPI_Recv(message, 3, MPI_UINT64_T, status.MPI_SOURCE, kArrivalTag,
                 comm_, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      break;
    // A rank may already be at a later operation than this one.
    if (message[0] >= seq) {
      auto &reports = arrived_[message[0]];
      reports.resize(world_ranks_.size());
      reports[status.MPI_SOURCE] = {true,
                                    {message[0], message[1], message[2]}};
    }
  }
  arrived_.erase(arrived_.begin(), arrived_.lower_bound(seq));
}

std::vector<int> StallInspector::missing(const Position &at) {
  collect(at.seq);
  const auto found = arrived_.find(at.seq);
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(world_ranks_.size()); ++r) {
    const bool here =
        r == rank_ || (found != arrived_.end() && found->second[r].arrived);
    if (!here)
      out.push_back(world_ranks_[r]);
  }
  return out;
}

std::vector<int> StallInspector::differing(const Position &at) {
  collect(at.seq);
  std::vector<int> out;
  const auto found = arrived_.find(at.seq);
  if (found == arrived_.end())
    return out;
  for (int r = 0; r < static_cast<int>(world_ranks_.size()); ++r) {
    const Report &report = found->second[r];
    if (r == rank_ || !report.arrived)
      continue;
    const bool both_checking = report.at.phase == 1 && at.phase == 1;
    if (!both_checking && (report.at.fingerprint != at.fingerprint ||
                           report.at.phase != at.phase))
      out.push_back(world_ranks_[r]);
  }
  return out;
}

} // namespace nncomm
