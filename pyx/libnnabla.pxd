# Declarations of nnabla's types as nncomm relies on them
# (pyx/nnabla_adapter/nnabla_abi.hpp). Nothing but externs.

from cpython.ref cimport PyObject
from libcpp cimport bool
from libcpp.string cimport string
from libcpp.vector cimport vector


cdef extern from "nnabla_adapter/nnabla_abi.hpp" namespace "nncomm::nnabla_abi":
    cdef cppclass CgFunctionPtr "nncomm::nnabla_abi::CgFunctionPtr":
        pass

    cdef cppclass NdArrayPtr "nncomm::nnabla_abi::NdArrayPtr":
        pass

    ctypedef struct FunctionObject:
        CgFunctionPtr fun

    ctypedef struct FunctionVtable:
        object (*create_from_c)(CgFunctionPtr f)

    ctypedef struct NdArrayObject:
        NdArrayPtr arr

    ctypedef struct NdArrayVtable:
        object (*create)(NdArrayPtr arr)

    ctypedef int (*FunctionDone)(PyObject *owner, PyObject *function) except -1
    ctypedef int (*BackwardDone)(PyObject *owner) except -1
    ctypedef int (*FindGroup)(PyObject *comm, const string &group,
                              vector[int] *ranks) except -1
    ctypedef int (*AllReduce)(PyObject *comm, PyObject *arrays, bool division,
                              bool inplace, const string &group) except -1

    void attach(PyObject *object, PyObject *owner,
                const FunctionVtable *functions, FunctionDone function_done,
                BackwardDone backward_done) except +
    void attach_communicator(PyObject *object, PyObject *comm,
                             const NdArrayVtable *arrays,
                             FindGroup find_group,
                             AllReduce all_reduce) except +

    const Py_ssize_t kCallbackObjectSize
    const Py_ssize_t kFunctionObjectSize
    const Py_ssize_t kNdArrayObjectSize
    const Py_ssize_t kCommunicatorObjectSize
