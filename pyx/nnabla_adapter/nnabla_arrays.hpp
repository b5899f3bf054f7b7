// nnabla NdArrays read in C++, without Python: their element count, dtype
// and memory, through the functions libnnabla.so exports (its wheel ships
// no headers), so that the backward callback hands a gradient to the engine
// with no Python call. The functions are looked up by their mangled names
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

// nnabla's dtypes enum is numpy's type numbers; the floating ones.
constexpr int kNumpyFloat32 = 11;
constexpr int kNumpyFloat64 = 12;
constexpr int kNumpyFloat16 = 23;

// The exported member functions, each called with the object first (the
// Itanium ABI's `this`; a class-type result comes back through a pointer
// passed before it, as for a free function returning one).
struct NdArrayCalls {
  // nbla::BaseNdArray::array(): the NdArray's SyncedArray.
  std::shared_ptr<void> (*array)(void *ndarray);
  // nbla::SyncedArray::dtype() const; throws before the array is written.
  int (*dtype)(const void *synced);
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
        find(handle, "_ZNK4nbla7NdArray4sizeEl", &size, error) &&
        find(handle, "_ZN4nbla7NdArray8data_ptrENS_6dtypesERKNS_7ContextEb",
             &data_ptr, error);
    dlclose(handle); // the Python modules that loaded it keep it loaded
    return found;
  }

  // NdArray `ndarray`'s element count, its dtype as nncomm codes it (-1
  // where not a floating one nncomm reduces; float32 before it is
  // written, as nnabla says), and then its memory in that dtype, in
  // context `ctx`. False where nnabla threw.
  bool read(void *ndarray, const Context &ctx, long *count, int *dtype,
            void **ptr) const noexcept {
    try {
      *count = size(ndarray, -1);
      int type = kNumpyFloat32;
      {
        std::shared_ptr<void> synced = array(ndarray);
        try {
          type = this->dtype(synced.get());
        } catch (...) {
          // Never written: nnabla's default, as NdArray.dtype's callers
          // in nncomm take it.
        }
      }
      *dtype = code_of(type);
      if (*dtype < 0)
        return true;
      *ptr = reinterpret_cast<void *>(
          static_cast<uintptr_t>(data_ptr(ndarray, type, ctx, false)));
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

  static int code_of(int numpy_type) {
    switch (numpy_type) {
    case kNumpyFloat32: return static_cast<int>(DType::kFloat32);
    case kNumpyFloat64: return static_cast<int>(DType::kFloat64);
    case kNumpyFloat16: return static_cast<int>(DType::kFloat16);
    }
    return -1;
  }
};

} // namespace nnabla_abi
} // namespace nncomm
