# Declarations of the C++ core's basic types (include/nncomm/), shared by
# every extension module: how failures are reported and which element types
# exist. Nothing here needs MPI or CUDA.

from libcpp cimport bool
from libcpp.string cimport string


cdef extern from "nncomm/core/status.hpp" namespace "nncomm" nogil:
    enum class StatusCode(int):
        kOk
        kInvalidArgument
        kTransport
        kOutOfMemory
        kRuntimeError
        kCommunicator
        kInterrupted
        kNonFinite

    cdef cppclass Status:
        Status()
        @staticmethod
        Status RuntimeError(string message)
        bool ok()
        StatusCode code()
        const string& message()


cdef extern from "nncomm/core/dtype.hpp" namespace "nncomm" nogil:
    enum class DType(int):
        kFloat32
        kFloat64
        kFloat16
        kInt32
        kInt64
        kBFloat16
    size_t dtype_size(DType dt)
