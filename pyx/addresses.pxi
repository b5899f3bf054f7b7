# Memory given from Python: addresses as ints (numpy's ctypes.data, CuPy's
# data.ptr, nnabla's data_ptr) and the tuples that describe it, checked
# before C++ dereferences them.

from libc.stdint cimport uintptr_t


cdef uintptr_t address_of(value, what) except? 0:
    value = int(value)
    if not 0 <= value < 2 ** 64:
        raise ValueError(f"{what}: {value} is not a memory address")
    return <uintptr_t>value


cdef tuple counted(item, what, tuple fields):
    """`item`, a tuple of the four `fields` (their names, for errors) whose
    last two are counts, checked: four of them, counts not negative."""
    if not isinstance(item, (tuple, list)) or len(item) != 4:
        raise ValueError(f"{what} must be a tuple ({', '.join(fields)}), "
                         f"not {item!r}")
    if item[2] < 0 or item[3] < 0:
        raise ValueError(
            f"{what}: {fields[2]} and {fields[3]} must not be negative "
            f"({fields[2]} {item[2]}, {fields[3]} {item[3]})")
    return tuple(item)
