// ArrayMemory: where a list collective's arrays and fused messages live,
// and the element operations it needs there, so that one implementation of
// the list collectives (collectives.hpp) serves host memory (HostArrays,
// below) and CUDA device memory (DeviceArrays, device_arrays.hpp) alike.
// Operations on device memory are ordered on the transport's stream; only
// get() makes the host wait.
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
  // pack(), also appending to `*nonfinite` the index of each row of
  // `table` whose tensor holds a NaN or an infinity (NNCOMM_CHECK_FINITE).
  // Host memory only, so far: elsewhere it fails.
  virtual Status pack_checked(const PackTable &table, void *message,
                              DType wire, float scale,
                              std::vector<size_t> *nonfinite) {
    return unchecked();
  }
  // `*finite`: whether the `count` elements of `dt` at `p` hold no NaN and
  // no infinity. Host memory only, so far, as pack_checked().
  virtual Status check_finite(const void *p, size_t count, DType dt,
                              bool *finite) {
    return unchecked();
  }

private:
  static Status unchecked() {
    return Status::InvalidArgument(
        "nncomm checks gradients for NaN and infinity (check_finite) in "
        "host memory only, so far");
  }
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
                      float scale, std::vector<size_t> *nonfinite) override {
    return pack_host(table, message, wire, scale, nonfinite);
  }
  Status check_finite(const void *p, size_t count, DType dt,
                      bool *finite) override;

private:
  FusionBuffer fusion_;
};

} // namespace nncomm
