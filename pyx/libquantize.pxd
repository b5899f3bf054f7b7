# Declarations of quantized gradients
# (include/nncomm/compression/quantize.hpp). Nothing but externs.

from libc.stddef cimport size_t
from libc.stdint cimport int32_t
from libcpp cimport bool

from libcore cimport Status


cdef extern from "nncomm/compression/quantize.hpp" namespace "nncomm" nogil:
    const int kMinQuantizationBits
    const int kMaxQuantizationBits

    struct QuantizedTensor:
        float* gradient
        float* residual
        size_t rows
        size_t cols

    size_t quantized_block_words(const QuantizedTensor* tensors, size_t n,
                                 int bits)
    Status quantize_encode(const QuantizedTensor* tensors, size_t n, int bits,
                           int32_t* block)
    Status quantize_decode_sum(const QuantizedTensor* tensors, size_t n,
                               int bits, const int32_t* blocks, size_t ranks,
                               bool average)
