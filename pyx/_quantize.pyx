# cython: language_level=3, boundscheck=False, wraparound=False
# distutils: language = c++
"""Quantized gradients with error feedback on raw addresses: the kernels
behind :class:`nncomm.quantized.QuantizedReducer` (CNTK's 1-bit SGD and its
N-bit variant). The algorithm and the block layout are spelled out in
include/nncomm/compression/quantize.hpp.

This module needs neither nnabla nor MPI: addresses are plain integers
(``numpy.ndarray.ctypes.data``, ``nnabla.NdArray.data_ptr(...)``) of host
memory. A tensor is a tuple ``(gradient, residual, rows, cols)``: the
addresses of its ``rows * cols`` float32 gradient (row-major) and residual
(0: no error feedback), and its shape as a matrix (:func:`matrix`).

Example:

    .. code-block:: python

        import numpy as np
        from nncomm import _quantize

        g = np.array([[0.5, -1.0], [1.5, -3.0]], np.float32)
        residual = np.zeros_like(g)
        tensors = [(g.ctypes.data, residual.ctypes.data, *_quantize.matrix(
            g.shape))]
        block = np.empty(_quantize.block_words(tensors, 1), np.int32)
        _quantize.encode(tensors, 1, block.ctypes.data)
        _quantize.decode_sum(tensors, 1, block.ctypes.data, 1)
        # g == [[1, -2], [1, -2]]; residual == [[-0.5, 1], [0.5, -1]]
"""

from libc.stdint cimport int32_t, uintptr_t
from libcpp.vector cimport vector

from libcore cimport *
from libquantize cimport *

include "errors.pxi"
include "addresses.pxi"

MIN_BITS = kMinQuantizationBits
"""int: the fewest bits per element."""

MAX_BITS = kMaxQuantizationBits
"""int: the most bits per element."""


def matrix(shape):
    """The matrix a gradient of `shape` is quantized as: its first
    dimension's rows and the product of the others' columns (a 1-D gradient
    is one column, a scalar one element).

    Args:
        shape (tuple of int): The gradient's shape.

    Returns:
        tuple: ``(rows, cols)``.
    """
    shape = tuple(shape)
    if not shape:
        return 1, 1
    cols = 1
    for d in shape[1:]:
        cols *= d
    return shape[0], cols


cdef int fill(tensors, vector[QuantizedTensor]& table) except -1:
    """Checks `tensors` and puts them in `table`."""
    cdef QuantizedTensor t
    table.clear()
    for i, tensor in enumerate(tensors):
        what = f"tensors[{i}]"
        gradient, residual, rows, cols = counted(
            tensor, what, ("gradient", "residual", "rows", "cols"))
        t.gradient = <float*>address_of(gradient, what)
        t.residual = <float*>address_of(residual, what)
        t.rows = rows
        t.cols = cols
        table.push_back(t)
    return 0


cdef int check_bits(int bits) except -1:
    if not kMinQuantizationBits <= bits <= kMaxQuantizationBits:
        raise ValueError(f"quantization bits must be "
                         f"{kMinQuantizationBits} to {kMaxQuantizationBits}, "
                         f"not {bits}")
    return 0


def block_words(tensors, int bits):
    """int32 words of one rank's block of `tensors` (their state word
    included); only the shapes are read.

    Args:
        tensors (list of tuple): ``(gradient, residual, rows, cols)`` each.
        bits (int): Bits per element, 1 to 8.

    Returns:
        int: The block's length.
    """
    cdef vector[QuantizedTensor] table
    check_bits(bits)
    fill(tensors, table)
    return quantized_block_words(table.data(), table.size(), bits)


def encode(tensors, int bits, block):
    """Encodes `tensors` into one rank's block and, where a tensor has a
    residual, leaves there what the encoding lost.

    Args:
        tensors (list of tuple): ``(gradient, residual, rows, cols)`` each.
        bits (int): Bits per element, 1 to 8.
        block (int): Address of :func:`block_words` int32 words.
    """
    cdef vector[QuantizedTensor] table
    fill(tensors, table)
    cdef int32_t* out = <int32_t*>address_of(block, "block")
    cdef Status status
    with nogil:
        status = quantize_encode(table.data(), table.size(), bits, out)
    CHKSTATUS(status)


def decode_sum(tensors, int bits, blocks, size_t ranks, bint average=False):
    """Writes into each tensor's gradient the sum (the mean with `average`)
    of the decoded blocks of `ranks` ranks, in rank order.

    Args:
        tensors (list of tuple): ``(gradient, residual, rows, cols)`` each;
            residuals are not read.
        bits (int): Bits per element, 1 to 8.
        blocks (int): Address of `ranks` blocks laid end to end.
        ranks (int): How many.
        average (bool): Divide the sum by `ranks`.

    Raises:
        RuntimeError: A block is marked failed (its state word is not 0);
            no gradient is written.
    """
    cdef vector[QuantizedTensor] table
    fill(tensors, table)
    cdef const int32_t* src = <const int32_t*>address_of(blocks, "blocks")
    cdef Status status
    with nogil:
        status = quantize_decode_sum(table.data(), table.size(), bits, src,
                                     ranks, average)
    CHKSTATUS(status)
