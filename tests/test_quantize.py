"""The quantized gradients' kernels (nncomm._quantize, CNTK's 1-bit SGD and
its N-bit variant) in one process, against the numpy reference of
tests/mpi/quantize_reference.py: each rank's block (codes and the columns'
two values), the residuals and the decoded sums, bit for bit, over several
steps with error feedback and without."""
import os
import sys

import numpy as np
import pytest

from nncomm import _quantize

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))
import quantize_reference as ref  # noqa: E402

BITS = (1, 2, 3, 4, 5, 8)
# One row, one column (1-D), a column of one element, odd row counts
# (codes that end part-way through a word), more columns and rows than the
# C++ codes at a time (16 columns by 128 rows), more dimensions, a scalar,
# and no rows.
SHAPES = [(1, 7), (9,), (13, 1), (37, 5), (33, 20), (261, 18), (129,),
          (3, 2, 5), (), (0, 3)]
STEPS = 4


def gradients(shapes, seed):
    """Normal values, with special columns wherever there are columns to
    spare: all equal, all positive, all negative, zeros of both signs."""
    rng = np.random.default_rng(seed)
    grads = []
    for shape in shapes:
        g = rng.standard_normal(shape).astype(np.float32)
        m = ref.matrix(g)
        if m.shape[1] >= 5:
            m[:, 0] = np.float32(0.75)
            m[:, 1] = np.abs(m[:, 1])
            m[:, 2] = -np.abs(m[:, 2])
            m[::2, 3] = np.float32(-0.0)
            m[1::2, 3] = np.float32(0.0)
        grads.append(m.reshape(shape))
    return grads


def table(grads, residuals):
    return [(g.ctypes.data, 0 if r is None else r.ctypes.data,
             *_quantize.matrix(g.shape))
            for g, r in zip(grads, residuals or [None] * len(grads))]


def encode(grads, residuals, bits):
    block = np.full(_quantize.block_words(table(grads, residuals), bits), -1,
                    np.int32)
    _quantize.encode(table(grads, residuals), bits, block.ctypes.data)
    return block


def assert_bits(got, expected, what):
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.shape == expected.shape, what
    same = got.view(np.uint32) == expected.view(np.uint32)
    assert same.all(), (f"{what}: {np.count_nonzero(~same)} of {same.size} "
                        f"differ, first at {np.argwhere(~same)[0].tolist()}: "
                        f"got {got[~same][:3]}, expected {expected[~same][:3]}")


def test_matrix_is_the_first_dimension_by_the_rest():
    assert _quantize.matrix((4, 3, 2)) == (4, 6)
    assert _quantize.matrix((7,)) == (7, 1)
    assert _quantize.matrix(()) == (1, 1)
    assert _quantize.matrix((0, 3)) == (0, 3)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("feedback", (True, False))
def test_blocks_residuals_and_sums_match_the_reference(bits, feedback):
    ranks = 3
    residuals = [[np.zeros(s, np.float32) for s in SHAPES]
                 for _ in range(ranks)] if feedback else [None] * ranks
    expected_residuals = [[r.copy() for r in rs] if feedback else None
                          for rs in residuals]
    for step in range(STEPS):
        blocks, values = [], []
        for rank in range(ranks):
            grads = gradients(SHAPES, 100 * step + rank)
            block = encode(grads, residuals[rank], bits)
            expected, expected_residuals[rank], decoded = ref.encode(
                grads, expected_residuals[rank], bits)
            assert_bits(block, expected, f"step {step} rank {rank} block")
            if feedback:
                for k, (r, e) in enumerate(zip(residuals[rank],
                                               expected_residuals[rank])):
                    assert_bits(r, e, f"step {step} rank {rank} residual {k}")
            blocks.append(block)
            values.append(decoded)
        for average in (False, True):
            out = [np.full(s, np.nan, np.float32) for s in SHAPES]
            everyone = np.concatenate(blocks)
            _quantize.decode_sum(table(out, None), bits,
                                 everyone.ctypes.data, ranks, average)
            for k, (o, e) in enumerate(zip(out,
                                           ref.decode_sum(values, average))):
                assert_bits(o, e, f"step {step} sum {k} average={average}")


def test_error_feedback_carries_what_one_bit_lost():
    # A constant gradient of one column: 1 bit sends the column's mean, so
    # the residual is what each element differs from it, and over steps
    # the decoded values add up to the gradients sent.
    g = np.array([[1.0], [2.0], [4.0], [-1.0]], np.float32)
    residual = np.zeros_like(g)
    sent = np.zeros_like(g)
    for _ in range(50):
        out = g.copy()
        block = encode([out], [residual], 1)
        _quantize.decode_sum(table([out], None), 1, block.ctypes.data, 1)
        sent += out
    assert np.allclose(sent + residual, 50 * g, rtol=1e-5)
    assert np.abs(residual).max() < 8


def test_a_failed_rank_makes_decoding_refuse_and_write_nothing():
    grads = gradients([(5, 3)], 0)
    ok = encode(grads, None, 2)
    failed = ok.copy()
    failed[0] = 1
    out = np.full((5, 3), 7.0, np.float32)
    with pytest.raises(RuntimeError, match=r"ranks 1, 2 \(in group order\) "
                       r"failed"):
        _quantize.decode_sum(table([out], None), 2,
                             np.concatenate([ok, failed, failed]).ctypes.data,
                             3)
    assert (out == 7.0).all()


@pytest.mark.parametrize("bits", (0, 9, -1))
def test_bits_out_of_range_are_refused(bits):
    g = np.ones((2, 2), np.float32)
    block = np.zeros(64, np.int32)
    with pytest.raises(ValueError, match="1 to 8"):
        _quantize.block_words(table([g], None), bits)
    with pytest.raises(ValueError, match="1 to 8"):
        _quantize.encode(table([g], None), bits, block.ctypes.data)
    with pytest.raises(ValueError, match="1 to 8"):
        _quantize.decode_sum(table([g], None), bits, block.ctypes.data, 1)


def test_bad_tensors_and_addresses_are_refused():
    g = np.ones(8, np.float32)
    block = np.zeros(16, np.int32)
    with pytest.raises(ValueError, match="not aligned"):
        _quantize.encode([(g.ctypes.data + 1, 0, 2, 2)], 1, block.ctypes.data)
    with pytest.raises(ValueError, match="null gradient"):
        _quantize.encode([(0, 0, 2, 2)], 1, block.ctypes.data)
    with pytest.raises(ValueError, match="block"):
        _quantize.encode([(g.ctypes.data, 0, 2, 2)], 1, 0)
    with pytest.raises(ValueError, match="tuple"):
        _quantize.encode([(g.ctypes.data, 2, 2)], 1, block.ctypes.data)
    with pytest.raises(ValueError, match="negative"):
        _quantize.block_words([(g.ctypes.data, 0, -2, 2)], 1)
    with pytest.raises(ValueError, match="memory address"):
        _quantize.encode([(-8, 0, 2, 2)], 1, block.ctypes.data)
