"""numpy-only references shared by the nncomm.packing tests (host and GPU):
dtypes and their storage, rounding to float16 / bfloat16, deterministic
random data, bit-for-bit assertions and segment specs.

The references are independent of the implementation: arithmetic is
numpy's, and rounding to float16 / bfloat16 is written out here (round to
nearest, ties to even). bfloat16 arrays are held as np.uint16 bit patterns.
"""
import zlib

import numpy as np
import pytest

FLOATS = ["float32", "float16", "bfloat16", "float64"]
INTS = ["int32", "int64"]
STORAGE = {"float32": np.float32, "float16": np.float16,
           "bfloat16": np.uint16, "float64": np.float64,
           "int32": np.int32, "int64": np.int64}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
SIZES = [1, 3, 7, 1023, 4097]
SCALES = [1.0, 0.5, 3.0, -1.25]
DIVISORS = [1, 2, 3, 7]
GUARD = 5  # elements after a bucket that must stay as they were
# (tensor dtype, wire dtype) pairs that carry every value exactly.
LOSSLESS = [("float32", "float32"), ("float16", "float16"),
            ("bfloat16", "bfloat16"), ("float64", "float64"),
            ("float16", "float32"), ("bfloat16", "float32"),
            ("float32", "float64"), ("float16", "float64"),
            ("bfloat16", "float64")]


# --- rounding ----------------------------------------------------------------

def round_significant(v, bits, emin):
    """float64 `v` rounded (nearest, ties to even) to `bits` significant
    bits, with gradual underflow below 2**(emin - 1) (frexp exponents)."""
    v = np.asarray(v, np.float64)
    _, e = np.frexp(v)
    e = np.maximum(e, emin) - bits
    return np.ldexp(np.rint(np.ldexp(v, -e)), e)


def f32_to_bf16(f):
    """float32 -> bfloat16 bits: round to nearest even on the upper 16 bits;
    NaN -> 0x7FFF."""
    f = np.asarray(f, np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FFF), b)


def bf16_to_f32(b):
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_float(x, dtype):
    """Stored values as numpy floats (exactly): float64 for float64, float32
    for the narrower ones."""
    if dtype == "bfloat16":
        return bf16_to_f32(x)
    if dtype == "float64":
        return np.asarray(x, np.float64)
    return np.asarray(x).astype(np.float32)


def from_float(v, dtype):
    """float32 or float64 values rounded to `dtype` (storage array)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _from_float(v, dtype)


def _from_float(v, dtype):
    if dtype == "float64":
        return v.astype(np.float64)
    if dtype == "float32":
        return v.astype(np.float32)
    if dtype == "float16":
        return round_significant(v, 11, -13).astype(np.float16)
    if dtype == "bfloat16":
        if v.dtype == np.float32:
            return f32_to_bf16(v)
        r = round_significant(v, 8, -125).astype(np.float32)
        return (r.view(np.uint32) >> 16).astype(np.uint16)
    raise AssertionError(dtype)


# --- data --------------------------------------------------------------------

def random_values(n, dtype, rng):
    """`n` values representable in `dtype`: magnitudes from 2**-12 (float16
    subnormals) to about 2**10, about 1% exact zeros; float64 values use
    their full precision."""
    if dtype in INTS:
        info = np.iinfo(STORAGE[dtype])
        return rng.integers(info.min, info.max, n, dtype=STORAGE[dtype],
                            endpoint=True)
    v = rng.standard_normal(n) * np.exp2(rng.integers(-12, 9, n))
    v[rng.random(n) < 0.01] = 0.0
    return from_float(v, dtype)


def rng_for(*key):
    """A generator seeded from a test's parameters (the same every run)."""
    return np.random.default_rng([zlib.crc32(repr(k).encode()) for k in key])


# --- comparison --------------------------------------------------------------

def describe(x, dtype, i):
    if dtype == "bfloat16":
        return f"{float(bf16_to_f32(x[i:i + 1])[0])!r}"
    return f"{x[i]!r}"


def assert_bits(got, want, what, dtype=None):
    """`got` and `want` (numpy arrays) have the same shape, dtype and bits;
    `dtype` ("bfloat16" or None) says how to show a differing element."""
    assert got.shape == want.shape and got.dtype == want.dtype, what
    g = got.view(UINT[got.itemsize])
    w = want.view(UINT[want.itemsize])
    bad = np.flatnonzero(g != w)
    if bad.size:
        i = bad[0]
        pytest.fail(
            f"{what}: {bad.size} of {g.size} elements differ; first at [{i}]"
            f": got {int(g[i]):#x} ({describe(got, dtype, i)}), want "
            f"{int(w[i]):#x} ({describe(want, dtype, i)})")


# --- segment specs -----------------------------------------------------------

def split_specs(tensor, rng, dtype, sizes=SIZES):
    """Segment specs (tensor, dtype, offset, count): one tensor of each size,
    made by `tensor(n, dtype, rng, shift=...)` (addresses at shifts 0..4
    elements); the larger ones cut into pieces at random points, in shuffled
    order, one covered only in its middle. No two segments overlap."""
    specs = []
    for k, n in enumerate(sizes):
        t = tensor(n, dtype, rng, shift=(1, 0, 3, 2, 4)[k % 5])
        if n < 7:
            specs.append((t, dtype, 0, n))
            continue
        if k % 2:  # starts and ends in the middle
            lo, hi = 1 + int(rng.integers(n // 3)), n - 1 - int(
                rng.integers(n // 3))
        else:
            lo, hi = 0, n
        cuts = sorted({lo, hi, *(int(c) for c in rng.integers(lo, hi, 2))})
        pieces = [(t, dtype, a, b - a) for a, b in zip(cuts, cuts[1:])]
        rng.shuffle(pieces)
        specs.extend(pieces)
    rng.shuffle(specs)
    return specs


def many_specs(tensor, rng, n, dtypes, tensors, shifts):
    """`n` segment specs of 0 to 16 elements, in random order, with gaps of
    0 to 2 elements between those of one tensor; from `tensors` tensors,
    tensor k of dtypes[k % len(dtypes)] at shift k % shifts."""
    which = rng.integers(0, tensors, n)
    counts = rng.integers(0, 17, n)
    gaps = rng.integers(0, 3, n)
    cursor = [0] * tensors
    pieces = []
    for k, c, g in zip(which, counts, gaps):
        pieces.append((int(k), cursor[k] + int(g), int(c)))
        cursor[k] += int(g) + int(c)
    pool = [tensor(cursor[k] + 1, dtypes[k % len(dtypes)], rng,
                   shift=k % shifts) for k in range(tensors)]
    return [(pool[k], pool[k].dtype, off, c) for k, off, c in pieces]


def split_across_two_buckets(tensor, rng, dtype):
    """Three tensors of `dtype` cut across two buckets (a piece of each in
    each, one in three pieces), and a fresh tensor like each. Returns the
    two buckets' specs, the same specs in the fresh tensors, and the
    (tensor, fresh tensor) pairs."""
    t = tensor(4097, dtype, rng, shift=1)
    u = tensor(1023, dtype, rng, shift=3)
    v = tensor(7, dtype, rng, shift=2)
    plan = [[(t, 0, 1000), (u, 0, 500), (t, 1000, 1500)],
            [(v, 0, 7), (t, 2500, 1597), (u, 500, 523)]]
    fresh = {id(x): tensor(x.n, dtype, rng, shift=x.shift) for x in (t, u, v)}
    specs = [[(x, dtype, o, c) for x, o, c in b] for b in plan]
    fresh_specs = [[(fresh[id(x)], dtype, o, c) for x, o, c in b]
                   for b in plan]
    return specs, fresh_specs, [(x, fresh[id(x)]) for x in (t, u, v)]
