// ArrayMemory: where a list collective's arrays and fused messages live,
// and the element operations it needs there, so that one implementation of
// the list collectives (collectives.hpp) serves host memory (HostArrays,
// below) and CUDA device memory (DeviceArrays, device_arrays.hpp) alike.
// Operations on device memory are ordered on the transport's stream; only
// get() and findings() make the host wait.
#pragma once

#include <cstddef>
#include <vector>

#include "nncomm/core/dtype.hpp"
#include "nncomm/core/fusion_buffer.hpp"
#include "nncomm/core/pack.hpp"
#include "nncomm/core/status.hpp"

namespace nncomm {

class ArrayMemory {
public:
  virtual ~ArrayMemory() = default;
  // At least `bytes` for fused messages, 64-byte aligned, reused by later
  // calls; earlier contents are not kept when it grows.
  virtual Status reserve(size_t bytes, char **buffer) = 0;
  // message[k] = wire(tensor[i] * scale), as pack.hpp lays it out.
  virtual Status pack(const PackTable &table, void *message, DType wire,
                      float scale) = 0;
  // tensor[i] = dtype(message[k] / divisor).
  virtual Status unpack(const PackTable &table, const void *message,
                        DType wire, int divisor) = 0;
  virtual Status zero(void *p, size_t bytes) = 0;
  virtual Status copy(void *dst, const void *src, size_t bytes) = 0;
  // Host values into this memory, and back: get() returns once they are
  // on the host.
  virtual Status put(void *dst, const void *host, size_t bytes) = 0;
  virtual Status get(void *host, const void *src, size_t bytes) = 0;
  // Whether pack() and unpack() can scale and divide messages of `wire`.
  virtual bool scales(DType wire) const { return true; }
  // The NaN/infinity check (NNCOMM_CHECK_FINITE). Each check makes
  // findings, which findings() hands over in the order they were made:
  // one per row of `table` for pack_checked(), one for check_finite(). On
  // a device they reach the host only there, so that checking never makes
  // the host wait for the device.
  //
  // pack(), also checking each row's tensor as it is read.
  virtual Status pack_checked(const PackTable &table, void *message,
                              DType wire, float scale) = 0;
  // Checks the `count` elements of `dt` at `p`.
  virtual Status check_finite(const void *p, size_t count, DType dt) = 0;
  // `*nonfinite` refilled with the findings of the checks made since the
  // last call: true where a NaN or an infinity was found.
  virtual Status findings(std::vector<bool> *nonfinite) = 0;
};

// Where a reduction's `scale` and `divisor` are applied to a message of
// `wire` in `memory`: by pack() and unpack() where the memory can, by the
// transport while it reduces otherwise (float64 on a device, which the
// CUDA packer does not move).
struct ScalingSplit {
  float pack_scale;
  float reduce_scale;
  int reduce_divisor;
  int unpack_divisor;
};

inline ScalingSplit split_scaling(const ArrayMemory &memory, DType wire,
                                  float scale, int divisor) {
  if (memory.scales(wire))
    return {scale, 1.0f, 1, divisor};
  return {1.0f, scale, divisor, 1};
}

class HostArrays : public ArrayMemory {
public:
  Status reserve(size_t bytes, char **buffer) override {
    return fusion_.reserve(bytes, buffer);
  }
  Status pack(const PackTable &table, void *message, DType wire,
              float scale) override {
    return pack_host(table, message, wire, scale);
  }
  Status unpack(const PackTable &table, const void *message, DType wire,
                int divisor) override {
    return unpack_host(table, message, wire, 1.0f, divisor);
  }
  Status zero(void *p, size_t bytes) override;
  Status copy(void *dst, const void *src, size_t bytes) override;
  Status put(void *dst, const void *host, size_t bytes) override {
    return copy(dst, host, bytes);
  }
  Status get(void *host, const void *src, size_t bytes) override {
    return copy(host, src, bytes);
  }
  Status pack_checked(const PackTable &table, void *message, DType wire,
                      float scale) override;
  Status check_finite(const void *p, size_t count, DType dt) override;
  Status findings(std::vector<bool> *nonfinite) override;

private:
  FusionBuffer fusion_;
  std::vector<size_t> rows_; // pack_host's finding, reused
  std::vector<bool> found_;  // since the last findings()
};

} // namespace nncomm
