// nnabla 1.39's types as far as nncomm's communicator callback relies on
// them, declared from the facts of nnabla's public sources (its wheel ships
// no headers): the C++ callback nnabla's backward calls after each
// function and at the end, and the layouts of two of its Cython objects.
// pyx/nnabla_callback.pxi checks nnabla's version and these layouts against
// the Python types before anything here is used.
#pragma once

#include <Python.h>

#include <memory>

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

// The callback nnabla's backward calls: hands each function, as nnabla's
// Python Function, and the end of backward to `owner` through Python.
class Bridge final : public BackwardCallback {
public:
  Bridge(PyObject *owner, const FunctionVtable *functions,
         FunctionDone function_done, BackwardDone backward_done)
      : owner_(owner), functions_(functions), function_done_(function_done),
        backward_done_(backward_done) {
    Py_INCREF(owner_);
  }

  ~Bridge() {
    // The last reference is usually the Python object's, dropped with the
    // GIL held; nnabla may drop one without it.
    if (!Py_IsInitialized())
      return;
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(owner_);
    PyGILState_Release(gil);
  }

  void on_finish_function_backward(const CgFunctionPtr &f) override {
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *function = functions_->create_from_c(f);
    const int status =
        function == nullptr ? -1 : function_done_(owner_, function);
    Py_XDECREF(function);
    PyGILState_Release(gil);
    if (status < 0)
      throw PythonRaised();
  }

  void on_finish_backward() override {
    PyGILState_STATE gil = PyGILState_Ensure();
    const int status = backward_done_(owner_);
    PyGILState_Release(gil);
    if (status < 0)
      throw PythonRaised();
  }

private:
  PyObject *owner_;
  const FunctionVtable *functions_;
  FunctionDone function_done_;
  BackwardDone backward_done_;
};

// Makes `object` (an nnabla._variable.CommunicatorBackwardCallback) call
// `owner` from nnabla's backward.
inline void attach(PyObject *object, PyObject *owner,
                   const FunctionVtable *functions, FunctionDone function_done,
                   BackwardDone backward_done) {
  reinterpret_cast<CallbackObject *>(object)->callback =
      std::make_shared<Bridge>(owner, functions, function_done,
                               backward_done);
}

// The sizes the layouts above give the Python types' instances.
constexpr Py_ssize_t kCallbackObjectSize = sizeof(CallbackObject);
constexpr Py_ssize_t kFunctionObjectSize = sizeof(FunctionObject);

} // namespace nnabla_abi
} // namespace nncomm
