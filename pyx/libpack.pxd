# Declarations of bucket packing (include/nncomm/core/pack.hpp, cuda_pack.hpp):
# the shared layout, its host twin and the CUDA packer. Nothing but externs.

from libc.stddef cimport size_t
from libc.stdint cimport uint64_t
from libcpp cimport bool
from libcpp.memory cimport unique_ptr
from libcpp.vector cimport vector

from libcore cimport DType, Status


cdef extern from "nncomm/core/pack.hpp" namespace "nncomm" nogil:
    struct PackSegment:
        const void* tensor
        DType dtype
        size_t offset
        size_t count

    struct PackEntry:
        uint64_t address
        uint64_t bucket_offset
        uint64_t count
        uint64_t first_tile

    cdef cppclass PackTable:
        vector[PackEntry] entries
        size_t count

    Status build_pack_table(const PackSegment* segments, size_t n, DType wire,
                            PackTable* table)
    Status pack_host(const PackTable& table, void* bucket, DType wire,
                     float scale)
    Status unpack_host(const PackTable& table, const void* bucket, DType wire,
                       float scale, int divisor)


cdef extern from "nncomm/cuda/cuda_pack.hpp" namespace "nncomm" nogil:
    ctypedef void* CudaStream
    ctypedef void* CudaEvent

    const size_t kPackTileBytes
    bool cuda_packing_built()
    const size_t kDefaultMaxTables "nncomm::CudaPacker::kDefaultMaxTables"

    cdef cppclass CppCudaPacker "nncomm::CudaPacker":
        @staticmethod
        Status Create(unique_ptr[CppCudaPacker]* out, size_t max_tables)
        Status pack(const PackTable& table, void* bucket, DType wire,
                    float scale, CudaStream stream, CudaEvent after,
                    unsigned* flags)
        Status unpack(const PackTable& table, const void* bucket, DType wire,
                      float scale, int divisor, CudaStream stream,
                      CudaEvent after)


cdef extern from "nncomm/cuda/cuda_devices.hpp" namespace "nncomm" nogil:
    Status cuda_device_count(int* count)
