// Element types nncomm moves, and their sizes. The numbering is shared with
// the Cython layer (pyx/libnncomm.pxd), which maps numpy dtypes onto it.
#pragma once

#include <cstddef>

namespace nncomm {

enum class DType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kBFloat16 = 5,
};

inline size_t dtype_size(DType dt) {
  switch (dt) {
  case DType::kFloat32: return 4;
  case DType::kFloat64: return 8;
  case DType::kFloat16: return 2;
  case DType::kInt32: return 4;
  case DType::kInt64: return 8;
  case DType::kBFloat16: return 2;
  }
  return 0;
}

// numpy's name of the dtype.
inline const char *dtype_name(DType dt) {
  switch (dt) {
  case DType::kFloat32: return "float32";
  case DType::kFloat64: return "float64";
  case DType::kFloat16: return "float16";
  case DType::kInt32: return "int32";
  case DType::kInt64: return "int64";
  case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

inline bool dtype_is_floating(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kFloat64 ||
         dt == DType::kFloat16 || dt == DType::kBFloat16;
}

} // namespace nncomm
