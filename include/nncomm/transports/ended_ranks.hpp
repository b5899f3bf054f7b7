// Ranks whose script has ended. A rank that exits while the others still
// wait for it in an operation leaves them waiting until NNCOMM_TIMEOUT (it
// sits in MPI_Finalize, alive to mpiexec): the usual cause is a rank with
// fewer batches than the others, or one that called sys.exit(). So as it
// leaves, each rank tells every other one how many operations it began on
// each of its communicators (MPI's and NCCL's: count_operations()), on a
// duplicate of the world communicator. A wait that has lasted a second
// looks for these notices (Work::inspect) and fails when a rank it still
// misses ended before this operation; one that made it and ended (a
// broadcast's root whose part was done) is no cause: the wait goes on for
// the others. Healthy training sends nothing until exit; each rank then
// sends n - 1 small messages, which no rank may receive.
#pragma once

#include <cstdint>
#include <vector>

#include "nncomm/core/status.hpp"

namespace nncomm {

// Opens the notices' communicator, once per process, and has
// MPI_Finalize call leave_job() (through an attribute of MPI_COMM_SELF),
// for scripts that finalize MPI themselves. Collective over the world.
Status listen_for_ended_ranks();
// This process is done: aborts the job if a wait failed
// (broken_process.hpp), else sends its notice to every other world rank.
// Once, at interpreter exit or in MPI_Finalize, whichever comes first.
void leave_job();
// The notices report `*begun`, the operations begun on the communicator of
// id `id` (the same on every rank: named by how it was made), until
// stop_counting(id), which keeps its last value: a rank may end after
// dropping a communicator that the others still use.
void count_operations(uint64_t id, const uint64_t *begun);
void stop_counting(uint64_t id);
// Of `world_ranks`, those known to have ended having begun fewer than
// `seq` operations on transport `transport`. Safe from any thread.
std::vector<int> ended_before(const std::vector<int> &world_ranks,
                              uint64_t transport, uint64_t seq);

} // namespace nncomm
