// DeviceArrays: the list collectives' memory on a CUDA device (see
// array_memory.hpp): fused messages in one device buffer, packed and
// unpacked by the CUDA packer (one launch per message; integer and float64
// messages, which its kernel does not move, by one copy per array), zeroed
// and copied, all in order on the device transport's stream; host values
// pass through a small pinned buffer. The NaN/infinity check's findings
// are flags set by the kernels in device memory, each check's copied to a
// pinned array right after it on the stream, and read from there by
// findings().

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
  Status pack_checked(const PackTable &table, void *message, DType wire,
                      float scale) override;
  Status check_finite(const void *p, size_t count, DType dt) override;
  Status findings(std::vector<bool> *nonfinite) override;

private:
  DeviceArrays(DeviceTransport &transport, std::unique_ptr<CudaPacker> packer)
      : transport_(transport), packer_(std::move(packer)) {}
  // A pinned host buffer of at least `bytes`, once the stream is done with
  // the one before.
  Status pinned(size_t bytes);
  Status copy_rows(const PackTable &table, char *message, DType wire,
                   bool packing, bool scaled);
  // Room for `more` findings after those made since the last findings().
  Status flag_room(size_t more);
  // The findings [made_, made_ + n) are set on the device: copies them to
  // the host and counts them made.
  Status flags_set(size_t n);

  DeviceTransport &transport_;
  const std::unique_ptr<CudaPacker> packer_;
  char *messages_ = nullptr;
  size_t capacity_ = 0;
  char *pinned_ = nullptr;
  size_t pinned_capacity_ = 0;
  // The check's findings: one flag each on the device (zero until found)
  // and its copy on the host (pinned), room for `flag_capacity_`; `made_`
  // since the last findings(); `copied_` follows the last copy.
  unsigned *flags_ = nullptr;
  unsigned *found_ = nullptr;
  size_t flag_capacity_ = 0;
  size_t made_ = 0;
  CudaEvent copied_ = nullptr;
};

} // namespace nncomm
