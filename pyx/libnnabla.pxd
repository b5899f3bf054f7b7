# Declarations of nnabla's types as nncomm's communicator callback relies
# on them (pyx/nnabla_abi.hpp). Nothing but externs.

from cpython.ref cimport PyObject


cdef extern from "nnabla_abi.hpp" namespace "nncomm::nnabla_abi":
    cdef cppclass CgFunctionPtr "nncomm::nnabla_abi::CgFunctionPtr":
        pass

    ctypedef struct FunctionObject:
        CgFunctionPtr fun

    ctypedef struct FunctionVtable:
        object (*create_from_c)(CgFunctionPtr f)

    ctypedef int (*FunctionDone)(PyObject *owner, PyObject *function) except -1
    ctypedef int (*BackwardDone)(PyObject *owner) except -1

    void attach(PyObject *object, PyObject *owner,
                const FunctionVtable *functions, FunctionDone function_done,
                BackwardDone backward_done) except +

    const Py_ssize_t kCallbackObjectSize
    const Py_ssize_t kFunctionObjectSize
