# Declarations of nnabla's types as nncomm relies on them
# (pyx/nnabla_adapter/nnabla_abi.hpp). Nothing but externs.

from cpython.ref cimport PyObject
from libc.stddef cimport size_t
from libc.stdint cimport uintptr_t
from libcpp cimport bool
from libcpp.memory cimport shared_ptr
from libcpp.string cimport string
from libcpp.vector cimport vector

from libnncomm cimport Engine, Readiness, ReadinessTable


cdef extern from "nnabla_adapter/nnabla_arrays.hpp" namespace "nncomm::nnabla_abi":
    cdef cppclass Context:
        vector[string] backend
        string array_class
        string device_id

    cdef cppclass NdArrayCalls:
        bool resolve(const string& library, string* error)
        bool head(void* ndarray, long* count, int* type, bool* zeroed)
        bool memory(void* ndarray, int type, const Context& ctx,
                    bool write_only, void** ptr)

    int ndarray_dtype_code "nncomm::nnabla_abi::dtype_code"(int type)


cdef extern from "nnabla_adapter/backward_counts.hpp" namespace "nncomm::nnabla_abi":
    cdef cppclass BackwardCounts:
        BackwardCounts(const NdArrayCalls* calls, vector[void*] arrays,
                       Context ctx)
        const Readiness& readiness()
        void count(size_t function, uintptr_t key, vector[size_t]* ready)
        void flush(vector[size_t]* ready)
        void set_last(uintptr_t key)
        void start(shared_ptr[ReadinessTable] table, Engine* engine,
                   const vector[long]* counts, const vector[int]* dtypes,
                   bool caller_ends)
        void stop()
        bool try_count(uintptr_t key) nogil


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
                const shared_ptr[BackwardCounts]& counts,
                const FunctionVtable *functions, FunctionDone function_done,
                BackwardDone backward_done) except +
    void* ndarray_of(PyObject* ndarray)
    uintptr_t function_key(PyObject* function)
    void attach_communicator(PyObject *object, PyObject *comm,
                             const NdArrayVtable *arrays,
                             FindGroup find_group,
                             AllReduce all_reduce) except +

    const Py_ssize_t kCallbackObjectSize
    const Py_ssize_t kFunctionObjectSize
    const Py_ssize_t kNdArrayObjectSize
    const Py_ssize_t kCommunicatorObjectSize
