"""nncomm.packing on host memory, against numpy references: segments of
tensors packed into one contiguous bucket of the wire dtype (scaled and
converted), and unpacked back (scaled, divided and converted).

The references are independent of the implementation: bucket offsets are
prefix sums computed here, arithmetic is numpy's (float32, or float64 where
either side is float64), and rounding to float16 / bfloat16 is written out
in packing_reference (round to nearest, ties to even). Results are
compared bit for bit. bfloat16 arrays are held as np.uint16 bit patterns.
"""
import numpy as np
import pytest

from nncomm import packing
from packing_reference import (DIVISORS, FLOATS, GUARD, INTS, LOSSLESS,
                               SCALES, STORAGE, UINT, assert_bits,
                               bf16_to_f32, f32_to_bf16, from_float,
                               many_specs, random_values, rng_for,
                               round_significant, split_across_two_buckets,
                               split_specs, to_float)


# --- references --------------------------------------------------------------

def convert(x, src, dst, scale=1.0, divisor=1):
    """dst(src value * scale / divisor), computed as the spec says."""
    if src in INTS or dst in INTS:
        assert src == dst and scale == 1 and divisor == 1
        return np.array(x, STORAGE[dst])
    ct = np.float64 if "float64" in (src, dst) else np.float32
    v = to_float(x, src).astype(ct) * ct(scale)
    if divisor != 1:
        v = v / ct(divisor)
    return from_float(v, dst)


def offsets_of(counts):
    return [int(o) for o in np.cumsum([0] + list(counts))[:-1]]


# --- tensors, segments, buckets ----------------------------------------------

class Tensor:
    """`n` elements of `dtype` at element `shift` of a larger random array,
    so its address need not be 16-byte aligned and there is memory on both
    sides of it to watch."""

    def __init__(self, n, dtype, rng, shift=0, pad=3):
        self.n, self.dtype, self.shift = n, dtype, shift
        self.base = random_values(shift + n + pad, dtype, rng)

    @property
    def view(self):
        return self.base[self.shift:self.shift + self.n]

    @property
    def address(self):
        return self.view.ctypes.data


def segments_of(specs):
    """specs: (Tensor or None, dtype, offset, count) -> the API's tuples
    (None is address 0)."""
    return [(0 if t is None else t.address, dt, off, c)
            for t, dt, off, c in specs]


def new_bucket(n, dtype, shift=1):
    """A bucket of `n` elements at element `shift` of an array filled with
    0xA5 bytes, GUARD elements of it after the bucket."""
    base = np.empty(shift + n + GUARD, STORAGE[dtype])
    base.view(np.uint8)[:] = 0xA5
    return base, base[shift:shift + n]


def check_layout(specs, wire):
    counts = [c for *_, c in specs]
    offsets, total = packing.layout(segments_of(specs), wire)
    assert [int(o) for o in offsets] == offsets_of(counts)
    assert int(total) == sum(counts)
    return offsets_of(counts), sum(counts)


def check_pack(specs, wire, scale=1.0, shift=1):
    """Packs `specs` into a fresh bucket; checks its content and that the
    memory around it is untouched. Returns the bucket."""
    offsets, total = check_layout(specs, wire)
    base, bucket = new_bucket(total, wire, shift)
    want = base.copy()
    w = want[shift:shift + total]
    for (t, src, off, c), at in zip(specs, offsets):
        if t is None:
            w[at:at + c] = 0
        else:
            w[at:at + c] = convert(t.view[off:off + c], src, wire, scale)
    sources = {id(t): (t, t.base.copy()) for t, *_ in specs if t is not None}
    packing.pack(segments_of(specs), bucket.ctypes.data, wire, scale=scale)
    assert_bits(base, want, f"pack into {wire} bucket, scale {scale}", wire)
    for t, before in sources.values():
        assert_bits(t.base, before, "pack left its sources alone", t.dtype)
    return bucket


def check_unpack(specs, bucket, wire, scale=1.0, divisor=1):
    """Unpacks `bucket` into `specs` (segments must not overlap); checks
    the destinations, and that nothing else in their arrays changed."""
    offsets, total = check_layout(specs, wire)
    assert bucket.size >= total
    tensors = {id(t): t for t, *_ in specs if t is not None}
    want = {k: t.base.copy() for k, t in tensors.items()}
    for (t, dst, off, c), at in zip(specs, offsets):
        if t is not None:
            start = t.shift + off
            want[id(t)][start:start + c] = convert(
                bucket[at:at + c], wire, dst, scale, divisor)
    before = bucket.copy()
    packing.unpack(segments_of(specs), bucket.ctypes.data, wire,
                   scale=scale, divisor=divisor)
    for k, t in tensors.items():
        assert_bits(t.base, want[k], f"unpack {wire} bucket into {t.dtype}, "
                    f"scale {scale}, divisor {divisor}", t.dtype)
    assert_bits(bucket, before, "unpack left the bucket alone", wire)


# --- the module --------------------------------------------------------------

def test_module_attributes():
    assert isinstance(packing.TILE_BYTES, int) and packing.TILE_BYTES % 16 == 0
    assert isinstance(packing.cuda_built, bool)


def test_cuda_packer_needs_a_build_and_a_device():
    if not packing.cuda_built:
        with pytest.raises(RuntimeError):
            packing.CudaPacker()
        return
    try:
        packing.CudaPacker()
    except RuntimeError:
        pass  # built with nvcc, but no usable device here


@pytest.mark.skipif(not packing.cuda_built, reason="built without CUDA")
def test_cuda_packer_needs_room_for_a_table():
    with pytest.raises(ValueError, match="max_tables must be at least 1"):
        packing.CudaPacker(max_tables=0)


def test_references_agree_with_each_other():
    """The test's own references: the bfloat16 bit trick, rounding in
    float64, and numpy's float16 conversion agree on float32 values."""
    rng = np.random.default_rng(1)
    f = (rng.standard_normal(20000) * np.exp2(rng.integers(-30, 30, 20000))
         ).astype(np.float32)
    # Exact ties at both precisions.
    ties = np.float32(1) + np.exp2(np.arange(-23, -6)).astype(np.float32)
    f = np.concatenate([f, ties, -ties, [0.0, -0.0, 65519, 65520, 2**-25]]
                       ).astype(np.float32)
    bf = f32_to_bf16(f)
    r = round_significant(f.astype(np.float64), 8, -125).astype(np.float32)
    assert np.array_equal(bf, (r.view(np.uint32) >> 16).astype(np.uint16))
    with np.errstate(over="ignore"):  # 65520 rounds to inf, as it should
        assert_bits(from_float(f, "float16"), f.astype(np.float16),
                    "float16")
    assert_bits(bf16_to_f32(f32_to_bf16(bf16_to_f32(bf))), bf16_to_f32(bf),
                "bfloat16 round trip")


# --- every (source, wire) pair -----------------------------------------------

@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("wire", FLOATS)
@pytest.mark.parametrize("src", FLOATS)
def test_pack_converts_and_scales(src, wire, scale):
    specs = split_specs(Tensor, rng_for("pack", src, wire, scale), src)
    check_pack(specs, wire, scale)


@pytest.mark.parametrize("divisor", DIVISORS)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dst", FLOATS)
@pytest.mark.parametrize("wire", FLOATS)
def test_unpack_converts_scales_and_divides(wire, dst, scale, divisor):
    rng = rng_for("unpack", wire, dst, scale, divisor)
    specs = split_specs(Tensor, rng, dst)
    total = sum(c for *_, c in specs)
    _, bucket = new_bucket(total, wire, shift=3)
    bucket[:] = random_values(total, wire, rng)
    check_unpack(specs, bucket, wire, scale, divisor)


@pytest.mark.parametrize("src", FLOATS)
def test_mixed_dtypes_in_one_bucket(src):
    """Segments of all four dtypes in one bucket, each converted on its
    own."""
    rng = rng_for("mixed", src)
    specs = []
    for dt in FLOATS:
        specs += split_specs(Tensor, rng, dt, [3, 1023])
    rng.shuffle(specs)
    wire = src
    check_pack(specs, wire, 0.5)
    total = sum(c for *_, c in specs)
    _, bucket = new_bucket(total, wire)
    bucket[:] = random_values(total, wire, rng)
    check_unpack(specs, bucket, wire, -1.25, 3)


@pytest.mark.parametrize("wire", FLOATS)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63,
                               65, 255, 1023, 1025, 4095, 4097, 65537])
def test_odd_sizes_at_odd_addresses(n, wire):
    rng = rng_for("odd", n, wire)
    for shift in (0, 1, 3):
        src = FLOATS[(n + shift) % 4]
        t = Tensor(n, src, rng, shift=shift)
        check_pack([(t, src, 0, n)], wire, 3.0, shift=(shift + 1) % 4)
        _, bucket = new_bucket(n, wire, shift=(shift + 2) % 4)
        bucket[:] = random_values(n, wire, rng)
        check_unpack([(t, src, 0, n)], bucket, wire, 0.5, 3)


# --- arithmetic and rounding, pinned down ------------------------------------

def pack_values(values, src, wire, scale=1.0):
    x = np.array(values, STORAGE[src])
    bucket = np.empty(len(x), STORAGE[wire])
    packing.pack([(x.ctypes.data, src, 0, len(x))], bucket.ctypes.data, wire,
                 scale=scale)
    return bucket


def unpack_values(values, wire, dst, scale=1.0, divisor=1):
    b = np.array(values, STORAGE[wire])
    out = np.zeros(len(b), STORAGE[dst])
    packing.unpack([(out.ctypes.data, dst, 0, len(b))], b.ctypes.data, wire,
                   scale=scale, divisor=divisor)
    return out


def test_rounding_edges():
    """Round to nearest, ties to even, gradual underflow, overflow to inf;
    float64 is rounded once, straight to the narrow dtype."""
    e = np.exp2
    f32 = [1 + e(-11), 1 + 3 * e(-11), 65519, 65520, e(-24), e(-25),
           3 * e(-26), -0.0]
    assert pack_values(f32, "float32", "float16").view(np.uint16).tolist() \
        == [0x3C00, 0x3C02, 0x7BFF, 0x7C00, 0x0001, 0x0000, 0x0001, 0x8000]
    f32 = [1 + e(-8), 1 + 3 * e(-8), 1 + e(-8) + e(-23), -0.0,
           np.finfo(np.float32).max]
    assert pack_values(f32, "float32", "bfloat16").tolist() == [
        0x3F80, 0x3F82, 0x3F81, 0x8000, 0x7F80]
    # A float64 just above a tie: through float32 it would become the tie
    # and go to even; rounded once it goes up.
    f64 = [1 + e(-11) + e(-40), 1 + e(-11), 1 + e(-11) - e(-40)]
    assert pack_values(f64, "float64", "float16").view(np.uint16).tolist() \
        == [0x3C01, 0x3C00, 0x3C00]
    assert unpack_values(f64, "float64", "float16").view(
        np.uint16).tolist() == [0x3C01, 0x3C00, 0x3C00]
    f64 = [1 + e(-8) + e(-40), 1 + e(-8), 1 + e(-8) - e(-40)]
    assert pack_values(f64, "float64", "bfloat16").tolist() == [
        0x3F81, 0x3F80, 0x3F80]
    assert unpack_values(f64, "float64", "bfloat16").tolist() == [
        0x3F81, 0x3F80, 0x3F80]
    f64 = [1 + e(-24) + e(-50), 1 + e(-24)]
    assert pack_values(f64, "float64", "float32").view(np.uint32).tolist() \
        == [0x3F800001, 0x3F800000]


def test_arithmetic_is_float32_and_divides():
    """Without float64 on either side: float32 multiply, then a float32
    division (not a multiply by the reciprocal, not float64)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal(4096).astype(np.float32)
    f32 = np.float32
    want = (x * f32(-1.25)) / f32(3)
    reciprocal = (x * f32(-1.25)) * (f32(1) / f32(3))
    in_f64 = (x.astype(np.float64) * -1.25 / 3).astype(np.float32)
    # The data tells the three apart, so the check below means something.
    assert np.any(want != reciprocal) and np.any(want != in_f64)
    got = unpack_values(x, "float32", "float32", -1.25, 3)
    assert_bits(got, want, "float32 unpack, scale -1.25, divisor 3")


def test_arithmetic_is_float64_where_a_side_is_float64():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(4096).astype(np.float32)
    wide = x.astype(np.float64) * -1.25
    assert np.any(wide != (x * np.float32(-1.25)).astype(np.float64))
    assert_bits(pack_values(x, "float32", "float64", -1.25), wide,
                "float32 -> float64 pack, scale -1.25")
    y = rng.standard_normal(4096)
    want = (y * 3.0 / 7.0).astype(np.float32)
    assert np.any(want != (y.astype(np.float32) * np.float32(3) /
                           np.float32(7)))
    assert_bits(unpack_values(y, "float64", "float32", 3.0, 7), want,
                "float64 -> float32 unpack, scale 3, divisor 7")


def test_scale_not_representable_in_float32():
    """scale 0.1: the scale is a float32 value (nnabla's scale_grad is a
    float), also where a side is float64 and the arithmetic is float64."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(1024).astype(np.float32)
    scale = float(np.float32(0.1))
    assert_bits(pack_values(x, "float32", "float32", 0.1),
                x * np.float32(0.1), "float32 pack, scale 0.1")
    assert_bits(pack_values(x, "float32", "float64", 0.1),
                x.astype(np.float64) * scale,
                "float32 -> float64 pack, scale 0.1")
    y = rng.standard_normal(1024)
    assert_bits(unpack_values(y, "float64", "float64", 0.1, 3),
                y * scale / 3, "float64 unpack, scale 0.1, divisor 3")


@pytest.mark.parametrize("wire", FLOATS)
@pytest.mark.parametrize("src", FLOATS)
def test_nan_and_inf(src, wire):
    """The one check with non-finite inputs: NaN stays NaN, inf stays inf
    (scaled by a negative, it changes sign)."""
    values = to_float(from_float(np.array([np.nan, -np.nan, np.inf, -np.inf,
                                           1.0]), src), src)
    x = from_float(values, src)
    for scale in (1.0, -0.5):
        got = to_float(pack_values(x, src, wire, scale), wire)
        assert np.isnan(got[:2]).all(), (src, wire, scale, got)
        s = np.sign(scale)
        assert got[2:].tolist() == [s * np.inf, -s * np.inf, scale]
    got = to_float(unpack_values(x, src, wire, -2.0, 3), wire)
    assert np.isnan(got[:2]).all() and got[2] == -np.inf and got[3] == np.inf


# --- splitting, round trips, many segments -----------------------------------

@pytest.mark.parametrize("dtype,wire", LOSSLESS)
def test_tensor_split_across_segments_and_two_buckets(dtype, wire):
    """Three tensors cut across two buckets (a piece of each in each, one
    in three pieces); unpacked into fresh tensors they come back bit for
    bit."""
    specs, fresh_specs, pairs = split_across_two_buckets(
        Tensor, rng_for("split", dtype, wire), dtype)
    buckets = [check_pack(s, wire) for s in specs]
    for s, bucket in zip(fresh_specs, buckets):
        check_unpack(s, bucket, wire)
    for x, fresh in pairs:
        assert_bits(fresh.view, x.view, "round trip", dtype)


@pytest.mark.parametrize("wire", ["float32", "float16"])
@pytest.mark.parametrize("n", [1, 10, 1000, 10000])
def test_many_segments(n, wire):
    """`n` segments of 0 to 16 elements, from eight tensors of all four
    dtypes, in random order; pack, then unpack another bucket."""
    rng = rng_for("many", n, wire)
    specs = many_specs(Tensor, rng, n, FLOATS, tensors=8, shifts=3)
    check_pack(specs, wire, 0.5)
    total = sum(c for *_, c in specs)
    _, bucket = new_bucket(total, wire)
    bucket[:] = random_values(total, wire, rng)
    check_unpack(specs, bucket, wire, 1.0, 3)


# --- address 0, empty segments -----------------------------------------------

@pytest.mark.parametrize("wire", FLOATS)
def test_address_zero(wire):
    """Address 0: pack writes zeros in its place, unpack skips it."""
    rng = rng_for("zero", wire)
    a = Tensor(9, "float32", rng, shift=1)
    b = Tensor(300, "bfloat16", rng, shift=3)
    specs = [(None, "float16", 0, 7), (a, "float32", 2, 5),
             (None, "float32", 4, 1), (b, "bfloat16", 1, 299),
             (None, "float64", 0, 1000), (a, "float32", 7, 2)]
    bucket = check_pack(specs, wire, -1.25)
    assert not bucket[:7].view(UINT[bucket.itemsize]).any()
    bucket[:] = random_values(bucket.size, wire, rng)
    check_unpack(specs, bucket, wire, 0.5, 2)


@pytest.mark.parametrize("wire", FLOATS)
def test_zero_count_segments(wire):
    rng = rng_for("empty", wire)
    a = Tensor(10, "float16", rng, shift=1)
    b = Tensor(5, "float64", rng)
    specs = [(a, "float16", 0, 0), (b, "float64", 1, 3), (a, "float16", 4, 0),
             (None, "float32", 0, 0), (a, "float16", 0, 4),
             (b, "float64", 5, 0), (a, "float16", 10, 0)]
    offsets, total = check_layout(specs, wire)
    assert offsets == [0, 0, 3, 3, 3, 7, 7] and total == 7
    bucket = check_pack(specs, wire, 3.0)
    check_unpack(specs, bucket, wire, 1.0, 7)
    only_empty = [(a, "float16", 3, 0), (None, "bfloat16", 0, 0)]
    check_pack(only_empty, wire)
    check_unpack(only_empty, np.zeros(0, STORAGE[wire]), wire, 2.0, 2)


def test_no_segments():
    offsets, total = packing.layout([], "float32")
    assert list(offsets) == [] and total == 0
    check_pack([], "float16")
    check_unpack([], np.zeros(0, np.float32), "float32")


def test_dtypes_as_numpy_dtypes():
    rng = rng_for("np dtypes")
    t = Tensor(33, "float16", rng, shift=1)
    u = Tensor(17, "float64", rng, shift=1)
    w = np.empty(50, np.float32)
    segs = [(t.address, np.dtype(np.float16), 0, 33),
            (u.address, np.dtype("float64"), 0, 17)]
    offsets, total = packing.layout(segs, np.dtype(np.float32))
    assert list(offsets) == [0, 33] and total == 50
    packing.pack(segs, w.ctypes.data, np.dtype(np.float32), scale=0.5)
    want = np.concatenate([convert(t.view, "float16", "float32", 0.5),
                           convert(u.view, "float64", "float32", 0.5)])
    assert_bits(w, want, "numpy dtypes")


def test_segments_as_a_tuple():
    rng = rng_for("tuple")
    t = Tensor(20, "float32", rng)
    specs = [(t, "float32", 0, 10), (t, "float32", 10, 10)]
    w = np.empty(20, np.float32)
    packing.pack(tuple(segments_of(specs)), w.ctypes.data, "float32")
    assert_bits(w, t.view, "tuple of segments")


# --- integers ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", INTS)
def test_integers_are_copied(dtype):
    """int32/int64 copy exactly (values beyond float precision included)."""
    rng = rng_for("int", dtype)
    specs = split_specs(Tensor, rng, dtype)
    bucket = check_pack(specs, dtype)
    fresh = [(Tensor(t.n, dtype, rng, shift=t.shift), dt, o, c)
             for t, dt, o, c in specs]
    # Unpack into fresh tensors: each spec's tensor is its own here, so
    # pieces of one original tensor land in different fresh ones.
    check_unpack(fresh, bucket, dtype)
    for (t, _, o, c), (f, *_) in zip(specs, fresh):
        assert_bits(f.view[o:o + c], t.view[o:o + c], "integer round trip")


# --- errors ------------------------------------------------------------------

def some_tensor(dtype="float32", n=64):
    return np.zeros(n, STORAGE[dtype])


def both(segments, wire="float32", scale=1.0, divisor=1, n=64):
    """The calls to check: pack and unpack with these arguments."""
    bucket = np.zeros(n, STORAGE.get(wire, np.float64))
    yield lambda: packing.pack(segments, bucket.ctypes.data, wire, scale=scale)
    yield lambda: packing.unpack(segments, bucket.ctypes.data, wire,
                                 scale=scale, divisor=divisor)


@pytest.mark.parametrize("dtype", ["int8", "uint16", "complex64", "float8",
                                   "floot32", np.dtype(np.int16)])
def test_unknown_dtype(dtype):
    x = some_tensor()
    for call in both([(x.ctypes.data, dtype, 0, 4)]):
        with pytest.raises(ValueError, match="(?i)dtype"):
            call()
    for call in both([(x.ctypes.data, "float32", 0, 4)], wire=dtype):
        with pytest.raises(ValueError, match="(?i)dtype"):
            call()


def test_negative_offset_or_count():
    x = some_tensor()
    for seg, word in [((x.ctypes.data, "float32", -1, 4), "offset"),
                      ((x.ctypes.data, "float32", 0, -1), "count"),
                      ((0, "float32", -3, 1), "offset"),
                      ((0, "float16", 0, -2), "count")]:
        segs = [(x.ctypes.data, "float32", 0, 2), seg]
        for call in both(segs):
            with pytest.raises(ValueError, match=f"(?i){word}|negative"):
                call()
    with pytest.raises(ValueError, match="(?i)count|negative"):
        packing.layout([(x.ctypes.data, "float32", 0, -1)], "float32")


@pytest.mark.parametrize("dtype,by", [("float32", 2), ("float32", 1),
                                      ("float16", 1), ("bfloat16", 1),
                                      ("float64", 4), ("float64", 2),
                                      ("int32", 2), ("int64", 4)])
def test_misaligned_segment_address(dtype, by):
    x = some_tensor(dtype)
    for call in both([(x.ctypes.data + by, dtype, 0, 4)],
                     wire=dtype if dtype in INTS else "float32"):
        with pytest.raises(ValueError, match="(?i)align"):
            call()


@pytest.mark.parametrize("wire,by", [("float32", 2), ("float16", 1),
                                     ("bfloat16", 1), ("float64", 4)])
def test_misaligned_bucket_address(wire, by):
    x = some_tensor()
    bucket = np.zeros(64, np.float64)
    segs = [(x.ctypes.data, "float32", 0, 4)]
    with pytest.raises(ValueError, match="(?i)align"):
        packing.pack(segs, bucket.ctypes.data + by, wire)
    with pytest.raises(ValueError, match="(?i)align"):
        packing.unpack(segs, bucket.ctypes.data + by, wire)


def test_null_bucket():
    x = some_tensor()
    segs = [(x.ctypes.data, "float32", 0, 4)]
    for call in (packing.pack, packing.unpack):
        with pytest.raises(ValueError, match="bucket address is 0"):
            call(segs, 0, "float32")
    packing.pack([(x.ctypes.data, "float32", 0, 0)], 0, "float32")  # empty


@pytest.mark.parametrize("divisor", [0, -1, -7])
def test_divisor_below_one(divisor):
    x, bucket = some_tensor(), np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="(?i)divisor"):
        packing.unpack([(x.ctypes.data, "float32", 0, 4)], bucket.ctypes.data,
                       "float32", divisor=divisor)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("scale,divisor", [(2.0, 1), (0.5, 1), (1.0, 2),
                                           (-1.0, 1)])
def test_integers_refuse_scale_or_divisor(dtype, scale, divisor):
    x = some_tensor(dtype)
    segs = [(x.ctypes.data, dtype, 0, 4)]
    b = some_tensor(dtype)
    word = "(?i)scale|divisor|int"
    if divisor == 1:  # pack has no divisor
        with pytest.raises(ValueError, match=word):
            packing.pack(segs, b.ctypes.data, dtype, scale=scale)
    with pytest.raises(ValueError, match=word):
        packing.unpack(segs, b.ctypes.data, dtype, scale=scale,
                       divisor=divisor)


@pytest.mark.parametrize("length", [0, 1, 3, 5])
def test_segment_of_wrong_length(length):
    x = some_tensor()
    seg = (x.ctypes.data, "float32", 0, 4, 0)[:length]
    segs = [(x.ctypes.data, "float32", 0, 2), seg]
    for call in both(segs):
        with pytest.raises(ValueError, match="(?i)segment|tuple|length"):
            call()
    with pytest.raises(ValueError, match="(?i)segment|tuple|length"):
        packing.layout(segs, "float32")
