"""PowerSGD's host passes (nncomm._low_rank) in one process, against numpy
in float64: the three passes with error feedback and without, before the
first estimate and after it, for factor ranks 1 to 5 and shapes that are
not multiples of the C++'s 16 lanes; the same passes as array operations
(nncomm.comm_hooks._ArrayPasses, which GPU and 16-bit buckets take) against
the same reference; arguments of the wrong shape, dtype or layout; and,
through the hook on a bucket faked in one process, which passes a bucket
takes, that a warm start stays finite in float16, and that a hook pickled
and unpickled goes on as the one never stopped (a state loaded on another
rank restarting its error feedback)."""
import pickle

import numpy as np
import pytest

import nncomm.hooks
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
    with pytest.raises(ValueError, match="need kept"):
        _low_rank.project(g, None, p, qt, 1.0, qt, p)
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


class TwoLikeRanks:
    """A host bucket of one n x m gradient whose all_reduce sums two ranks
    holding the same values (doubles them): PowerSGD without MPI."""

    class Gradient:
        def __init__(self, shape):
            self.index, self.start, self.offset = 0, 0, 0
            self.shape = shape
            self.count = int(np.prod(shape))

    index = 0
    size = 2
    rank = 0
    is_last = True
    on_device = False

    def __init__(self, values):
        self.buffer = values.reshape(-1).copy()
        self.gradients = [self.Gradient(values.shape)]

    def all_reduce(self, array, wire_dtype=None):
        array *= 2


@pytest.mark.parametrize("dtype", (np.float16, F32))
def test_warm_start_stays_finite_in_16_bits(dtype):
    # One dominant direction of singular value ~ 3000: a warm start from
    # the summed Q as it was (unscaled) made P = M Q ~ 2 * 3000^2, past
    # float16's 65504, at the second step.
    rng = np.random.default_rng(3)
    u, v = rng.standard_normal(300), rng.standard_normal(300)
    values = (10 * np.outer(u, v) + rng.standard_normal((300, 300)))
    hook = nncomm.hooks.PowerSGD(rank=1, start_iter=0)
    for step in range(4):
        bucket = TwoLikeRanks(values.astype(dtype))
        hook(bucket)
        got = bucket.buffer.reshape(values.shape).astype(np.float64)
        assert np.isfinite(got).all(), f"step {step}: not finite"
    # The rank-1 estimate of the sum: 2 (10 u v^T) within the noise.
    want = 20 * np.outer(u, v)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


@pytest.mark.parametrize("rank, passes", ((8, _low_rank), (9, _ArrayPasses)))
def test_float32_host_buckets_take_cpp_passes_up_to_rank_8(rank, passes):
    rng = np.random.default_rng(4)
    hook = nncomm.hooks.PowerSGD(rank=rank, start_iter=0)
    bucket = TwoLikeRanks(rng.standard_normal((64, 48)).astype(F32))
    hook(bucket)
    (state,) = hook._buckets.values()
    assert state.passes is passes or isinstance(state.passes, passes)
    assert np.isfinite(bucket.buffer).all()


def run_steps(hook, steps, bucket=TwoLikeRanks):
    """Each step's reduced buffer."""
    out = []
    for values in steps:
        b = bucket(values)
        hook(b)
        out.append(b.buffer.copy())
    return out


@pytest.mark.parametrize("dtype", (np.float16, F32))
@pytest.mark.parametrize("error_feedback, warm_start",
                         ((True, True), (True, False), (False, True)))
def test_a_pickled_hook_goes_on_as_one_never_stopped(dtype, error_feedback,
                                                     warm_start):
    rng = np.random.default_rng(5)
    steps = [rng.standard_normal((40, 24)).astype(dtype) for _ in range(6)]

    def hook():
        return nncomm.hooks.PowerSGD(rank=2, start_iter=1, seed=9,
                                     error_feedback=error_feedback,
                                     warm_start=warm_start)

    whole = run_steps(hook(), steps)
    stopped = hook()
    first = run_steps(stopped, steps[:3])
    resumed = pickle.loads(pickle.dumps(stopped))
    assert resumed.iteration == 3 and resumed.state(0) is None
    rest = run_steps(resumed, steps[3:])
    for k, (a, b) in enumerate(zip(whole, first + rest)):
        assert np.array_equal(a, b), f"step {k}"
    # Without its state, the same iteration gives other gradients.
    fresh = hook()
    fresh.iteration = 3
    assert not np.array_equal(run_steps(fresh, steps[3:4])[0], whole[3])
    # Pickled before its first iteration there, a bucket's state is kept.
    twice = pickle.loads(pickle.dumps(pickle.loads(pickle.dumps(stopped))))
    assert np.array_equal(run_steps(twice, steps[3:4])[0], whole[3])


def test_a_state_loaded_on_another_rank_restarts_its_error_feedback():
    rng = np.random.default_rng(6)
    steps = [rng.standard_normal((40, 24)).astype(F32) for _ in range(4)]
    hook = nncomm.hooks.PowerSGD(rank=2, start_iter=0, seed=9)
    run_steps(hook, steps[:3])
    blob = pickle.dumps(hook)

    class OtherRank(TwoLikeRanks):
        rank = 1

    with pytest.warns(RuntimeWarning, match="saved by group rank 0 of 2 "
                      "and loaded on rank 1 of 2"):
        got = run_steps(pickle.loads(blob), steps[3:], OtherRank)
    # What a restart gives: Qs kept, M zero, no estimate to subtract.
    restarted = pickle.loads(blob)
    (key, saved), = restarted._buckets.items()
    restarted._buckets[key] = saved._replace(
        kept=np.zeros_like(saved.kept),
        matrices=[m[:3] + (False,) for m in saved.matrices])
    want = run_steps(restarted, steps[3:])
    assert np.array_equal(got[0], want[0])
    assert not np.array_equal(got[0], run_steps(pickle.loads(blob),
                                                steps[3:])[0])
