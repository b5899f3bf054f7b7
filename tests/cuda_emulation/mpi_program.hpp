// What the emulation programs that run under mpiexec share: this process's
// rank, the count of checks passed, and failing the whole job at the first
// wrong result (every rank exits, through MPI_Abort).
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "nncomm/core/status.hpp"

namespace program {

inline int rank = 0;
inline int ranks = 1;
inline size_t checks = 0;

// MPI with threads (the engine's) and this process's place in the job.
inline void start(int *argc, char ***argv) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
}

[[noreturn]] inline void fail(const std::string &what) {
  std::printf("rank %d: %s\n", rank, what.c_str());
  std::fflush(stdout);
  // Time for the launcher to forward the line before the abort tears the
  // job down.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

inline void ok(const nncomm::Status &s, const char *what) {
  if (!s.ok())
    fail(std::string(what) + ": " + s.message());
}

inline void cuda(cudaError_t err, const char *what) {
  if (err != cudaSuccess)
    fail(std::string(what) + ": " + cudaGetErrorString(err));
}

} // namespace program
