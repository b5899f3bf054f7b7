// The Status of an MPI call that failed, for the files that make MPI calls
// under MPI_ERRORS_RETURN.
#pragma once

#include <string>

#include <mpi.h>

#include "nncomm/core/status.hpp"

namespace nncomm {

// `call` failed with `mpi_error`: the message carries MPI's own words.
inline Status mpi_failure(int mpi_error, const std::string &call) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(mpi_error, text, &length) != MPI_SUCCESS)
    length = 0;
  return Status::Transport(call + " failed: " + std::string(text, length));
}

} // namespace nncomm
