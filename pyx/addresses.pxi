# Memory addresses given as Python ints (numpy's ctypes.data, CuPy's
# data.ptr, nnabla's data_ptr), checked before C++ dereferences them.

from libc.stdint cimport uintptr_t


cdef uintptr_t address_of(value, what) except? 0:
    value = int(value)
    if not 0 <= value < 2 ** 64:
        raise ValueError(f"{what}: {value} is not a memory address")
    return <uintptr_t>value
