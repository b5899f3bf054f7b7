# cython: language_level=3, boundscheck=False, wraparound=False
# distutils: language = c++
"""Bucket packing on raw addresses: the kernels behind nncomm's buckets.

``pack`` lays pieces of tensors ("segments") end to end in one bucket of a
wire dtype, multiplied by a scale; ``unpack`` writes a bucket back into its
tensors, multiplied by a scale and divided by a divisor (the mean of a
reduction). The host functions work on CPU memory; :class:`CudaPacker` does
the same on a CUDA device in one kernel launch per bucket. Both execute the
same layout, so a bucket packed by one unpacks with the other.

This module needs neither nnabla nor MPI: addresses are plain integers
(``numpy.ndarray.ctypes.data``, ``cupy.ndarray.data.ptr``,
``nnabla.NdArray.data_ptr(...)``).

A segment is a tuple ``(address, dtype, offset, count)``: the address of a
tensor's element 0, its dtype (``'float32'``, ``'float16'``, ``'bfloat16'``,
``'float64'``, ``'int32'``, ``'int64'`` or a numpy dtype), and the
``count`` elements starting at element ``offset`` that the segment covers.
A tensor may be split over several segments and buckets. Address 0 packs as
zeros and is left out when unpacking.

Arithmetic is in float32 (float64 where float64 is on either side; the
scale itself is a float32 value), then rounded once to nearest even into the
destination dtype: for float32, float16 and float64 the result is bitwise
what numpy gives for ``(x.astype(f32) * scale / divisor).astype(dst)``, and
bfloat16 is rounded the same way (numpy has no bfloat16). A divisor that is
a power of two is applied as an exact multiplication, which rounds the same
except for results below float32's normal range. Equal dtypes with scale 1
and divisor 1 are copied bit for bit. Integer tensors travel only in their
own dtype, unscaled.

Example:

    .. code-block:: python

        import numpy as np
        from nncomm import packing

        a = np.arange(10, dtype=np.float32)
        b = np.ones(3, dtype=np.float16)
        bucket = np.empty(8, dtype=np.float16)
        segments = [(a.ctypes.data, a.dtype, 5, 5), (b.ctypes.data, b.dtype, 0, 3)]
        packing.pack(segments, bucket.ctypes.data, 'float16', scale=0.5)
        # bucket == [2.5, 3, 3.5, 4, 4.5, 0.5, 0.5, 0.5]
"""

from libc.stdint cimport uintptr_t
from libcpp.memory cimport unique_ptr
from libcpp.vector cimport vector

from libcore cimport *
from libpack cimport *

import numpy as np

include "errors.pxi"
include "addresses.pxi"

TILE_BYTES = kPackTileBytes
"""int: bytes of a segment's wider side (its dtype or the wire's) that one
block of the CUDA kernel moves: each segment gets whole tiles of
``TILE_BYTES // max(itemsize, wire itemsize)`` elements."""

cuda_built = cuda_packing_built()
"""bool: whether this build has the CUDA kernels (nvcc at build time)."""

include "dtypes.pxi"


def device_count():
    """The number of CUDA devices this process sees.

    Returns:
        int: at least 1.

    Raises:
        RuntimeError: with the CUDA runtime's reason when it sees none (no
            driver, no device), or when the package was built without CUDA.
    """
    cdef int count = 0
    CHKSTATUS(cuda_device_count(&count))
    if count == 0:
        raise RuntimeError("the CUDA runtime sees no device")
    return count


cdef DType dtype_code(dt, what) except *:
    """The code of a dtype name or numpy dtype (`what` names it in errors)."""
    try:
        code = DTYPE_CODES.get(dt if isinstance(dt, str) else np.dtype(dt).name)
    except TypeError:
        code = None
    if code is None:
        raise ValueError(
            f"{what}: unknown dtype {dt!r}; expected one of "
            f"{', '.join(DTYPE_CODES)}")
    return <DType><int>code


cdef DType lay_out(segments, wire_dtype, vector[PackSegment]& rows,
                  PackTable* table) except *:
    """Checks `segments` and lays them out in `table`; returns the wire
    dtype's code."""
    cdef PackSegment row
    cdef DType wire = dtype_code(wire_dtype, "wire_dtype")
    rows.clear()
    for i, segment in enumerate(segments):
        what = f"segments[{i}]"
        address, dtype, offset, count = counted(
            segment, what, ("address", "dtype", "offset", "count"))
        row.tensor = <const void*>address_of(address, what)
        row.dtype = dtype_code(dtype, what)
        row.offset = offset
        row.count = count
        rows.push_back(row)
    CHKSTATUS(build_pack_table(rows.data(), rows.size(), wire, table))
    return wire


def layout(segments, wire_dtype):
    """Where each segment lies in its bucket.

    Args:
        segments (list of tuple): ``(address, dtype, offset, count)`` each.
        wire_dtype (str or numpy dtype): the bucket's dtype.

    Returns:
        tuple: the element offset of each segment in the bucket, and the
        bucket's length in elements.
    """
    cdef vector[PackSegment] rows
    cdef PackTable table
    cdef PackSegment row
    cdef size_t k = 0
    lay_out(segments, wire_dtype, rows, &table)
    offsets = []
    for row in rows:
        if k < table.entries.size():
            offsets.append(table.entries[k].bucket_offset)
        else:
            offsets.append(table.count)
        if row.count > 0:
            k += 1
    return offsets, table.count


def pack(segments, bucket, wire_dtype, float scale=1.0):
    """Packs host segments into a host bucket: ``bucket = segments * scale``.

    Args:
        segments (list of tuple): ``(address, dtype, offset, count)`` each.
        bucket (int): address of the bucket, ``layout(...)[1]`` elements of
            ``wire_dtype``.
        wire_dtype (str or numpy dtype): the bucket's dtype.
        scale (float): multiplies every element.
    """
    cdef vector[PackSegment] rows
    cdef PackTable table
    cdef DType wire = lay_out(segments, wire_dtype, rows, &table)
    cdef void* out = <void*>address_of(bucket, "bucket")
    cdef Status status
    with nogil:
        status = pack_host(table, out, wire, scale)
    CHKSTATUS(status)


def unpack(segments, bucket, wire_dtype, float scale=1.0, int divisor=1):
    """Unpacks a host bucket into its segments:
    ``segments = bucket * scale / divisor``.

    Args:
        segments (list of tuple): ``(address, dtype, offset, count)`` each;
            address 0 is left out.
        bucket (int): address of the bucket.
        wire_dtype (str or numpy dtype): the bucket's dtype.
        scale (float): multiplies every element.
        divisor (int): divides every element (1 or more).
    """
    cdef vector[PackSegment] rows
    cdef PackTable table
    cdef DType wire = lay_out(segments, wire_dtype, rows, &table)
    cdef const void* src = <const void*>address_of(bucket, "bucket")
    cdef Status status
    with nogil:
        status = unpack_host(table, src, wire, scale, divisor)
    CHKSTATUS(status)


cdef class CudaPacker:
    """Packs and unpacks buckets on the current CUDA device, one kernel launch
    per bucket, with the semantics of :func:`pack` and :func:`unpack`
    (float32, float16 and bfloat16 only).

    Launches are asynchronous on the given stream. A packer keeps the
    segment tables of its last ``max_tables`` distinct buckets in device
    memory, so the buckets of a training loop are uploaded once (give it at
    least as many as the loop has buckets). One packer's launches run
    in the order they were issued, so use one packer per stream to pack on
    several streams at once. Not for CUDA graph capture. NaN payloads and
    signs may differ from the host's where arithmetic is done (NaN stays
    NaN).

    Args:
        max_tables (int): segment tables kept in device memory.

    Example:

        .. code-block:: python

            import cupy as cp
            from nncomm import packing

            grads = [cp.ones(1000, cp.float32), cp.ones(10, cp.float32)]
            bucket = cp.empty(1010, cp.float16)
            segments = [(g.data.ptr, 'float32', 0, g.size) for g in grads]
            packer = packing.CudaPacker()
            stream = cp.cuda.Stream()
            packer.pack(segments, bucket.data.ptr, 'float16', scale=0.5,
                        stream=stream.ptr)
            stream.synchronize()
    """
    cdef unique_ptr[CppCudaPacker] packer

    def __cinit__(self, size_t max_tables=kDefaultMaxTables):
        cdef Status status
        with nogil:
            status = CppCudaPacker.Create(&self.packer, max_tables)
        CHKSTATUS(status)

    def pack(self, segments, bucket, wire_dtype, float scale=1.0, stream=0,
             event=0, flags=0):
        """Enqueues ``bucket = segments * scale`` on ``stream``.

        Args:
            segments (list of tuple): ``(address, dtype, offset, count)`` each,
                device addresses.
            bucket (int): device address of the bucket.
            wire_dtype (str): the bucket's dtype.
            scale (float): multiplies every element.
            stream (int): a ``cudaStream_t`` (``cupy.cuda.Stream().ptr``);
                0 is the legacy default stream.
            event (int): a ``cudaEvent_t`` the launch waits for; 0 for none.
            flags (int): device address of one uint32 per segment, zero
                before: with it, the segments are checked as they are read
                and flag i becomes 1 where segment i holds a NaN or an
                infinity (``check_finite``); 0 for no check.
        """
        cdef vector[PackSegment] rows
        cdef PackTable table
        cdef DType wire = lay_out(segments, wire_dtype, rows, &table)
        cdef void* out = <void*>address_of(bucket, "bucket")
        cdef CudaStream s = <CudaStream>address_of(stream, "stream")
        cdef CudaEvent e = <CudaEvent>address_of(event, "event")
        cdef unsigned* checked = <unsigned*>address_of(flags, "flags")
        cdef Status status
        with nogil:
            status = self.packer.get().pack(table, out, wire, scale, s, e,
                                            checked)
        CHKSTATUS(status)

    def unpack(self, segments, bucket, wire_dtype, float scale=1.0,
               int divisor=1, stream=0, event=0):
        """Enqueues ``segments = bucket * scale / divisor`` on ``stream``.

        Args:
            segments (list of tuple): ``(address, dtype, offset, count)`` each,
                device addresses; address 0 is left out.
            bucket (int): device address of the bucket.
            wire_dtype (str): the bucket's dtype.
            scale (float): multiplies every element.
            divisor (int): divides every element (1 or more).
            stream (int): a ``cudaStream_t``; 0 is the legacy default stream.
            event (int): a ``cudaEvent_t`` the launch waits for; 0 for none.
        """
        cdef vector[PackSegment] rows
        cdef PackTable table
        cdef DType wire = lay_out(segments, wire_dtype, rows, &table)
        cdef const void* src = <const void*>address_of(bucket, "bucket")
        cdef CudaStream s = <CudaStream>address_of(stream, "stream")
        cdef CudaEvent e = <CudaEvent>address_of(event, "event")
        cdef Status status
        with nogil:
            status = self.packer.get().unpack(table, src, wire, scale,
                                              divisor, s, e)
        CHKSTATUS(status)
