"""PowerSGD's host passes (nncomm._low_rank) in one process, against numpy
in float64: the three passes with error feedback and without, before the
first estimate and after it, for factor ranks 1 to 5 and shapes that are
not multiples of the C++'s 16 lanes; the same passes as array operations
(nncomm.comm_hooks._ArrayPasses, which GPU and 16-bit buckets take) against
the same reference; and arguments of the wrong shape, dtype or layout."""
import numpy as np
import pytest

from nncomm import _low_rank
from nncomm.comm_hooks import _ArrayPasses

F32 = np.float32
SHAPES = [(1, 1), (7, 3), (33, 17), (64, 129), (300, 16)]
PASSES = {"c++": _low_rank, "arrays": _ArrayPasses(np)}


def close(got, want, what):
    scale = max(np.abs(want).max(), 1.0)
    assert np.allclose(got, want, rtol=0, atol=1e-5 * scale), \
        f"{what}: {np.abs(got - want).max()} off (scale {scale})"


def orthonormal(rng, n, r):
    return np.linalg.qr(rng.standard_normal((n, r)))[0].astype(F32)


@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("r", (1, 2, 5))
@pytest.mark.parametrize("error_feedback", (True, False))
@pytest.mark.parametrize("estimated", (True, False))
def test_passes_against_numpy(passes, shape, r, error_feedback, estimated):
    n, m = shape
    r = min(r, n, m)
    rng = np.random.default_rng(n * 1000 + m * 10 + r)
    gradient = rng.standard_normal(shape).astype(F32)
    kept = rng.standard_normal(shape).astype(F32) if error_feedback \
        else None
    p_last, qt_last = (orthonormal(rng, n, r),
                       rng.standard_normal((r, m)).astype(F32)) \
        if estimated and error_feedback else (None, None)
    qt = rng.standard_normal((r, m)).astype(F32)
    scale = 1 / 3
    # The reference, in float64.
    M = gradient.astype(np.float64)
    if kept is not None:
        M = M + kept
        if p_last is not None:
            M = M - scale * (p_last.astype(np.float64) @ qt_last)
    p = np.full((n, r), np.nan, F32)
    PASSES[passes].project(gradient, kept, p_last, qt_last, scale, qt, p)
    close(p, M @ qt.T, "P = M Q")
    if kept is not None:
        close(kept, M, "M kept")
    p = orthonormal(rng, n, r)
    summed = np.full((r, m), np.nan, F32)
    PASSES[passes].back_project(gradient, kept, p, summed)
    close(summed, p.T.astype(np.float64) @ M, "Q^T = P^T M")
    PASSES[passes].expand(gradient, p, summed)
    close(gradient, p.astype(np.float64) @ summed, "gradient = P Q^T")


def test_empty_matrix_is_left_alone():
    gradient = np.zeros((0, 4), F32)
    p = np.zeros((0, 1), F32)
    _low_rank.project(gradient, None, None, None, 1.0,
                      np.ones((1, 4), F32), p)
    _low_rank.back_project(gradient, None, p, np.ones((1, 4), F32))
    _low_rank.expand(gradient, p, np.ones((1, 4), F32))


def test_bad_arguments_raise():
    g = np.zeros((4, 6), F32)
    p = np.zeros((4, 2), F32)
    qt = np.zeros((2, 6), F32)
    with pytest.raises(ValueError, match="kept must be 4 x 6"):
        _low_rank.project(g, np.zeros((6, 4), F32), None, None, 1.0, qt, p)
    with pytest.raises(ValueError, match="p must be 4 x 2, not 4 x 3"):
        _low_rank.project(g, None, None, None, 1.0, qt, np.zeros((4, 3), F32))
    with pytest.raises(ValueError, match="qt_last must be 2 x 6"):
        _low_rank.project(g, g.copy(), p, np.zeros((2, 5), F32), 1.0, qt, p)
    with pytest.raises(ValueError, match="both or neither"):
        _low_rank.project(g, g.copy(), p, None, 1.0, qt, p)
    with pytest.raises(ValueError, match="rank must be at least 1"):
        _low_rank.expand(g, np.zeros((4, 0), F32), np.zeros((0, 6), F32))
    with pytest.raises(ValueError, match="qt must be 2 x 6, not 2 x 5"):
        _low_rank.back_project(g, None, p, np.zeros((2, 5), F32))
    with pytest.raises(ValueError, match="dtype mismatch"):
        _low_rank.expand(g.astype(np.float64), p, qt)
    with pytest.raises(ValueError, match="contiguous"):
        _low_rank.expand(np.zeros((6, 4), F32).T, p, qt)
    with pytest.raises(ValueError, match="gradient, p and qt must be arrays"):
        _low_rank.expand(None, p, qt)
