// DeviceTransport: a Transport on CUDA device memory whose operations run
// in order on a stream of its own: an operation reads its inputs after the
// work enqueued on stream() before it started, and once its Work has
// completed its results are in place for the work enqueued on stream()
// after that (the device may still be writing them: a Work completes
// without the host waiting for the device where the host has no part left).
// follow() and lead() order the transport with a framework's streams.
#pragma once

#include "nncomm/cuda/cuda_pack.hpp"
#include "nncomm/transports/transport.hpp"

namespace nncomm {

class DeviceTransport : public Transport {
public:
  ~DeviceTransport() override;
  // The device the transport works on, and its stream.
  virtual int device() const = 0;
  virtual CudaStream stream() const = 0;
  // Operations started from now on read their inputs after the work
  // enqueued on `s` so far.
  Status follow(CudaStream s);
  // Work enqueued on `s` from now on sees the results of every operation
  // completed so far.
  Status lead(CudaStream s);

private:
  CudaEvent order_ = nullptr; // recorded and waited on at once, so reused
};

} // namespace nncomm
