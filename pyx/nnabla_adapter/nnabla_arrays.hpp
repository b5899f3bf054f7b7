// nnabla NdArrays read in C++, without Python: their element count, dtype,
// zeroing flag and memory, through the functions libnnabla.so exports (its
// wheel ships no headers), so that the backward callback hands a gradient
// to the engine with no Python call, and a collective reads its arrays at
// a fraction of NdArray.data_ptr's cost (which converts the Python context
// on every call). The functions are looked up by their mangled names
// in the libnnabla.so already loaded; nnabla_types.pxi checks what they
// return against nnabla's Python API before anything here is used.
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nncomm/core/dtype.hpp"

namespace nncomm {
namespace nnabla_abi {

// nbla::Context's layout: what a computation runs on.
struct Context {
  std::vector<std::string> backend;
  std::string array_class;
  std::string device_id;
};

// nnabla's dtypes enum is numpy's type numbers.
constexpr int kNumpyInt32 = 5;
constexpr int kNumpyInt64 = 7;
constexpr int kNumpyLongLong = 9; // int64 too, under another number
constexpr int kNumpyFloat32 = 11;
constexpr int kNumpyFloat64 = 12;
constexpr int kNumpyFloat16 = 23;

// nncomm's code of numpy type number `type`; -1 where nncomm moves none.
inline int dtype_code(int type) {
  switch (type) {
  case kNumpyFloat32: return static_cast<int>(DType::kFloat32);
  case kNumpyFloat64: return static_cast<int>(DType::kFloat64);
  case kNumpyFloat16: return static_cast<int>(DType::kFloat16);
  case kNumpyInt32: return static_cast<int>(DType::kInt32);
  case kNumpyInt64:
  case kNumpyLongLong: return static_cast<int>(DType::kInt64);
  }
  return -1;
}

// The exported member functions, each called with the object first (the
// Itanium ABI's `this`; a class-type result comes back through a pointer
// passed before it, as for a free function returning one).
struct NdArrayCalls {
  // nbla::BaseNdArray::array(): the NdArray's SyncedArray.
  std::shared_ptr<void> (*array)(void *ndarray);
  // nbla::SyncedArray::dtype() const; throws before the array is written.
  int (*dtype)(const void *synced);
  // nbla::SyncedArray::zeroing() const.
  bool (*zeroing)(const void *synced);
  // nbla::NdArray::size(long axis) const.
  long (*size)(const void *ndarray, long axis);
  // nbla::NdArray::data_ptr(dtypes, const Context &, bool write_only).
  unsigned long (*data_ptr)(void *ndarray, int dtype, const Context &ctx,
                            bool write_only);

  // Looks them up in `library` (libnnabla.so's path, loaded already);
  // false, with `*error` saying which is missing, where one is.
  bool resolve(const std::string &library, std::string *error) {
    void *handle = dlopen(library.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) {
      *error = library + " is not loaded";
      return false;
    }
    const bool found =
        find(handle, "_ZN4nbla11BaseNdArray5arrayEv", &array, error) &&
        find(handle, "_ZNK4nbla11SyncedArray5dtypeEv", &dtype, error) &&
        find(handle, "_ZNK4nbla11SyncedArray7zeroingEv", &zeroing, error) &&
        find(handle, "_ZNK4nbla7NdArray4sizeEl", &size, error) &&
        find(handle, "_ZN4nbla7NdArray8data_ptrENS_6dtypesERKNS_7ContextEb",
             &data_ptr, error);
    dlclose(handle); // the Python modules that loaded it keep it loaded
    return found;
  }

  // NdArray `ndarray`'s element count, numpy type number (float32's before
  // it is written, as nnabla's Python API reads it) and whether it is
  // still zeroing. False where nnabla threw.
  bool head(void *ndarray, long *count, int *type, bool *zeroed) const
      noexcept {
    try {
      *count = size(ndarray, -1);
      std::shared_ptr<void> synced = array(ndarray);
      *zeroed = zeroing(synced.get());
      try {
        *type = dtype(synced.get());
      } catch (...) {
        *type = kNumpyFloat32; // never written
      }
      return true;
    } catch (...) {
      return false;
    }
  }

  // NdArray `ndarray`'s memory holding numpy type number `type`, in
  // context `ctx`; with `write_only`, its contents need not be kept. False
  // where nnabla threw.
  bool memory(void *ndarray, int type, const Context &ctx, bool write_only,
              void **ptr) const noexcept {
    try {
      *ptr = reinterpret_cast<void *>(
          static_cast<uintptr_t>(data_ptr(ndarray, type, ctx, write_only)));
      return true;
    } catch (...) {
      return false;
    }
  }

private:
  template <typename F>
  static bool find(void *handle, const char *name, F *out,
                   std::string *error) {
    *out = reinterpret_cast<F>(dlsym(handle, name));
    if (*out == nullptr)
      *error = std::string("libnnabla.so exports no ") + name;
    return *out != nullptr;
  }
};

} // namespace nnabla_abi
} // namespace nncomm
