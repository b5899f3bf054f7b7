// DeviceArrays: the list collectives' memory on a CUDA device (see
// array_memory.hpp): fused messages in one device buffer, packed and
// unpacked by the CUDA packer (one launch per message; integer and float64
// messages, which its kernel does not move, by one copy per array), zeroed
// and copied, all in order on the device transport's stream; host values
// pass through a small pinned buffer.
#pragma once

#include <memory>

#include "nncomm/core/array_memory.hpp"
#include "nncomm/cuda/cuda_pack.hpp"
#include "nncomm/transports/device_transport.hpp"

namespace nncomm {

class DeviceArrays : public ArrayMemory {
public:
  // Memory on `transport`'s device, ordered on its stream; `transport`
  // must outlive it.
  static Status Create(DeviceTransport &transport,
                       std::unique_ptr<DeviceArrays> *out);
  ~DeviceArrays() override;
  DeviceArrays(const DeviceArrays &) = delete;
  DeviceArrays &operator=(const DeviceArrays &) = delete;

  Status reserve(size_t bytes, char **buffer) override;
  Status pack(const PackTable &table, void *message, DType wire,
              float scale) override;
  Status unpack(const PackTable &table, const void *message, DType wire,
                int divisor) override;
  Status zero(void *p, size_t bytes) override;
  Status copy(void *dst, const void *src, size_t bytes) override;
  Status put(void *dst, const void *host, size_t bytes) override;
  Status get(void *host, const void *src, size_t bytes) override;
  bool scales(DType wire) const override { return cuda_packs(wire); }

private:
  DeviceArrays(DeviceTransport &transport, std::unique_ptr<CudaPacker> packer)
      : transport_(transport), packer_(std::move(packer)) {}
  // A pinned host buffer of at least `bytes`, once the stream is done with
  // the one before.
  Status pinned(size_t bytes);
  Status copy_rows(const PackTable &table, char *message, DType wire,
                   bool packing, bool scaled);

  DeviceTransport &transport_;
  const std::unique_ptr<CudaPacker> packer_;
  char *messages_ = nullptr;
  size_t capacity_ = 0;
  char *pinned_ = nullptr;
  size_t pinned_capacity_ = 0;
};

} // namespace nncomm
