"""numpy reference of the quantized gradients (CNTK's 1-bit SGD and its
N-bit variant, include/nncomm/compression/quantize.hpp), written out from the
specification, for tests/test_quantize.py and tests/mpi/quantized.py.

Every sum whose order matters is spelled out: the 1-bit means are
np.cumsum (sequential) in float64 from +0, row by row; min and max are
taken row by row, keeping the first of equal values; everything else is
elementwise float32 arithmetic, as the C++ does it, so results can be
compared bit for bit.
"""
import numpy as np


def matrix(g):
    """`g` (any shape) as the float32 matrix it is quantized as: its first
    dimension's rows, the others' product of columns."""
    rows = g.shape[0] if g.ndim else 1
    cols = int(np.prod(g.shape[1:], dtype=np.int64))
    return np.asarray(g, np.float32).reshape(rows, cols)


def _mean(v, mask):
    """float32 of the float64 mean of each column's `v` where `mask`; 0 for
    a column with none."""
    terms = np.where(mask, v.astype(np.float64), 0.0)
    start = np.zeros((1, v.shape[1]))
    total = np.cumsum(np.vstack([start, terms]), axis=0)[-1]
    count = mask.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
    return np.where(count > 0, mean, 0.0).astype(np.float32)


def column_values(v, bits):
    """Each column's two values: (code-0 mean, code-1 mean) for 1 bit,
    (min, step) for more."""
    rows, cols = v.shape
    if bits == 1:
        return _mean(v, ~(v >= 0)), _mean(v, v >= 0)
    if rows == 0:
        return np.zeros(cols, np.float32), np.zeros(cols, np.float32)
    low, high = v[0].copy(), v[0].copy()
    for r in range(1, rows):
        low = np.where(v[r] < low, v[r], low)
        high = np.where(v[r] > high, v[r], high)
    return low, (high - low) / np.float32(2 ** bits - 1)


def codes_of(v, a, b, bits):
    if bits == 1:
        return (v >= 0).astype(np.uint32)
    top = 2 ** bits - 1
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.floor((v - a) / b + np.float32(0.5))
    code = np.where(q >= top, top, np.where(q >= 0, q, 0))
    return np.where(b == 0, 0, code).astype(np.uint32)


def decoded(code, a, b, bits):
    if bits == 1:
        return np.where(code == 1, b, a)
    return a + code.astype(np.float32) * b


def code_words(code, bits):
    """One column's codes as int32 words: row r's code at bits
    [r * bits, (r + 1) * bits) of the stream, least-significant first."""
    stream = [(int(c) >> i) & 1 for c in code for i in range(bits)]
    stream += [0] * (-len(stream) % 32)
    return [int(sum(bit << i for i, bit in enumerate(stream[k:k + 32])))
            for k in range(0, len(stream), 32)]


def encode(grads, residuals, bits):
    """One rank's block (np.int32) for `grads`, the new residuals (None
    without error feedback) and each gradient's decoded values."""
    words = [0]
    new_residuals, values = [], []
    for k, g in enumerate(grads):
        m = matrix(g)
        v = m if residuals is None else m + matrix(residuals[k])
        a, b = column_values(v, bits)
        code = codes_of(v, a, b, bits)
        d = decoded(code, a, b, bits)
        for c in range(m.shape[1]):
            words += [int(a[c:c + 1].view(np.uint32)[0]),
                      int(b[c:c + 1].view(np.uint32)[0])]
            words += code_words(code[:, c], bits)
        values.append(d.reshape(np.shape(g)))
        new_residuals.append((v - d).reshape(np.shape(g)))
    block = np.array(words, np.uint32).view(np.int32)
    return block, None if residuals is None else new_residuals, values


def decode_sum(values, average):
    """The sum over ranks of each gradient's decoded values (`values[rank]
    [k]`), in rank order in float32; with `average`, divided by the ranks."""
    out = []
    for k in range(len(values[0])):
        total = values[0][k]
        for rank in values[1:]:
            total = total + rank[k]
        out.append(total / np.float32(len(values)) if average else total)
    return out
