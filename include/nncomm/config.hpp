// Tunables of the core, with their defaults. Each can be overridden by the
// environment variable of the same name, read once per process.
#pragma once

#include <cstddef>
#include <optional>

#include "nncomm/launch_tuner.hpp"

namespace nncomm {
namespace config {

// Largest piece one MPI reduction is given. MPICH allocates a temporary of
// the message size for every reduction; above glibc's 32 MiB mmap threshold
// that temporary is mapped and unmapped on every call, so one 64 MiB
// all-reduce pays page faults on all of it. Pieces below the threshold reuse
// heap memory. NNCOMM_CHUNK_BYTES.
size_t chunk_bytes();

// Arrays at least this large are reduced where they lie instead of being
// copied into the fusion buffer: for them the two copies cost more than the
// extra MPI call saves. NNCOMM_DIRECT_BYTES.
size_t direct_bytes();

// Arrays at least this large are moved onto huge pages before their first
// direct reduction (see host_memory.hpp). NNCOMM_HUGE_PAGE_BYTES.
size_t huge_page_bytes();

// Before every collective, check that all ranks of the group make the same
// call (collective, root, options, array count, sizes and dtypes); a
// mismatch then raises ValueError on every rank instead of MPI failing or
// aborting. Costs one small all-reduce per call. NNCOMM_CHECK_CALLS=1.
bool check_calls();

// When the callback engine launches buckets: "eager" (as each is ready),
// "deferred" (all at the end of backward) or "auto" (the default: timed on
// the first iterations, see launch_tuner.hpp; empty). NNCOMM_LAUNCH.
std::optional<Launch> engine_launch();

// How often, in microseconds, the callback engine's thread tests a
// reduction in flight (0: it spins). NNCOMM_ENGINE_POLL_US.
int engine_poll_us();

} // namespace config
} // namespace nncomm
