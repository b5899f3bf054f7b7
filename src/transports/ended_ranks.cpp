#include "nncomm/transports/ended_ranks.hpp"

#include <chrono>
#include <map>
#include <mutex>

#include <mpi.h>

#include "nncomm/transports/mpi_failure.hpp"

namespace nncomm {

namespace {
using Clock = std::chrono::steady_clock;

constexpr int kEndedTag = 0x6e65;

// Engines' threads and the caller's may inspect waits at once.
std::mutex mutex;
MPI_Comm notices = MPI_COMM_NULL;
// World rank -> when this process learned that it ended.
std::map<int, Clock::time_point> ended;

// Takes the notices that have come (under `mutex`).
void collect() {
  for (;;) {
    int pending = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kEndedTag, notices, &pending, &status) !=
            MPI_SUCCESS ||
        !pending)
      return;
    if (MPI_Recv(nullptr, 0, MPI_BYTE, status.MPI_SOURCE, kEndedTag, notices,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return;
    ended.emplace(status.MPI_SOURCE, Clock::now());
  }
}
} // namespace

Status listen_for_ended_ranks() {
  std::lock_guard<std::mutex> lock(mutex);
  if (notices != MPI_COMM_NULL)
    return Status::Ok();
  int err = MPI_Comm_dup(MPI_COMM_WORLD, &notices);
  if (err != MPI_SUCCESS)
    return mpi_failure(err, "MPI_Comm_dup");
  err = MPI_Comm_set_errhandler(notices, MPI_ERRORS_RETURN);
  return err == MPI_SUCCESS ? Status::Ok()
                            : mpi_failure(err, "MPI_Comm_set_errhandler");
}

void announce_end() {
  std::lock_guard<std::mutex> lock(mutex);
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (notices == MPI_COMM_NULL || finalized)
    return;
  int rank = 0, size = 0;
  MPI_Comm_rank(notices, &rank);
  MPI_Comm_size(notices, &size);
  for (int r = 0; r < size; ++r) {
    MPI_Request request;
    // Freed at once: nobody may ever receive it (every rank exits), and a
    // failed send (a dead rank) only means that rank hears nothing.
    if (r != rank && MPI_Isend(nullptr, 0, MPI_BYTE, r, kEndedTag, notices,
                               &request) == MPI_SUCCESS)
      MPI_Request_free(&request);
  }
}

std::vector<int> ended_among(const std::vector<int> &world_ranks) {
  std::vector<int> out;
  std::lock_guard<std::mutex> lock(mutex);
  if (notices == MPI_COMM_NULL)
    return out;
  collect();
  const auto before = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(
                                             kEndedGraceSeconds));
  for (int r : world_ranks) {
    const auto found = ended.find(r);
    if (found != ended.end() && found->second <= before)
      out.push_back(r);
  }
  return out;
}

} // namespace nncomm
