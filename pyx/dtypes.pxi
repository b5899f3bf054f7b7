# The element types nncomm moves, by name, with their codes in the C++ core
# (include/nncomm/core/dtype.hpp): the one table both extension modules read.
# bfloat16 has no numpy dtype; nnabla arrays never hold it, but buckets and
# the packing API do.

cdef dict DTYPE_CODES = {
    "float32": <int>DType.kFloat32,
    "float64": <int>DType.kFloat64,
    "float16": <int>DType.kFloat16,
    "bfloat16": <int>DType.kBFloat16,
    "int32": <int>DType.kInt32,
    "int64": <int>DType.kInt64,
}

