// A fake NCCL for the programs that test the NCCL transport on the fake
// CUDA runtime: its collectives are enqueued on the fake streams and, when
// their turn comes, run as MPI collectives over the processes' host memory
// (the fake device memory), one communicator each. Also built as a shared
// library exporting NCCL's names, for nncomm's loader.
#pragma once

#include "nncomm/nccl_api.hpp"

// The table NcclTransport calls.
const nncomm::NcclApi &fake_nccl();
