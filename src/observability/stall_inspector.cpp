#include "nncomm/observability/stall_inspector.hpp"

#include <algorithm>

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
  // Where this rank is, then where it was before.
  uint64_t message[1 + 3 * kHistory] = {transport_, at.seq, at.fingerprint,
                                        at.phase};
  int words = 4;
  for (uint64_t back = 1; back < kHistory && back < at.seq; ++back) {
    const Position *was = mine(at.seq - back, at);
    if (was == nullptr)
      break;
    message[words++] = was->seq;
    message[words++] = was->fingerprint;
    message[words++] = was->phase;
  }
  for (int r = 0; r < static_cast<int>(world_ranks_.size()); ++r) {
    if (r == rank_)
      continue;
    Send *s = new Send{MPI_REQUEST_NULL, {}};
    std::copy(message, message + words, s->message);
    // A failed send (a dead rank) only means that rank hears nothing.
    if (MPI_Isend(s->message, words, MPI_UINT64_T, r, kArrivalTag, comm_,
                  &s->request) == MPI_SUCCESS) {
      sends_.push_back(s);
    } else {
      delete s;
    }
  }
}

const StallInspector::Position *
StallInspector::mine(uint64_t seq, const Position &at) const {
  if (seq == at.seq)
    return &at;
  const Position &was = history_[seq % kHistory];
  return seq < at.seq && was.seq == seq ? &was : nullptr;
}

void StallInspector::collect(uint64_t seq) {
  // Reports of operations this rank went through are kept while it still
  // knows what it did there.
  const uint64_t oldest = seq >= kHistory ? seq - kHistory + 1 : 0;
  for (;;) {
    int pending = 0, words = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kArrivalTag, comm_, &pending, &status) !=
            MPI_SUCCESS ||
        !pending ||
        MPI_Get_count(&status, MPI_UINT64_T, &words) != MPI_SUCCESS)
      break;
    uint64_t message[1 + 3 * kHistory] = {};
    if (words < 1 || words > 1 + 3 * kHistory ||
        MPI_Recv(message, words, MPI_UINT64_T, status.MPI_SOURCE,
                 kArrivalTag, comm_, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      break;
    if (message[0] != transport_)
      continue; // another communicator's, left unread
    for (int w = 1; w + 2 < words; w += 3) {
      if (message[w] < oldest)
        continue;
      auto &reports = arrived_[message[w]];
      reports.resize(world_ranks_.size());
      reports[status.MPI_SOURCE] = {
          true, {message[w], message[w + 1], message[w + 2]}};
    }
  }
  arrived_.erase(arrived_.begin(), arrived_.lower_bound(oldest));
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
  std::vector<bool> differs(world_ranks_.size(), false);
  for (const auto &reported : arrived_) {
    const Position *here = mine(reported.first, at);
    if (here == nullptr)
      continue;
    for (int r = 0; r < static_cast<int>(world_ranks_.size()); ++r) {
      const Report &report = reported.second[r];
      if (r == rank_ || !report.arrived)
        continue;
      const bool both_checking = report.at.phase == 1 && here->phase == 1;
      if (!both_checking && (report.at.fingerprint != here->fingerprint ||
                             report.at.phase != here->phase))
        differs[r] = true;
    }
  }
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(world_ranks_.size()); ++r) {
    if (differs[r])
      out.push_back(world_ranks_[r]);
  }
  return out;
}

} // namespace nncomm
