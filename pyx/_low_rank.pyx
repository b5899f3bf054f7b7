# cython: language_level=3, boundscheck=False, wraparound=False
# distutils: language = c++
"""PowerSGD's three passes over a float32 gradient matrix on the host: the
kernels behind :class:`nncomm.hooks.PowerSGD` for host buckets. What each
pass computes, and why M is kept instead of the residual, is spelled out in
include/nncomm/compression/low_rank.hpp.

Arguments are C-contiguous float32 arrays (numpy's, or views of a
bucket's buffer): the n x m gradient, M kept between iterations (None
without error feedback), the last iteration's P (n x r) and Q^T (r x m; both
None before the first estimate), and the outputs. Each pass releases the
GIL.

Example:

    .. code-block:: python

        import numpy as np
        from nncomm import _low_rank

        g = np.arange(6, dtype=np.float32).reshape(2, 3)
        qt = np.ones((1, 3), np.float32)
        p = np.empty((2, 1), np.float32)
        _low_rank.project(g, None, None, None, 0.0, qt, p)  # p = g q
        p /= np.linalg.norm(p)
        _low_rank.back_project(g, None, p, qt)  # qt = p^T g
        _low_rank.expand(g, p, qt)  # g = p qt: rank 1
"""

from liblowrank cimport *


cdef int matrix(LowRankMatrix* a, float[:, ::1] gradient,
                float[:, ::1] kept, const float[:, ::1] p_last,
                const float[:, ::1] qt_last, const float[:, ::1] p,
                const float[:, ::1] qt) except -1:
    """Fills `a` from `gradient` and the others, checking their shapes
    against it and `qt`'s r; 1 where the matrix is empty (nothing to do),
    0 otherwise."""
    if gradient is None or p is None or qt is None:
        raise ValueError("gradient, p and qt must be arrays, not None")
    a.n = gradient.shape[0]
    a.m = gradient.shape[1]
    a.r = qt.shape[0]
    if a.r < 1:
        raise ValueError(f"the factors' rank must be at least 1, not {a.r}")
    shaped("p", p.shape, a.n, a.r)
    shaped("qt", qt.shape, a.r, a.m)
    a.kept = NULL
    a.p_last = NULL
    a.qt_last = NULL
    if kept is not None:
        shaped("kept", kept.shape, a.n, a.m)
    if (p_last is None) != (qt_last is None):
        raise ValueError("p_last and qt_last go together: both or neither")
    if p_last is not None and kept is None:
        raise ValueError("p_last and qt_last need kept: the last estimate "
                         "is subtracted from the M kept")
    if p_last is not None:
        shaped("p_last", p_last.shape, a.n, a.r)
        shaped("qt_last", qt_last.shape, a.r, a.m)
    if a.n == 0 or a.m == 0:
        return 1
    a.gradient = &gradient[0, 0]
    if kept is not None:
        a.kept = &kept[0, 0]
    if p_last is not None:
        a.p_last = &p_last[0, 0]
        a.qt_last = &qt_last[0, 0]
    return 0


cdef int shaped(what, Py_ssize_t* shape, size_t rows, size_t cols) except -1:
    if <size_t>shape[0] != rows or <size_t>shape[1] != cols:
        raise ValueError(f"{what} must be {rows} x {cols}, not "
                         f"{shape[0]} x {shape[1]}")
    return 0


def project(float[:, ::1] gradient, float[:, ::1] kept,
            const float[:, ::1] p_last, const float[:, ::1] qt_last,
            float estimate_scale, const float[:, ::1] qt, float[:, ::1] p):
    """The first pass: M = gradient + kept - p_last qt_last *
    estimate_scale, written to `kept` (with error feedback: `kept` given;
    without the last factors M = gradient + kept), or M = gradient; then
    p = M Q.

    Args:
        gradient (numpy.ndarray): n x m.
        kept (numpy.ndarray): n x m, or None.
        p_last (numpy.ndarray): n x r, or None.
        qt_last (numpy.ndarray): r x m, or None.
        estimate_scale (float): What the last estimate is scaled by
            (1 / ranks: each rank keeps its M less the mean estimate).
        qt (numpy.ndarray): Q^T, r x m.
        p (numpy.ndarray): n x r, written.
    """
    cdef LowRankMatrix a
    if matrix(&a, gradient, kept, p_last, qt_last, p, qt):
        return
    with nogil:
        low_rank_project(a, estimate_scale, &qt[0, 0], &p[0, 0])


def back_project(float[:, ::1] gradient, float[:, ::1] kept,
                 const float[:, ::1] p, float[:, ::1] qt):
    """The second pass: qt = P^T M (M: `kept`, or `gradient` without
    error feedback).

    Args:
        gradient (numpy.ndarray): n x m.
        kept (numpy.ndarray): n x m, or None.
        p (numpy.ndarray): n x r.
        qt (numpy.ndarray): r x m, written.
    """
    cdef LowRankMatrix a
    if matrix(&a, gradient, kept, None, None, p, qt):
        return
    with nogil:
        low_rank_back_project(a, &p[0, 0], &qt[0, 0])


def expand(float[:, ::1] gradient, const float[:, ::1] p,
           const float[:, ::1] qt):
    """The third pass: gradient = P Q^T.

    Args:
        gradient (numpy.ndarray): n x m, written.
        p (numpy.ndarray): n x r.
        qt (numpy.ndarray): r x m.
    """
    cdef LowRankMatrix a
    if matrix(&a, gradient, None, None, None, p, qt):
        return
    with nogil:
        low_rank_expand(a, &p[0, 0], &qt[0, 0])
