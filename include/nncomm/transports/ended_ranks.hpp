// Ranks whose script has ended. A rank that exits while the others still
// wait for it in an operation leaves them waiting until NNCOMM_TIMEOUT (it
// sits in MPI_Finalize, alive to mpiexec): the usual cause is a rank with
// fewer batches than the others, or one that called sys.exit(). So at
// exit each rank tells every other one, in a message of no bytes on a
// duplicate of the world communicator; a wait that has lasted a second
// looks for these (Work::inspect), and one that waits for a rank that has
// ended fails, naming it. Healthy training sends nothing until exit.
#pragma once

#include <vector>

#include "nncomm/core/status.hpp"

namespace nncomm {

// Seconds between learning that a rank ended and failing a wait for it:
// whatever it sent before it ended has arrived by then.
constexpr double kEndedGraceSeconds = 1.0;

// Opens the notices' communicator, once per process. Collective over the
// world.
Status listen_for_ended_ranks();
// This process's script has ended: tells every other world rank. Called at
// interpreter exit, before MPI is finalized.
void announce_end();
// Of `world_ranks`, those known for kEndedGraceSeconds to have ended.
// Safe from any thread.
std::vector<int> ended_among(const std::vector<int> &world_ranks);

} // namespace nncomm
