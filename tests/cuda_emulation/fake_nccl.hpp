// A fake NCCL for the programs that test the NCCL transport on the fake
// CUDA runtime: its collectives are enqueued on the fake streams and, when
// their turn comes, run as MPI collectives over the processes' host memory
// (the fake device memory), one communicator each; the reductions as
// nonblocking ones that the stream then waits for, so that a rank that
// never comes leaves them pending, as on a GPU, while the host polls.
// Also built as a shared library exporting NCCL's names, for nncomm's
// loader.
//
// NNCOMM_FAKE_NCCL_FAIL=ncclGetUniqueId or ncclCommInitRank, set in one
// process's environment, makes that call fail there with "unhandled system
// error (injected)"; ncclCommInitRank fails once every rank has joined it,
// so that the other ranks' succeed.
#pragma once

#include "nncomm/transports/nccl_api.hpp"

// The table NcclTransport calls.
const nncomm::NcclApi &fake_nccl();
