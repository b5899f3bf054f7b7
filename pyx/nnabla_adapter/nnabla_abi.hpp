// nnabla 1.39's types as far as nncomm relies on them, declared from the
// facts of nnabla's public sources (its wheel ships no headers): the C++
// callback nnabla's backward calls after each function and at the end
// (communicator_callbacks=), the C++ communicator nnabla's
// SyncBatchNormalization calls, and the layouts of the Cython objects that
// hold them. nnabla_types.pxi checks nnabla's version and these layouts
// against the Python types before anything here is used.
#pragma once

#include <Python.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "nnabla_adapter/backward_counts.hpp"

namespace nncomm {
namespace nnabla_abi {

struct CgFunction; // nnabla's graph node of a function, never dereferenced
using CgFunctionPtr = std::shared_ptr<CgFunction>;

// nbla::CommunicatorBackwardCallback: these two virtual methods in this
// order and no virtual destructor, so that the vtables agree slot by slot.
class BackwardCallback {
public:
  virtual void on_finish_function_backward(const CgFunctionPtr &f) = 0;
  virtual void on_finish_backward() = 0;

protected:
  ~BackwardCallback() = default;
};

// An instance of nnabla._variable.CommunicatorBackwardCallback: a Cython
// object with a vtable, then the callback that nnabla's backward calls.
struct CallbackObject {
  PyObject_HEAD void *vtab;
  std::shared_ptr<BackwardCallback> callback;
};

// An instance of nnabla.function.Function: a Cython object with a vtable,
// its graph node, the node's raw pointer and an info object.
struct FunctionObject {
  PyObject_HEAD void *vtab;
  CgFunctionPtr fun;
  CgFunction *funp;
  PyObject *info;
};

// The vtable of nnabla.function.Function: its two static cdef methods, in
// the order its .pxd declares them. create_from_c wraps a graph node in the
// Function object that nnabla's own Python hooks receive.
struct FunctionVtable {
  void *create;
  PyObject *(*create_from_c)(CgFunctionPtr f);
};

// Calls into Python, made with the GIL held; -1 with a Python exception set
// on failure.
using FunctionDone = int (*)(PyObject *owner, PyObject *function);
using BackwardDone = int (*)(PyObject *owner);

// Thrown through nnabla's backward where a call into Python failed: its
// Cython wrapper translates C++ exceptions only when no Python exception
// is set, so the one set here is what the caller of backward() sees.
struct PythonRaised {};

// A strong reference to a Python object, held by a C++ object that nnabla
// owns: the last owner may drop it without the GIL, or at exit.
class PythonReference {
public:
  explicit PythonReference(PyObject *object) : object_(object) {
    Py_INCREF(object_);
  }
  ~PythonReference() {
    if (!Py_IsInitialized())
      return;
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(object_);
    PyGILState_Release(gil);
  }
  PythonReference(const PythonReference &) = delete;
  PythonReference &operator=(const PythonReference &) = delete;
  PyObject *get() const { return object_; }

private:
  PyObject *object_;
};

// The callback nnabla's backward calls: counts each function in C++
// (`counts`), and hands what that declines, as nnabla's Python Function,
// and the end of backward to `owner` through Python.
class Bridge final : public BackwardCallback {
public:
  Bridge(PyObject *owner, std::shared_ptr<BackwardCounts> counts,
         const FunctionVtable *functions, FunctionDone function_done,
         BackwardDone backward_done)
      : owner_(owner), counts_(std::move(counts)), functions_(functions),
        function_done_(function_done), backward_done_(backward_done) {}

  void on_finish_function_backward(const CgFunctionPtr &f) override {
    // The key nnabla's Function.__hash__ gives the Python hook.
    if (counts_->try_count(reinterpret_cast<uintptr_t>(f.get())))
      return;
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *function = functions_->create_from_c(f);
    const int status =
        function == nullptr ? -1 : function_done_(owner_.get(), function);
    Py_XDECREF(function);
    PyGILState_Release(gil);
    if (status < 0)
      throw PythonRaised();
  }

  void on_finish_backward() override {
    PyGILState_STATE gil = PyGILState_Ensure();
    const int status = backward_done_(owner_.get());
    PyGILState_Release(gil);
    if (status < 0)
      throw PythonRaised();
  }

private:
  PythonReference owner_;
  const std::shared_ptr<BackwardCounts> counts_;
  const FunctionVtable *functions_;
  FunctionDone function_done_;
  BackwardDone backward_done_;
};

// Makes `object` (an nnabla._variable.CommunicatorBackwardCallback) count
// on `counts` and call `owner` from nnabla's backward.
inline void attach(PyObject *object, PyObject *owner,
                   const std::shared_ptr<BackwardCounts> &counts,
                   const FunctionVtable *functions, FunctionDone function_done,
                   BackwardDone backward_done) {
  reinterpret_cast<CallbackObject *>(object)->callback =
      std::make_shared<Bridge>(owner, counts, functions, function_done,
                               backward_done);
}

struct NdArray; // nbla::NdArray, never dereferenced
using NdArrayPtr = std::shared_ptr<NdArray>;

// An instance of nnabla._nd_array.NdArray, and its vtable (one static cdef
// method: the Python NdArray of a C++ one).
struct NdArrayObject {
  PyObject_HEAD void *vtab;
  NdArrayPtr arr;
  NdArray *arrp;
};
struct NdArrayVtable {
  PyObject *(*create)(NdArrayPtr arr);
};

// nbla::Communicator's virtual functions in the order of its header, which
// is their vtable's (Itanium C++ ABI; two slots for the destructor), so
// that nnabla's code reaches each in its slot.
class CommunicatorSlots {
public:
  virtual ~CommunicatorSlots() = default;
  virtual std::string name() = 0;
  virtual void init() = 0;
  virtual void barrier() = 0;
  virtual void abort() = 0;
  virtual std::string
  new_group(std::pair<std::string, std::vector<int>> name_ranks) = 0;
  virtual std::unordered_map<std::string, std::vector<int>> list_groups() = 0;
  virtual std::vector<int> find_group(const std::string &group) = 0;
  virtual void reduce(const std::vector<NdArrayPtr> &arrays, int dst,
                      bool division, bool inplace,
                      const std::string &group) = 0;
  virtual void reduce(NdArrayPtr array, int dst, bool division, bool inplace,
                      const std::string &group) = 0;
  virtual void allreduce(bool division, bool inplace) = 0;
  virtual void all_reduce(const std::vector<NdArrayPtr> &arrays,
                          bool division, bool inplace,
                          const std::string &group) = 0;
  virtual void all_reduce(NdArrayPtr array, bool division, bool inplace,
                          const std::string &group) = 0;
  virtual std::shared_ptr<BackwardCallback>
  all_reduce_callback(const std::vector<NdArrayPtr> &arrays, size_t pack_size,
                      bool division, const std::string &group,
                      float scale_grad, bool keep_dtype) = 0;
  virtual std::shared_ptr<BackwardCallback>
  all_reduce_callback(NdArrayPtr array, size_t pack_size, bool division,
                      const std::string &group, float scale_grad,
                      bool keep_dtype) = 0;
  virtual void reduce_scatter(const std::vector<NdArrayPtr> &arrays,
                              NdArrayPtr array, bool division,
                              const std::string &group) = 0;
  virtual void bcast(const std::vector<NdArrayPtr> &arrays, int src,
                     bool inplace, const std::string &group) = 0;
  virtual void bcast(NdArrayPtr array, int src, bool inplace,
                     const std::string &group) = 0;
  virtual void all_gather(NdArrayPtr array,
                          const std::vector<NdArrayPtr> &arrays,
                          const std::string &group) = 0;
  virtual void reduce_async(bool division) = 0;
  virtual void allreduce_async(bool division, bool inplace) = 0;
  virtual void reducescatter_async(bool division) = 0;
  virtual void bcast_async() = 0;
  virtual void allgather_async() = 0;
};

// An instance of nnabla.communicator.Communicator: a Cython object with a
// vtable, the C++ communicator and its raw pointer.
struct CommunicatorObject {
  PyObject_HEAD void *vtab;
  std::shared_ptr<CommunicatorSlots> communicator;
  CommunicatorSlots *communicatorp;
};

// Calls into Python for the communicator, made with the GIL held; -1 with
// a Python exception set on failure.
using FindGroup = int (*)(PyObject *comm, const std::string &group,
                          std::vector<int> *ranks);
using AllReduce = int (*)(PyObject *comm, PyObject *arrays, bool division,
                          bool inplace, const std::string &group);

// The C++ communicator behind an nnabla Communicator that stands for
// nncomm's `comm`: what nnabla's SyncBatchNormalization calls, find_group
// and all_reduce, goes to it through Python; nothing else of nnabla's
// reaches it (the Python object's methods are all nncomm's), and the rest
// refuses.
class CommunicatorBridge final : public CommunicatorSlots {
public:
  CommunicatorBridge(PyObject *comm, const NdArrayVtable *arrays,
                     FindGroup find_group, AllReduce all_reduce)
      : comm_(comm), arrays_(arrays), find_group_(find_group),
        all_reduce_(all_reduce) {}

  std::vector<int> find_group(const std::string &group) override {
    std::vector<int> ranks;
    PyGILState_STATE gil = PyGILState_Ensure();
    const int status = find_group_(comm_.get(), group, &ranks);
    PyGILState_Release(gil);
    if (status < 0)
      throw PythonRaised();
    return ranks;
  }

  void all_reduce(const std::vector<NdArrayPtr> &arrays, bool division,
                  bool inplace, const std::string &group) override {
    PyGILState_STATE gil = PyGILState_Ensure();
    int status = -1;
    PyObject *list = PyList_New(static_cast<Py_ssize_t>(arrays.size()));
    for (size_t i = 0; list != nullptr && i < arrays.size(); ++i) {
      PyObject *array = arrays_->create(arrays[i]);
      if (array == nullptr) {
        Py_CLEAR(list);
        break;
      }
      PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), array);
    }
    if (list != nullptr)
      status = all_reduce_(comm_.get(), list, division, inplace, group);
    Py_XDECREF(list);
    PyGILState_Release(gil);
    if (status < 0)
      throw PythonRaised();
  }

  void all_reduce(NdArrayPtr array, bool division, bool inplace,
                  const std::string &group) override {
    all_reduce(std::vector<NdArrayPtr>{array}, division, inplace, group);
  }

  // What nnabla never calls here.
  std::string name() override { refuse("name"); }
  void init() override { refuse("init"); }
  void barrier() override { refuse("barrier"); }
  void abort() override { refuse("abort"); }
  std::string new_group(std::pair<std::string, std::vector<int>>) override {
    refuse("new_group");
  }
  std::unordered_map<std::string, std::vector<int>> list_groups() override {
    refuse("list_groups");
  }
  void reduce(const std::vector<NdArrayPtr> &, int, bool, bool,
              const std::string &) override {
    refuse("reduce");
  }
  void reduce(NdArrayPtr, int, bool, bool, const std::string &) override {
    refuse("reduce");
  }
  void allreduce(bool, bool) override { refuse("allreduce"); }
  std::shared_ptr<BackwardCallback>
  all_reduce_callback(const std::vector<NdArrayPtr> &, size_t, bool,
                      const std::string &, float, bool) override {
    refuse("all_reduce_callback");
  }
  std::shared_ptr<BackwardCallback>
  all_reduce_callback(NdArrayPtr, size_t, bool, const std::string &, float,
                      bool) override {
    refuse("all_reduce_callback");
  }
  void reduce_scatter(const std::vector<NdArrayPtr> &, NdArrayPtr, bool,
                      const std::string &) override {
    refuse("reduce_scatter");
  }
  void bcast(const std::vector<NdArrayPtr> &, int, bool,
             const std::string &) override {
    refuse("bcast");
  }
  void bcast(NdArrayPtr, int, bool, const std::string &) override {
    refuse("bcast");
  }
  void all_gather(NdArrayPtr, const std::vector<NdArrayPtr> &,
                  const std::string &) override {
    refuse("all_gather");
  }
  void reduce_async(bool) override { refuse("reduce_async"); }
  void allreduce_async(bool, bool) override { refuse("allreduce_async"); }
  void reducescatter_async(bool) override { refuse("reducescatter_async"); }
  void bcast_async() override { refuse("bcast_async"); }
  void allgather_async() override { refuse("allgather_async"); }

private:
  [[noreturn]] static void refuse(const char *what) {
    throw std::runtime_error(
        std::string("nncomm's communicator, behind nnabla's type, serves "
                    "nnabla's sync batch normalization only (find_group "
                    "and all_reduce), not ") +
        what);
  }

  PythonReference comm_;
  const NdArrayVtable *arrays_;
  FindGroup find_group_;
  AllReduce all_reduce_;
};

// Makes `object` (an nnabla.communicator.Communicator) stand for `comm`.
inline void attach_communicator(PyObject *object, PyObject *comm,
                                const NdArrayVtable *arrays,
                                FindGroup find_group, AllReduce all_reduce) {
  auto *held = reinterpret_cast<CommunicatorObject *>(object);
  held->communicator = std::make_shared<CommunicatorBridge>(
      comm, arrays, find_group, all_reduce);
  held->communicatorp = held->communicator.get();
}

// The nbla::NdArray of an nnabla._nd_array.NdArray (`object`), and the key of an
// nnabla.function.Function's call: its graph node's address.
inline void *ndarray_of(PyObject *object) {
  return reinterpret_cast<NdArrayObject *>(object)->arrp;
}
inline uintptr_t function_key(PyObject *object) {
  return reinterpret_cast<uintptr_t>(
      reinterpret_cast<FunctionObject *>(object)->funp);
}

// The sizes the layouts above give the Python types' instances.
constexpr Py_ssize_t kCallbackObjectSize = sizeof(CallbackObject);
constexpr Py_ssize_t kFunctionObjectSize = sizeof(FunctionObject);
constexpr Py_ssize_t kNdArrayObjectSize = sizeof(NdArrayObject);
constexpr Py_ssize_t kCommunicatorObjectSize = sizeof(CommunicatorObject);

} // namespace nnabla_abi
} // namespace nncomm
