#include "nncomm/transports/ended_ranks.hpp"

#include <map>
#include <mutex>
#include <unordered_map>

#include <mpi.h>

#include "nncomm/core/broken_process.hpp"
#include "nncomm/transports/mpi_failure.hpp"

namespace nncomm {

namespace {
constexpr int kEndedTag = 0x6e65;

// Engines' threads and the caller's may inspect waits at once.
std::mutex mutex;
MPI_Comm notices = MPI_COMM_NULL;
bool left = false;
// This rank's notice: {transport id, operations begun} pairs. Kept for the
// life of the process: MPI may read it until the send completes.
std::vector<uint64_t> notice;
// World rank that ended -> transport id -> the operations it began there.
std::map<int, std::unordered_map<uint64_t, uint64_t>> ended;
// This rank's communicators, by id: those alive, and the last count of
// those dropped.
std::unordered_map<uint64_t, const uint64_t *> counted;
std::unordered_map<uint64_t, uint64_t> dropped;

// {id, operations begun} pairs of every communicator this rank made.
std::vector<uint64_t> operations_begun() {
  std::vector<uint64_t> out;
  for (const auto &e : dropped) {
    if (counted.count(e.first) == 0)
      out.insert(out.end(), {e.first, e.second});
  }
  for (const auto &e : counted)
    out.insert(out.end(), {e.first, *e.second});
  return out;
}

// Takes the notices that have come (under `mutex`).
void collect() {
  for (;;) {
    int pending = 0, words = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kEndedTag, notices, &pending, &status) !=
            MPI_SUCCESS ||
        !pending || MPI_Get_count(&status, MPI_UINT64_T, &words) !=
                        MPI_SUCCESS)
      return;
    std::vector<uint64_t> message(words);
    if (MPI_Recv(message.data(), words, MPI_UINT64_T, status.MPI_SOURCE,
                 kEndedTag, notices, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return;
    auto &begun = ended[status.MPI_SOURCE];
    for (int i = 0; i + 1 < words; i += 2)
      begun[message[i]] = message[i + 1];
  }
}

// Under `mutex`, MPI not finalized.
void leave() {
  abort_if_broken();
  if (left || notices == MPI_COMM_NULL)
    return;
  left = true;
  notice = operations_begun();
  int rank = 0, size = 0;
  MPI_Comm_rank(notices, &rank);
  MPI_Comm_size(notices, &size);
  for (int r = 0; r < size; ++r) {
    MPI_Request request;
    // Freed at once: a rank may never look for it. A failed send (a dead
    // rank) only means that rank hears nothing.
    if (r != rank &&
        MPI_Isend(notice.data(), static_cast<int>(notice.size()),
                  MPI_UINT64_T, r, kEndedTag, notices,
                  &request) == MPI_SUCCESS)
      MPI_Request_free(&request);
  }
  // What has come is taken rather than left pending at MPI_Finalize.
  collect();
}

// MPI_Finalize deletes MPI_COMM_SELF's attributes first, while MPI still
// works.
int on_finalize(MPI_Comm, int, void *, void *) {
  std::lock_guard<std::mutex> lock(mutex);
  leave();
  return MPI_SUCCESS;
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
  if (err != MPI_SUCCESS)
    return mpi_failure(err, "MPI_Comm_set_errhandler");
  int keyval = MPI_KEYVAL_INVALID;
  err = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_finalize, &keyval,
                               nullptr);
  if (err == MPI_SUCCESS)
    err = MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
  return err == MPI_SUCCESS ? Status::Ok()
                            : mpi_failure(err, "MPI_Comm_set_attr");
}

void leave_job() {
  std::lock_guard<std::mutex> lock(mutex);
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (!finalized)
    leave();
}

void count_operations(uint64_t id, const uint64_t *begun) {
  std::lock_guard<std::mutex> lock(mutex);
  counted[id] = begun;
}

void stop_counting(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = counted.find(id);
  if (it == counted.end())
    return;
  dropped[id] = *it->second;
  counted.erase(it);
}

std::vector<int> ended_before(const std::vector<int> &world_ranks,
                              uint64_t transport, uint64_t seq) {
  std::vector<int> out;
  std::lock_guard<std::mutex> lock(mutex);
  if (notices == MPI_COMM_NULL)
    return out;
  collect();
  for (int r : world_ranks) {
    const auto found = ended.find(r);
    if (found == ended.end())
      continue;
    const auto begun = found->second.find(transport);
    if (begun == found->second.end() || begun->second < seq)
      out.push_back(r);
  }
  return out;
}

} // namespace nncomm
